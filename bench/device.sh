#!/usr/bin/env bash
# Everything the GPU machine runs, in one call: install this checkout (no network there), build
# the sm90 artifacts, run the GPU tests, then the benchmarks. Results land under $OUT.
#   usage: [GPU_TESTS="FILES"] bash bench/device.sh [tests|bench|all]   (default all)
#   `all` takes ~11 minutes on an H100, past the lent machine's 10-minute call: run tests, then bench.
#   The device copy has no .git: pass `.commit` (git rev-parse --short HEAD > .commit) in the run's carry.
# $OUT/bench.jsonl gets the build's rows (seconds, variants, binaries, bytes per kernel) and every
# benchmark's; $OUT/decode.png the decode bandwidth plot where matplotlib is installed.
set -uo pipefail
what=${1:-all}
case "$what" in tests|bench|all) ;; *) echo "usage: bash bench/device.sh [tests|bench|all]" >&2; exit 2 ;; esac
OUT=${OUT:-/tmp/aotc-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# bench/harness.py stamps rows with the carried .commit; without one, "unknown" (the device copy's
# own git state, if any, is not this checkout's).
[ -f .commit ] || export AOTC_COMMIT=unknown
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -2
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
start=$(date +%s)
aotc build --arch sm90 -j 16 --quiet 2>&1 | tail -20 | tee "$OUT/build.log"
build_seconds=$(( $(date +%s) - start ))
echo "build_seconds $build_seconds" | tee -a "$OUT/build.log"
aotc list | tee -a "$OUT/build.log"
aotc verify | tail -3 | tee -a "$OUT/build.log"
aotc list --json > "$OUT/list.json"
(cd bench && python3 -c "import harness; harness.record_build('$OUT/bench.jsonl', $build_seconds, 16, '$OUT/list.json')")
if [ "$what" = tests ] || [ "$what" = all ]; then
  # GPU_TESTS: which test files (default all of tests/gpu, which with the build outlasts one 10-minute
  # call: split it, e.g. GPU_TESTS="tests/gpu/test_decode.py" then the rest).
  # PYTEST_M="gpu and not full": the quick tier (README, tests/gpu/conftest.py FULL).
  timeout 420 python3 -m pytest ${GPU_TESTS:-tests/gpu} -q -x -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} \
    ${PYTEST_M:+-m "$PYTEST_M"} 2>&1 \
    | tail -40 | tee "$OUT/gpu_tests.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  cd bench
  python3 launch_overhead.py --out "$OUT/bench.jsonl" 2>&1 | tail -12
  python3 first_call.py --out "$OUT/bench.jsonl" 2>&1 | tail -6
  python3 bench_decode.py --out "$OUT/decode.jsonl" --plot "$OUT/decode.png" 2>&1 | tail -40
  cat "$OUT/decode.jsonl" >> "$OUT/bench.jsonl"
  # head_dim 256, int8 per-group ("group": 2 stages at 168 registers since session 10)
  python3 bench_decode.py --out "$OUT/bench.jsonl" --formats int8:128,int8:64 \
    --shapes 32x4096x256x16,64x4096x256x16,1x32768x256x16 2>&1 | tail -7
  python3 bench_prefix_prefill.py --out "$OUT/bench.jsonl" 2>&1 | tail -30
  # gated delta rule: decode and chunked prefill (fla beside them where a wheel is carried: .whl)
  python3 bench_gated_delta.py --out "$OUT/bench.jsonl" 2>&1 | tail -14
  python3 bench_gated_delta_prefill.py --out "$OUT/bench.jsonl" 2>&1 | tail -8
  cd ..
fi
