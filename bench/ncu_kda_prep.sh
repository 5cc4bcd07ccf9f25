#!/usr/bin/env bash
# ncu over the KDA precompute (kda_chunk_intra, kda_chunk_inter, kda_chunk_wy) at B 1 x T 8192 (bf16, H 16, HV 32, K = V = 128,
# l2norm in kernel): speed of light, warp stalls, instruction mix, occupancy, and the SASS source
# page (per-instruction executed counts and stall samples) as CSV, caches flushed.
#   usage (from bench/): bash ncu_kda_prep.sh OUTDIR
set -uo pipefail
out=$1
ncu --clock-control none --cache-control all -k regex:kda_chunk_ -c 3 \
  --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
  --section InstructionStats --section SchedulerStats --section SourceCounters \
  --import-source no -o "$out/kda_prep" -f \
  python3 -c "
import torch, warnings
warnings.simplefilter('ignore')
from aotc.loader.ops import gated_delta_prefill as op
from bench_gated_delta_prefill import make
q, k, v, g, beta, state, idx, cu = make([8192], True, 'vmajor')
op.gated_delta_prefill(q, k, v, g, beta, state, idx, cu, qk_l2norm=True, state_layout='vmajor', validate=False)
torch.cuda.synchronize()
" > "$out/ncu_log.txt" 2>&1
ncu -i "$out/kda_prep.ncu-rep" --page details > "$out/ncu_details.txt" 2>&1
ncu -i "$out/kda_prep.ncu-rep" --page source --csv --print-source sass > "$out/ncu_sass.csv" 2>&1
rm -f "$out/kda_prep.ncu-rep"
