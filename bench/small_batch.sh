#!/usr/bin/env bash
# Small-batch decode before / after in one run on the GPU machine: builds the four decode kernels
# in this checkout and in BASE (an older checkout, its .commit carried), then, each tree in turn,
# bench/profile_batch1.py, sweep_splits.py --decode --rule-only and bench_mla.py --heads 16, then
# merge_tiles.py (JIT; MERGE_TILES=0: not) and GPU_TESTS (default the three decode files) in this checkout.
#   usage: bash bench/small_batch.sh BASE      (rows and logs under $OUT)
set -uo pipefail
base=$(cd "$1" && pwd); new=$PWD
export PYTHONUNBUFFERED=1
mkdir -p /tmp/py-new /tmp/py-base && ln -sfn "$new" /tmp/py-new/aotc && ln -sfn "$base" /tmp/py-base/aotc
kernels="--kernel decode_split --kernel decode_merge --kernel mla_split --kernel mla_merge"
(cd "$new" && PYTHONPATH=/tmp/py-new python3 -m aotc.aot.cli build --arch sm90 -j 8 --quiet $kernels 2>&1 | tail -1) &
(cd "$base" && PYTHONPATH=/tmp/py-base python3 -m aotc.aot.cli build --arch sm90 -j 8 --quiet $kernels 2>&1 | tail -1) &
wait
for tree in base new; do
  dir=$base; [ $tree = new ] && dir=$new
  (cd "$dir/bench" && export PYTHONPATH=/tmp/py-$tree
   [ $tree = base ] && cp "$new/bench/profile_batch1.py" "$new/bench/bench_mla.py" .
   echo "== $tree $(cat ../.commit 2>/dev/null)"
   python3 profile_batch1.py --out "$OUT/$tree.jsonl" 2>&1 | grep -v kernels:
   python3 sweep_splits.py --decode --rule-only --out "$OUT/$tree.jsonl" 2>&1 | grep rule
   python3 bench_mla.py --heads 16 --out "$OUT/$tree.jsonl" 2>&1 | grep aot | grep -v splits) 2>&1 | tee -a "$OUT/bench.log"
done
[ "${MERGE_TILES:-1}" = 1 ] && (cd bench && PYTHONPATH=/tmp/py-new python3 merge_tiles.py --out "$OUT/new.jsonl" 2>&1 | tee "$OUT/merge_tiles.log")
python3 -c "import xdist" 2>/dev/null && n="-n 3" || n=""
PYTHONPATH=/tmp/py-new timeout ${TEST_S:-240} python3 -m pytest ${GPU_TESTS:-tests/gpu/test_mla.py tests/gpu/test_decode.py tests/gpu/test_decode_api.py} \
  -q -x -p no:cacheprovider $n 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
