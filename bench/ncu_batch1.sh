#!/usr/bin/env bash
# ncu over batch-1 decode (bf16 and int8 1 x 8K) and MLA 16 heads 1 x 4K: the split and merge
# kernels' speed of light, warp stalls and launch statistics, caches flushed before each kernel.
#   usage (from bench/): bash ncu_batch1.sh OUTFILE
set -uo pipefail
ncu --clock-control none --cache-control all -k regex:'(split|merge)' -c 6 \
  --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
  --section MemoryWorkloadAnalysis \
  python3 -c "
import torch, warnings
warnings.simplefilter('ignore')
from aotc import loader
from bench_decode import make
from bench_mla import D_V, problem
for fmt, g in (('bf16', 0), ('int8', 128)):
    args, kw, _ = make(fmt, 1, 8192, 32, 8, 128, 16, group=g or 64)
    loader.decode(*args, **kw, validate=False)
q, kv, table, lens = problem(1, 16, 4096)
loader.mla_decode(q, kv, table, lens, v_head_dim=D_V, validate=False)
torch.cuda.synchronize()
" > "$1" 2>&1
