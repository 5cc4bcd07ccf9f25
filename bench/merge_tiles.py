"""The merge kernel alone at small-batch shapes, through Triton's JIT at several tiles ([splits,
channels] a program, warps, the loop): kernel durations from torch.profiler, the partials warm in
L2 as right after the split kernel, no PDL. For choosing kernels/decode/spec.py's merge tiles.

    python3 merge_tiles.py [--out ROWS]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from aotc.kernels.decode.kernel import decode_merge_kernel
from harness import Rows

# (label, batch, heads, head_dim, splits, active splits) -> configs (BLOCK_S, BLOCK_D, LOOP, warps, stages)
SHAPES = {
    ("decode b1 8K", 1, 32, 128, 64, 64): ((64, 128, 0, 4, 1), (64, 64, 0, 2, 1), (64, 64, 0, 4, 1),
                                           (64, 32, 0, 1, 1), (64, 32, 0, 2, 1)),
    ("decode b1 8K 49", 1, 32, 128, 49, 32): ((64, 128, 0, 4, 1), (64, 64, 0, 2, 1), (64, 32, 0, 1, 1)),
    ("mla b1 4K", 1, 16, 512, 256, 128): ((64, 64, 1, 2, 2), (256, 64, 0, 8, 1), (256, 32, 0, 4, 1),
                                          (256, 64, 0, 4, 1), (256, 128, 0, 8, 1)),
    ("mla b1 32K", 1, 16, 512, 256, 256): ((64, 64, 1, 2, 2), (256, 64, 0, 8, 1), (256, 32, 0, 4, 1),
                                           (256, 64, 0, 4, 1), (256, 128, 0, 8, 1)),
    ("mla b32 4K", 32, 16, 512, 8, 8): ((16, 512, 0, 4, 1), (16, 256, 0, 2, 1), (16, 128, 0, 1, 1),
                                        (16, 128, 0, 2, 1)),
}


def durations(fn, reps=50):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    d = [e.time_range.end - e.time_range.start for e in prof.events()
         if e.device_type == torch.autograd.DeviceType.CUDA and "merge" in e.name]
    return statistics.median(d)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = Rows(a.out)
    for (label, batch, heads, hd, splits, active), configs in SHAPES.items():
        g = torch.Generator("cuda").manual_seed(0)
        part_o = torch.randn(batch, heads, splits, hd, generator=g, device="cuda")
        lse = torch.randn(batch, heads, splits, generator=g, device="cuda") * 3
        lse[..., active:] = float("-inf")
        out = torch.empty(batch, heads, hd, dtype=torch.bfloat16, device="cuda")
        lse_out = torch.empty(batch, heads, device="cuda")
        ref = None
        for bs, bd, loop, warps, stages in configs:
            grid = (batch, heads, -(-hd // bd))

            def run():
                decode_merge_kernel[grid](part_o, lse, lse, out, lse_out, 0, 1, heads, splits, out.stride(0),
                                          out.stride(1), lse_out.stride(0), HEAD_DIM=hd, BLOCK_D=bd, BLOCK_S=bs,
                                          LOOP=loop, PDL=0, num_warps=warps, num_stages=stages)
            us = durations(run)
            if ref is None:
                ref = out.float().clone()
            err = (out.float() - ref).abs().max().item()
            cfg = f"S{bs} D{bd} {'loop' if loop else 'tile'} w{warps} st{stages}"
            print(f"  {label:>16} {cfg:>22}: {us:6.2f} us (max diff to first {err:.1e})", flush=True)
            rows.add("merge", label, "jit", cfg, "kernel_us", us)


if __name__ == "__main__":
    main()
