"""How the bandwidth of a no-math read of decode's cache layout depends on how many KV heads a
program reads (contiguous bytes a token), tile and pipelining: layout_ceiling.stream_kernel over
int4 / int8 / bf16 caches at head_dim 128, % of the copy bandwidth measured in the same run."""
from __future__ import annotations

import torch

from bench_decode import make
from harness import device_time, start
from layout_ceiling import stream_kernel


def main():
    rows, copy_bw = start(__doc__)
    for fmt, group in (("int4", 128), ("int8", 128), ("int4", 64)):
        for batch, ctx, page, splits in ((32, 4096, 16, 4), (64, 4096, 16, 3)):
            args, kw, nbytes = make(fmt, batch, ctx, 32, 8, 128, page, group=group)
            kc, vc, table = args[1], args[2], args[3]
            k16, v16 = kc.view(torch.int16), vc.view(torch.int16)
            ks16, vs16 = kw["k_scale"].view(torch.int16), kw["v_scale"].view(torch.int16)
            W, G, H = k16.shape[-1], ks16.shape[-1], 8
            for heads in (1, 2, 4, 8):
                res = []
                for block_n in (32, 64, 128):
                    if block_n * heads * W * 2 > 32768:
                        continue
                    for warps in (4, 8):
                        for stages in (1, 3):
                            grid = (H // heads, batch, splits * heads)
                            out = torch.empty(grid[0] * grid[1] * grid[2], device="cuda", dtype=torch.int32)
                            f = lambda: stream_kernel[grid](k16, v16, ks16, vs16, table, out, ctx, table.shape[1],  # noqa: E731
                                                            H, W, G, heads, page, block_n, num_warps=warps,
                                                            num_stages=stages)
                            try:
                                f()
                            except Exception as e:  # noqa: BLE001
                                print("skip", heads, block_n, warps, stages, type(e).__name__)
                                continue
                            p = 100 * nbytes / device_time(f) / copy_bw
                            res.append((p, block_n, warps, stages))
                            rows.add("read_heads", f"{fmt} group{group}", f"heads{heads} n{block_n} w{warps} s{stages}",
                                     f"b{batch} ctx{ctx} page{page} splits{splits}", "pct_of_copy", p)
                res.sort(reverse=True)
                top = "  ".join(f"{p:.1f}(n{n} w{w} s{s})" for p, n, w, s in res[:3])
                print(f"{fmt} g{group} b{batch}x{ctx} heads {heads}: {top}", flush=True)
            del args, kw, kc, vc
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
