"""MLA decode beside bench_mla.py (one process a checkout, its rows to --out): the 16-head 32 x 4K,
1 x 32K and 1 x 4K calls with their split and merge kernels timed one by one (torch.profiler, L2
warm), 32-head rows (the h32 tile), and with --sweep `num_splits=` at 16 heads. Rows of its first
run: bench/results/2026-11-27-h100-43f4b3f-mla-double-buffer.jsonl (provider "aot-pass2" and
"aot-S<splits>" there; the file's "aot" rows are bench_mla.py's).

    python bench/mla_double_buffer.py --out rows.jsonl --sweep
"""
import argparse
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--bench", default=here, help="the bench/ folder holding harness.py and bench_mla.py")
ap.add_argument("--out", default=None, help="append result rows (JSON lines) to this file")
ap.add_argument("--sweep", action="store_true")
a = ap.parse_args()
sys.path.insert(0, a.bench)
from harness import Rows, copy_bandwidth, device_time, kernel_times  # noqa: E402
import bench_mla as B  # noqa: E402
from aotc import loader  # noqa: E402
from aotc.loader.ops import mla as M  # noqa: E402
print("aotc from", loader.__file__)
rows = Rows(a.out)
bw = copy_bandwidth()
print(f"copy {bw / 1e9:.0f} GB/s")
rows.add("copy", "d2d", "copy", "2GiB", "GBps", bw / 1e9)


def one(heads, batch, ctx, splits=None, kernels=False):
    q, kv, table, lens = B.problem(batch, heads, ctx)
    out = torch.empty(batch, heads, B.D_V, dtype=q.dtype, device="cuda")

    def fn():
        return loader.mla_decode(q, kv, table, lens, v_head_dim=B.D_V, out=out, num_splits=splits, validate=False)
    M._plans.clear()
    fn()
    (plan,) = M._plans.values()
    t = device_time(fn)
    nbytes = batch * ctx * B.D_QK * 2
    shape = f"B{batch}xH{heads}x{ctx}"
    prov = "aot" if splits is None else f"aot-S{splits}"
    rows.add("mla_decode", "latent-bf16-p64", prov, shape, "us", t * 1e6)
    rows.add("mla_decode", "latent-bf16-p64", prov, shape, "pct_copy", nbytes / t / bw * 100)
    rows.add("mla_decode", "latent-bf16-p64", prov, shape, "splits", plan.split_grid[2])
    msg = f"{shape:>16} {prov:>9} splits {plan.split_grid[2]:4d} {t * 1e6:8.1f} us {nbytes / t / bw * 100:6.1f}% copy"
    if kernels:
        kt = kernel_times(fn)
        for name, s in kt.items():
            short = "split" if "split" in name else ("merge" if "merge" in name else name[:20])
            rows.add("mla_decode", "latent-bf16-p64", prov, shape, f"kernel_us_{short}", s * 1e6)
            msg += f"  {short} {s * 1e6:.1f}"
    print(msg, flush=True)
    del q, kv, table, lens
    torch.cuda.empty_cache()


for shape in ((16, 32, 4096), (16, 1, 32768), (16, 1, 4096)):
    one(*shape, kernels=True)
for shape in ((32, 32, 4096), (32, 32, 32768), (32, 128, 4096)):
    one(*shape)
if a.sweep:
    for batch, ctx, counts in ((32, 4096, (4, 6, 12, 16)), (1, 32768, (128, 192)), (1, 4096, (64, 128))):
        for s in counts:
            one(16, batch, ctx, splits=s)
