"""What the H100 reads when the bytes come as S-byte segments in decode's order, with the most
memory-level parallelism a plain-load kernel can have: one short program per block of segments
(like a copy's grid), no loop, no math but a sum.

Decode reads, for one KV head, each token's slice of the cache: 64 B for int4 at head_dim 128, 128 B
for int8, 256 B for bf16, at a stride of (kv_heads x slice) bytes, pages in random order; the
other heads' programs read the neighbouring slices. This kernel reads the same int4/int8/bf16
cache of batch 32 x 4K (page 16, 8 KV heads; K and V as 64 streams) as segments of 1, 2 or 8
heads' slices in (stream, head group, token) order through a random page table (4 B a page), and,
as the control, the whole cache front to back in the same segment size. % of the copy bandwidth
measured in the same run (a read of N bytes against a copy that reads and writes N/2 each), best
over segments a program and warps."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness import device_time, start


@triton.jit
def segment_kernel(Src, Table, Out, n_rows, ctx, max_pages, W: tl.constexpr, GROUPS: tl.constexpr,
                   PAGE: tl.constexpr, DECODE_ORDER: tl.constexpr, ROWS: tl.constexpr):
    # Src: int16 [segments, W], segment = token slot x GROUPS + head group. One program reads ROWS
    # segments of the read order: decode's (stream, head group, token through the page table
    # Table [streams, max_pages]) or front to back.
    p = tl.program_id(0)
    r = (p * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    m = r < n_rows
    if DECODE_ORDER:
        tok = r % ctx
        g = (r // ctx) % GROUPS
        b = r // (ctx * GROUPS)
        page = tl.load(Table + b * max_pages + tok // PAGE, mask=m, other=0).to(tl.int64)
        seg = (page * PAGE + tok % PAGE) * GROUPS + g
    else:
        seg = r
    x = tl.load(Src + seg[:, None] * W + tl.arange(0, W)[None, :], mask=m[:, None], other=0)
    tl.store(Out + p, tl.sum(tl.sum(x.to(tl.int32), 1), 0))


def main():
    rows, copy_bw = start(__doc__)
    batch, ctx, page, kv_heads = 32, 4096, 16, 8
    for fmt, slice_bytes in (("int4", 64), ("int8", 128), ("bf16", 256)):
        streams = 2 * batch  # K and V of each request
        cache = torch.randint(-30000, 30000, (streams * ctx * kv_heads * slice_bytes // 2,), device="cuda",
                              dtype=torch.int16)
        nbytes = cache.numel() * 2
        table = torch.randperm(streams * ctx // page, device="cuda", dtype=torch.int32).view(streams, ctx // page)
        for heads in (1, 2, 8):
            W = heads * slice_bytes // 2
            src = cache.view(-1, W)
            n_rows = src.shape[0]
            for order in (True, False):
                name = "decode order" if order else "front to back"
                best = None
                for rows_per in (32, 64, 128, 256):
                    for warps in (2, 4, 8):
                        out = torch.empty(triton.cdiv(n_rows, rows_per), device="cuda", dtype=torch.int32)
                        f = lambda: segment_kernel[(out.numel(),)](  # noqa: E731
                            src, table, out, n_rows, ctx, ctx // page, W, kv_heads // heads, page, order, rows_per,
                            num_warps=warps)
                        f()
                        t = device_time(f, rep_ms=100)
                        pct = 100 * nbytes / t / copy_bw
                        rows.add("segment_read", f"{fmt} {heads}head {2 * W} B", name, f"rows{rows_per} warps{warps}",
                                 "pct_of_copy", pct)
                        if best is None or pct > best[0]:
                            best = (pct, rows_per, warps)
                print(f"{fmt:5s} {heads} head(s) {2 * W:5d} B segments, {name:14s}: {best[0]:5.1f}% of copy "
                      f"({best[1]} segments, {best[2]} warps a program)", flush=True)
        del cache, table
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
