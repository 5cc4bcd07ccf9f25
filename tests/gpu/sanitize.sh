#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and initcheck over every op at its edge shapes
# (tests/gpu/sanitizer_cases.py), printing each tool's error count. Needs the sm90 artifacts:
#   aotc build --arch sm90 -j 16 --quiet && bash tests/gpu/sanitize.sh [OP ...]
# OP: decode store_kv prefix_prefill gated_delta_decode gated_delta_prefill (default: all in one process per tool).
# TOOLS="memcheck initcheck" runs only those (default: memcheck racecheck initcheck), e.g. one
# tool a call where a call is limited to 10 minutes.
# Logs land in $OUT (default /tmp/aotc-out)/sanitizer-<tool>.log. Exit 1 if any tool reports errors
# or a case fails. Caching off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): every torch.empty is a fresh
# cudaMalloc, so initcheck sees a read of memory nobody wrote instead of a reused block's old bytes.
set -uo pipefail
OUT=${OUT:-/tmp/aotc-out}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}

find_sanitizer() {
  local c
  for c in "${COMPUTE_SANITIZER:-}" "$(command -v compute-sanitizer 2>/dev/null)" \
           /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
           /usr/local/cuda-*/bin/compute-sanitizer /usr/local/cuda-*/compute-sanitizer/compute-sanitizer \
           /opt/nvidia/*/compute-sanitizer /opt/cuda/bin/compute-sanitizer; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  # pip's CUDA packages (nvidia-cuda-sanitizer-api, cuda-toolkit) keep it under site-packages/nvidia
  c=$("$py" - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if p.endswith("site-packages")]
for r in roots:
    for hit in sorted(glob.glob(os.path.join(r, "nvidia", "**", "compute-sanitizer"), recursive=True)):
        if os.path.isfile(hit) and os.access(hit, os.X_OK):
            print(hit); raise SystemExit
PY
)
  [ -n "$c" ] && { echo "$c"; return 0; }
  return 1
}

sanitizer=$(find_sanitizer) || { echo "compute-sanitizer not found (looked at \$COMPUTE_SANITIZER, PATH, /usr/local/cuda*, /opt, pip's nvidia packages)" >&2; exit 2; }
echo "compute-sanitizer: $sanitizer ($("$sanitizer" --version 2>/dev/null | tail -1))"
ops=("${@:-all}")
status=0
printf "%-10s %-20s %8s %s\n" tool op errors cases
for tool in ${TOOLS:-memcheck racecheck initcheck}; do
  for op in "${ops[@]}"; do
    log="$OUT/sanitizer-$tool-$op.log"
    extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check no)
    [ "$tool" = racecheck ] && extra=(--racecheck-report hazard)
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 1500 "$sanitizer" --tool "$tool" ${extra[@]+"${extra[@]}"} --print-limit 50 \
      "$py" "$here/sanitizer_cases.py" --op "$op" >"$log" 2>&1
    rc=$?
    errors=$(grep -Eo "ERROR SUMMARY: [0-9]+" "$log" | tail -1 | grep -Eo "[0-9]+$")
    cases=$(grep -Eo "^ok [0-9]+ cases" "$log" | grep -Eo "[0-9]+")
    printf "%-10s %-20s %8s %s\n" "$tool" "$op" "${errors:-?}" "${cases:-FAILED (exit $rc, see $log)}"
    if [ "${errors:-1}" != 0 ] || [ -z "$cases" ]; then
      status=1
      grep -E "^=========" "$log" | head -30
    fi
  done
done
exit $status
