"""MLA decode's fused merge (mla_spec.FUSED: the split kernel's last program of each request merges)
against split + merge, the same call both ways in one process, at chosen split counts: 16 heads,
bf16 latent cache, page 64 (bench_mla.problem). Device time (CUDA events, L2 emptied before each
call), each kernel's summed time (torch.profiler, L2 warm) and, with --zero, the same calls over
length-0 requests (the fixed part: launches, the length -> page table chain, the merge).

    python bench/mla_fused.py --out rows.jsonl [--shape 32x4096[:4,6,8]] [--splits 4,6,8] [--zero]

A shape's own split counts (after ':') replace --splits for it; 0 is the rule's count. Where a plan
at that count does not fuse (past FUSED_MAX_SPLITS), only its split + merge row is timed.
"""
import argparse
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--bench", default=here, help="the bench/ folder holding harness.py and bench_mla.py")
ap.add_argument("--out", default=None, help="append result rows (JSON lines) to this file")
ap.add_argument("--heads", type=int, default=16)
ap.add_argument("--shape", action="append", default=None,
                help="BATCHxCONTEXT[:SPLITS,...] (repeatable; default 32x4096)")
ap.add_argument("--splits", default="4,6,8", help="split counts, comma-separated (0: the rule's)")
ap.add_argument("--zero", action="store_true", help="also time the calls with every length 0")
ap.add_argument("--tag", default="", help="appended to each row's provider (which tree ran)")
a = ap.parse_args()
sys.path.insert(0, a.bench)
from harness import Rows, copy_bandwidth, device_time, kernel_times  # noqa: E402
import bench_mla as B  # noqa: E402
from aotc import loader  # noqa: E402
from aotc.kernels.decode import mla_spec as S  # noqa: E402
from aotc.loader.ops import mla as M  # noqa: E402

print("aotc from", loader.__file__)
rows = Rows(a.out)
bw = copy_bandwidth()
print(f"copy {bw / 1e9:.0f} GB/s")
rows.add("copy", "d2d", "copy", "2GiB", "GBps", bw / 1e9)


def plan_for(q, kv, table, lens, out, splits, fused):
    """The plan mla_decode makes for this call at `splits` (None: the rule's), fused or split + merge."""
    cap = S.FUSED_MAX_SPLITS
    if not fused:
        S.FUSED_MAX_SPLITS = 0
    try:
        M._plans.clear()
        M._recent.clear()
        loader.mla_decode(q, kv, table, lens, v_head_dim=B.D_V, out=out, num_splits=splits, validate=False)
        (plan,) = M._plans.values()
    finally:
        S.FUSED_MAX_SPLITS = cap
        M._plans.clear()
        M._recent.clear()
    return plan


def short(name):
    return "fused" if "fused" in name else ("split" if "split" in name else ("merge" if "merge" in name else name[:16]))


for shape_text in a.shape or ["32x4096"]:
    dims, _, counts = shape_text.partition(":")
    batch, ctx = (int(x) for x in dims.split("x"))
    q, kv, table, lens = B.problem(batch, a.heads, ctx)
    out = torch.empty(batch, a.heads, B.D_V, dtype=q.dtype, device="cuda")
    zero = torch.zeros_like(lens)
    v = kv[..., :B.D_V]
    nbytes = batch * ctx * B.D_QK * 2
    shape = f"B{batch}xH{a.heads}x{ctx}"
    for s in (int(x) for x in (counts or a.splits).split(",")):
        for fused in (True, False):
            plan = plan_for(q, kv, table, lens, out, s or None, fused)
            if fused and not plan.fused:
                print(f"{shape} splits {plan.split_grid[2]}: not fused (FUSED_MAX_SPLITS {S.FUSED_MAX_SPLITS})")
                continue
            n = plan.split_grid[2]
            prov = f"{'fused' if fused else '2k'}-S{n}{a.tag}"
            for lengths, suffix in ((lens, ""), (zero, "-len0")) if a.zero else ((lens, ""),):
                def fn(plan=plan, lengths=lengths):
                    plan.launch(q, kv, v, None, None, table, None, lengths, None, out)
                t = device_time(fn)
                kt = kernel_times(fn)
                p = prov + suffix
                rows.add("mla_decode", "latent-bf16-p64", p, shape, "us", t * 1e6)
                rows.add("mla_decode", "latent-bf16-p64", p, shape, "pct_copy", nbytes / t / bw * 100)
                rows.add("mla_decode", "latent-bf16-p64", p, shape, "kernel_us", sum(kt.values()) * 1e6)
                msg = f"{shape:>14} {p:>18} {t * 1e6:8.1f} us {nbytes / t / bw * 100:6.1f}% copy  kernels"
                for name, sec in kt.items():
                    rows.add("mla_decode", "latent-bf16-p64", p, shape, f"kernel_us_{short(name)}", sec * 1e6)
                    msg += f" {short(name)} {sec * 1e6:.1f}"
                print(msg, flush=True)
    del q, kv, table, lens
    torch.cuda.empty_cache()
