"""The gated-delta decode kernel under register caps (Triton's `maxnreg`), JIT, % of the copy
bandwidth of the same run: B 256 x T 1, 256 x 4 and 64 x 1, H 16, HV 32, K = V = 128, bf16 q/k/v,
both pool layouts (fused gate at T = 1). V-major at its 8 x 1-warp tile; K-major at 32 x 4, 8 x 1
and 16 x 2. For BENCHMARKS.md's Tried and not kept, "Gated delta decode": why T = 4 trails fla.

    python3 gated_delta_decode_regcap.py     (from bench/, on the GPU machine)
"""
from __future__ import annotations

import torch

from aotc.kernels.gated_delta import spec as gd_spec
from aotc.kernels.gated_delta.recurrent import gated_delta_decode_kernel
from aotc.loader.ops import gated_delta as gd_op
from bench_gated_delta import decode_inputs
from harness import copy_bandwidth, device_time

H, HV, K, V = 16, 32, 128, 128
TILES = {"vmajor": [(8, 1, r) for r in (0, 64, 72, 80)],  # (BV, num_warps, maxnreg; 0: none)
         "kmajor": [(32, 4, r) for r in (0, 96, 112)] + [(8, 1, r) for r in (0, 64, 72)]
         + [(16, 2, r) for r in (0, 64, 80)]}


def main():
    bw = copy_bandwidth()
    for B, T in ((256, 1), (256, 4), (64, 1)):
        for layout in gd_spec.LAYOUTS:
            for fused in (False, True):
                if fused and T > 1:
                    continue
                args, kw = decode_inputs(B, T, H, HV, K, V, layout, fused)
                out = torch.empty(B, T, HV, V, device="cuda", dtype=torch.bfloat16)
                _axes, _grid, kargs = gd_op.launch_plan(*args, out, **kw)
                nbytes = 2 * B * HV * V * K * 4
                res = []
                for bv, warps, cap in TILES[layout]:
                    grid = gd_spec.grid(B, HV, V, bv)

                    def fn():
                        gated_delta_decode_kernel[grid](*kargs, BK=gd_spec.block_k(K), BV=bv,
                                                        KMAJOR=int(layout == "kmajor"), PER_K=0, num_warps=warps,
                                                        num_stages=1, **({"maxnreg": cap} if cap else {}))
                    res.append(f"BV{bv}w{warps}r{cap} {100 * nbytes / device_time(fn) / bw:5.1f}")
                print(f"B{B} T{T} {layout} {'fused' if fused else 'gdn'}: " + "  ".join(res), flush=True)


if __name__ == "__main__":
    main()
