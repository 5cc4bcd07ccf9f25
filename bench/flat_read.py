"""Is the int4/int8 cache layout's read ceiling a property of the bytes or of decode's grid?

layout_ceiling.py reads decode's bytes on decode's grid (KV head x batch x splits, one contiguous
token range a program), and at batch 32 x 4K it tops out near 75% of copy for int4 while a copy of
the same byte count reaches ~100% (size_ceiling.py). This reads the same bytes with a fixed grid
of `k` programs an SM, each walking one contiguous range of the flattened (request, head group,
tile) sequence, so a program streams across request and head boundaries without draining and
refilling its pipeline (it stores a partial at each item's last tile, as a flattened decode
would). `heads` KV heads a program: 1 and 2 as layout_ceiling.py, and all of them (a page's whole
slice of the cache, 8 KB contiguous for int4 at head_dim 128, page 16).

Prints, per format and shape, % of the copy bandwidth measured in the same run: decode's grid read
(layout_ceiling.ceiling at decode's split count), then the best flat read per `heads` with its
configuration."""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from bench_decode import make
from harness import Rows, copy_bandwidth, device_time
from launch_overhead import capture_launches
from layout_ceiling import as_words, ceiling, read_tile

from aotc import loader


@triton.jit
def flat_kernel(K, V, KS, VS, Table, Out, ctx, max_pages, total, H: tl.constexpr, W: tl.constexpr,
                G: tl.constexpr, HEADS: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    # K, V: int16 words [pages, PAGE, H, W]; KS, VS: int16 [pages, PAGE, H, G] (G = 0: no scales).
    p = tl.program_id(0)
    n = tl.num_programs(0)
    groups = H // HEADS
    per_item = tl.cdiv(ctx, BLOCK_N)
    start = (p * total) // n
    end = ((p + 1) * total) // n
    cols = tl.arange(0, HEADS * W)
    acc = tl.zeros([HEADS * W], dtype=tl.int32)
    for t in range(start, end):
        item = t // per_item
        j = t - item * per_item
        b = item // groups
        g = item - b * groups
        offs_t = j * BLOCK_N + tl.arange(0, BLOCK_N)
        m = offs_t < ctx
        acc += tl.sum(read_tile(K, V, KS, VS, Table, b, g, offs_t, m, cols, max_pages, H, W, G, HEADS,
                                PAGE).to(tl.int32), 0)
        if j == per_item - 1:
            tl.store(Out + p, tl.sum(acc, 0))
            acc = tl.zeros([HEADS * W], dtype=tl.int32)
    tl.store(Out + n + p, tl.sum(acc, 0))


def flat(k_cache, v_cache, k_scale, v_scale, table, ctx, heads, per_sm, block_n, stages, warps):
    page, kv_heads = k_cache.shape[1:3]
    k16, v16, ks16, vs16, W, G = as_words(k_cache, v_cache, k_scale, v_scale)
    batch, max_pages = table.shape
    total = batch * (kv_heads // heads) * triton.cdiv(ctx, block_n)
    n = torch.cuda.get_device_properties(0).multi_processor_count * per_sm
    out = torch.empty(2 * n, device=k_cache.device, dtype=torch.int32)
    f = lambda: flat_kernel[(n,)](k16, v16, ks16, vs16, table, out, ctx, max_pages, total,  # noqa: E731
                                  kv_heads, W, G, heads, page, block_n, num_warps=warps, num_stages=stages)
    f()
    return device_time(f, rep_ms=100)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--formats", default="int4:128,int8:128")
    ap.add_argument("--shapes", default="32x4096x128x16,32x8192x128x64,1x32768x128x16")
    a = ap.parse_args()
    formats = [(f, int(g)) for f, g in (x.split(":") for x in a.formats.split(","))]
    shapes = [tuple(map(int, x.split("x"))) for x in a.shapes.split(",")]
    rows = Rows(a.out)
    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s")
    for fmt, group in formats:
        for batch, ctx, hd, page in shapes:
            args, kw, nbytes = make(fmt, batch, ctx, 32, 8, hd, page, group=group or 64)
            out = torch.empty_like(args[0])
            t_dec = device_time(lambda: loader.decode(*args, **kw, out=out, validate=False))
            ((_, _, grid, _), _) = capture_launches(lambda: loader.decode(*args, **kw, out=out, validate=False))
            ceil = ceiling(args[1], args[2], kw.get("k_scale"), kw.get("v_scale"), args[3], ctx, grid[2], (1,))
            shape = f"b{batch} ctx{ctx} d{hd} page{page}"
            variant = f"{fmt} group{group}" if group else fmt
            pct = lambda t: 100 * nbytes / t / copy_bw  # noqa: E731
            line = f"{variant:12s} {shape:24s} decode {pct(t_dec):5.1f}  grid read {pct(ceil[1]):5.1f}"
            rows.add("flat_read", variant, "decode", shape, "pct_of_copy", pct(t_dec))
            rows.add("flat_read", variant, "grid_read_1head", shape, "pct_of_copy", pct(ceil[1]))
            for heads in (1, 2, 8):
                best = None
                W = args[1].view(torch.int16).shape[-1]
                for block_n in (32, 64, 128):
                    if block_n * heads * W * 2 > 32768:
                        continue
                    for per_sm in (2, 4, 8, 16):
                        for stages in (2,):  # plain loads: Triton 3.6 does not pipeline this loop
                            t = flat(args[1], args[2], kw.get("k_scale"), kw.get("v_scale"), args[3], ctx,
                                     heads, per_sm, block_n, stages, 4)
                            rows.add("flat_read", variant, f"flat_{heads}head_n{block_n}_k{per_sm}_s{stages}", shape,
                                     "pct_of_copy", pct(t))
                            if best is None or t < best[0]:
                                best = (t, block_n, per_sm, stages)
                line += f"  flat {heads}h {pct(best[0]):5.1f} (n{best[1]} k{best[2]} s{best[3]})"
            print(line, flush=True)
            del args, kw, out
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
