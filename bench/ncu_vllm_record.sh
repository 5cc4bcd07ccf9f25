#!/usr/bin/env bash
# ncu over decode's split kernel on vLLM's per-token-head int8 record (batch 32 x 8K, 32 / 8 heads,
# D 128): the native 16-byte layout and the kv_align 8 reads of the same values,
# caches flushed before each kernel. JIT-compiled through an empty artifacts folder.
#   usage (from bench/): bash ncu_vllm_record.sh OUTFILE
set -uo pipefail
ncu --clock-control none --cache-control all -k regex:split -c 2 \
  --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
  --section MemoryWorkloadAnalysis --section InstructionStats \
  python3 -c "
import tempfile, torch, warnings
warnings.simplefilter('ignore')
from aotc import loader
from aotc.loader.ops import decode as D
from bench_vllm_per_token_head import inline_cache, BS, CTX, D as HD, HEADS
loader.set_artifacts(tempfile.mkdtemp())
gen = torch.Generator('cuda').manual_seed(0)
b = 32; pages = CTX // BS
raw, k, v, ks, vs = inline_cache(b * pages + 1, torch.int8, gen)
table = torch.randperm(b * pages, device='cuda', generator=gen).view(b, pages).to(torch.int32)
lens = torch.full((b,), CTX, dtype=torch.int32, device='cuda')
q = torch.randn(b, HEADS, HD, device='cuda', generator=gen).to(torch.bfloat16)
kc, vc, ksv, vsv = k[..., :HD], v[..., :HD], ks[..., None], vs[..., None]
loader.decode(q, kc.contiguous(), vc.contiguous(), table, lens, k_scale=ksv.contiguous(), v_scale=vsv.contiguous(),
              validate=False)
real = D._kv_align
for align in (8,):
    D._kv_align = lambda *a, align=align: align if real(*a) in (4, 8) else real(*a)
    D._plans.clear()
    loader.decode(q, kc, vc, table, lens, k_scale=ksv, v_scale=vsv, kv_format='int8', validate=False)
torch.cuda.synchronize()
" > "$1" 2>&1
