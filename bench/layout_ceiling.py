"""The bandwidth a decode cache layout allows before any attention math: a Triton kernel that reads
exactly decode's bytes (K, V and their scales, through the page table, 128-token-ish tiles, the
grid (KV heads fastest, batch, splits)) and only XORs them together. bench_decode.py prints its
best over a few tilings next to decode's own bandwidth, so the gap that the attention math costs
and the gap that the layout costs are measured side by side in one run.

`heads` is how many KV heads a program reads: 1 is decode's grid; 2 reads two neighbouring heads'
slices of each token, twice the contiguous bytes (int4 at head_dim 128: 64 -> 128 B a token).
Plain loads (no cp.async) with few registers, so many programs an SM keep loads in flight.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness import device_time


@triton.jit
def read_tile(K, V, KS, VS, Table, b, g, offs_t, m, cols, max_pages, H: tl.constexpr, W: tl.constexpr,
              G: tl.constexpr, HEADS: tl.constexpr, PAGE: tl.constexpr):
    # Request b's tokens offs_t (mask m) of KV heads [g * HEADS, (g + 1) * HEADS), through the page
    # table: K ^ V words [len(offs_t), HEADS * W], each row XORed with its K and V scales' sum.
    page = tl.load(Table + b * max_pages + offs_t // PAGE, mask=m, other=0).to(tl.int64)
    token = page * PAGE + offs_t % PAGE
    row = token * (H * W) + g * (HEADS * W)
    x = tl.load(K + row[:, None] + cols[None, :], mask=m[:, None], other=0) ^ \
        tl.load(V + row[:, None] + cols[None, :], mask=m[:, None], other=0)
    if G > 0:
        gcols = tl.arange(0, HEADS * G)
        srow = token * (H * G) + g * (HEADS * G)
        s = tl.load(KS + srow[:, None] + gcols[None, :], mask=m[:, None], other=0) ^ \
            tl.load(VS + srow[:, None] + gcols[None, :], mask=m[:, None], other=0)
        x = x ^ tl.sum(s.to(tl.int32), 1).to(tl.int16)[:, None]
    return x


@triton.jit
def stream_kernel(K, V, KS, VS, Table, Out, ctx, max_pages, H: tl.constexpr, W: tl.constexpr, G: tl.constexpr,
                  HEADS: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    # K, V: int16 words [pages, PAGE, H, W]; KS, VS: int16 [pages, PAGE, H, G] (G = 0: no scales).
    pid_h = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    splits = tl.num_programs(2)
    chunk = tl.cdiv(tl.cdiv(ctx, splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, ctx)
    cols = tl.arange(0, HEADS * W)
    acc = tl.zeros([HEADS * W], dtype=tl.int32)
    for t0 in range(lo, hi, BLOCK_N):
        offs_t = t0 + tl.arange(0, BLOCK_N)
        m = offs_t < hi
        acc += tl.sum(read_tile(K, V, KS, VS, Table, b, pid_h, offs_t, m, cols, max_pages, H, W, G, HEADS,
                                PAGE).to(tl.int32), 0)
    tl.store(Out + (b * tl.num_programs(0) + pid_h) * splits + split, tl.sum(acc, 0))


def as_words(k_cache, v_cache, k_scale, v_scale):
    """The caches and scales as int16 words, with the words a token's row holds of each (W, G: 0
    and the caches in the scales' place when there are no scales)."""
    k16, v16 = k_cache.view(torch.int16), v_cache.view(torch.int16)
    if k_scale is None:
        return k16, v16, k16, v16, k16.shape[-1], 0
    ks16, vs16 = k_scale.contiguous().view(torch.int16), v_scale.contiguous().view(torch.int16)
    return k16, v16, ks16, vs16, k16.shape[-1], ks16.shape[-1]


def ceiling(k_cache, v_cache, k_scale, v_scale, table, ctx: int, splits: int, heads_options=(1, 2), flush: str = "clean") -> dict:
    """Best seconds over tilings of one full read, for each `heads` (a dict heads -> seconds).
    Caches [pages, page, kv_heads, bytes] of any dtype (read as int16 words); scales None or
    [pages, page, kv_heads, groups] of a 2-byte dtype (fp32 scales are read as two words each)."""
    page, kv_heads = k_cache.shape[1:3]
    k16, v16, ks16, vs16, W, G = as_words(k_cache, v_cache, k_scale, v_scale)
    batch, max_pages = table.shape
    best = {}
    for heads in heads_options:
        if kv_heads % heads or (heads * W) & (heads * W - 1) or (G and (heads * G) & (heads * G - 1)):
            continue
        grid = (kv_heads // heads, batch, splits * heads)
        out = torch.empty(grid[0] * grid[1] * grid[2], device=k_cache.device, dtype=torch.int32)
        for block_n in (64, 128, 256):
            if block_n * heads * W * 2 > 32768:
                continue
            f = lambda: stream_kernel[grid](k16, v16, ks16, vs16, table, out, ctx, max_pages,  # noqa: E731
                                            kv_heads, W, G, heads, page, block_n, num_warps=4, num_stages=2)
            f()
            t = device_time(f, flush=flush)
            best[heads] = min(best.get(heads, t), t)
    return best
