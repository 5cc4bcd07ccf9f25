"""Decode bandwidth: KV bytes (plus scales) read once over kernel time, for bf16, int8 and int4
caches, next to the device-to-device copy bandwidth measured in the same run; aotc (AOT) and the
same kernels through Triton's JIT side by side. int8/int4 run with one scale a token (group =
head_dim, the kernel's per-token path) and with groups of 64, 32 and 8 channels (the per-group paths);
int8 also with one fp32 scale a KV head and channel ("channel", scale_layout="channel": no layout
ceiling is read for it).
Beside each, a read ceiling (`ceiling` below): the same bytes read with decode's grid and no
attention math, one KV head a program (decode's grid) and two, so the gap the attention math costs
is measured in the same run (other reads of these bytes go faster: probe_decode_read.py). `--plot PATH` draws the
bandwidth per format beside the copy bandwidth (plot_decode.py, from this run's rows).

Timing (harness.device_time): CUDA events around each call, the L2 emptied before every call by
reading a 256 MB buffer. The "L2 zeroed" column times the same call after writing that buffer
instead (Triton do_bench's flush), which leaves the L2 dirty and makes the call pay the write-back
(measured in session 6, BENCHMARKS.md). The "chained" column times the call right after the flush kernel with no event
between them (harness.chained_time), as decode follows another kernel in a serving step: on sm90
the split kernel is a dependent launch of that kernel (PDL) and is scheduled while it drains."""
from __future__ import annotations

import argparse
import warnings

import torch
import triton
import triton.language as tl

from aotc import loader
from harness import Rows, chained_time, copy_bandwidth, device_time
from launch_overhead import capture_launches

CHANNEL = -1  # int8 with fp32 scales [kv_heads, head_dim] (scale_layout="channel")
FORMATS = [("bf16", 0), ("int8", 128), ("int8", 64), ("int8", 32), ("int8", 8), ("int8", CHANNEL), ("int4", 128),
           ("int4", 64), ("int4", 32), ("int4", 8)]
SHAPES = [  # (batch, context, q_heads, kv_heads, head_dim, page)
    (32, 4096, 32, 8, 128, 16),
    (64, 4096, 32, 8, 128, 16),
    (32, 8192, 32, 8, 128, 64),
    (1, 32768, 32, 8, 128, 16),
]


# The read ceiling on decode's grid: a Triton kernel that reads exactly decode's bytes (K, V and their scales,
# through the page table, 64-256-token tiles, decode's grid: KV heads fastest, batch, splits) and
# only XORs them together; `heads` is how many KV heads a program reads (1: decode's grid; 2 reads
# two neighbouring heads' slices of each token, twice the contiguous bytes). Plain loads (no
# cp.async) with few registers, so many programs an SM keep loads in flight.
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


def make(fmt, batch, ctx, hq, hkv, hd, page, group=64, layout="nhd"):
    """Inputs of one decode call. layout "hnd" allocates the caches (and scales) head-major,
    [pages, kv_heads, page, dim], and passes decode their [pages, page, kv_heads, dim] views."""
    pages = batch * ctx // page
    q = torch.randn(batch, hq, hd, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(pages, device="cuda", dtype=torch.int32).view(batch, ctx // page)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    shape = (lambda *dims: (dims[0], dims[2], dims[1], dims[3])) if layout == "hnd" else (lambda *dims: dims)
    view = (lambda t: t.transpose(1, 2)) if layout == "hnd" else (lambda t: t)
    kw, extra = {}, 0
    if fmt == "bf16":
        kc = view(torch.randn(shape(pages, page, hkv, hd), device="cuda", dtype=torch.bfloat16))
        vc = torch.randn_like(kc)
    else:
        width = hd // 2 if fmt == "int4" else hd
        if fmt == "int4":
            codes = torch.randint(0, 15, shape(pages, page, hkv, hd), device="cuda", dtype=torch.int8)
            kc = view((codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous())
        else:
            kc = view(torch.randint(-127, 128, shape(pages, page, hkv, width), device="cuda", dtype=torch.int8))
        vc = kc.clone()
        if group == CHANNEL:  # one fp32 scale a KV head and channel: read once a program, not a token
            ks = torch.rand(hkv, hd, device="cuda") * 0.02 + 0.01
            vs = ks.clone()
            kw = dict(k_scale=ks, v_scale=vs, kv_format=fmt, scale_layout="channel")
            extra = 2 * ks.numel() * ks.element_size()
            assert vc.stride() == kc.stride()
            return (q, kc, vc, table, lens), kw, 2 * kc.numel() * kc.element_size() + extra
        ks = view((torch.rand(shape(pages, page, hkv, hd // group), device="cuda") * 0.02 + 0.01).to(torch.bfloat16))
        vs = ks.clone()
        kw = dict(k_scale=ks, v_scale=vs, kv_format=fmt)
        extra = 2 * ks.numel() * ks.element_size()
    assert vc.stride() == kc.stride()
    kv_bytes = 2 * kc.numel() * kc.element_size() + extra
    return (q, kc, vc, table, lens), kw, kv_bytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--formats", default="", help="format:group,... (group 0 for bf16, int8:channel for "
                                                  "per-channel scales); default: FORMATS")
    ap.add_argument("--shapes", default="",
                    help="BATCHxCONTEXTxHEAD_DIMxPAGE,... at 32 query / 8 KV heads; default: SHAPES")
    ap.add_argument("--layout", default="nhd", choices=("nhd", "hnd"),
                    help="hnd: caches allocated head-major, passed as [pages, page, kv_heads, dim] views "
                         "(no layout-ceiling read: it assumes the token-major layout)")
    ap.add_argument("--plot", default=None, metavar="PATH",
                    help="save a PNG of decode bandwidth per format beside the copy bandwidth (needs matplotlib "
                         "and --out; skipped with a message without matplotlib)")
    a = ap.parse_args()
    if a.plot and not a.out:
        ap.error("--plot reads the run's rows back: pass --out too")
    formats = [(f, CHANNEL if g == "channel" else int(g)) for f, g in (x.split(":") for x in a.formats.split(","))] \
        if a.formats else FORMATS
    shapes = SHAPES
    if a.shapes:
        shapes = [(b, c, 32, 8, d, p) for b, c, d, p in (map(int, x.split("x")) for x in a.shapes.split(","))]
    rows = Rows(a.out)
    copy_bw = copy_bandwidth()
    rows.add("copy", "-", "torch_copy", "2GiB", "GBps", copy_bw / 1e9)
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write)")
    print(f"{'fmt':5s} {'group':>5s} {'batch':>5s} {'ctx':>6s} {'aot us':>8s} {'aot GB/s':>9s} {'% copy':>7s} "
          f"{'L2 zeroed':>9s} {'chained':>8s} {'jit us':>8s} "
          f"{'jit GB/s':>9s} {'ceil 1h %':>9s} {'ceil 2h %':>9s} {'aot/ceil':>8s}")
    import tempfile

    empty = tempfile.mkdtemp()
    for fmt, group in formats:
        for batch, ctx, hq, hkv, hd, page in shapes:
            args, kw, nbytes = make(fmt, batch, ctx, hq, hkv, hd, page, group=group or 64, layout=a.layout)
            out = torch.empty_like(args[0])
            t_aot = device_time(lambda: loader.decode(*args, **kw, out=out, validate=False))
            t_dirty = device_time(lambda: loader.decode(*args, **kw, out=out, validate=False), flush="dirty")
            t_chained = chained_time(lambda: loader.decode(*args, **kw, out=out, validate=False))
            loader.set_artifacts(empty)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t_jit = device_time(lambda: loader.decode(*args, **kw, out=out, validate=False))
            loader.set_artifacts(None)
            bw_aot, bw_jit = nbytes / t_aot, nbytes / t_jit
            ((_, _, grid, _), _) = capture_launches(lambda: loader.decode(*args, **kw, out=out, validate=False))
            splits = grid[2]  # decode's own split count (it follows the binary's occupancy)
            ceil = {1: float("nan")} if a.layout == "hnd" or group == CHANNEL else \
                ceiling(args[1], args[2], kw.get("k_scale"), kw.get("v_scale"), args[3], ctx, splits)
            pct = {h: 100 * nbytes / t / copy_bw for h, t in ceil.items()}
            shape = f"b{batch} ctx{ctx} h{hq}/{hkv} d{hd} page{page}" + (" head-major" if a.layout == "hnd" else "")
            print(f"{fmt:5s} {'ch' if group == CHANNEL else group or '-':>5} {batch:5d} {ctx:6d} {t_aot * 1e6:8.1f} {bw_aot / 1e9:9.0f} {100 * bw_aot / copy_bw:6.1f}% "
                  f"{100 * nbytes / t_dirty / copy_bw:8.1f}% {100 * nbytes / t_chained / copy_bw:7.1f}% {t_jit * 1e6:8.1f} {bw_jit / 1e9:9.0f} {pct.get(1, float('nan')):8.1f}% {pct.get(2, float('nan')):8.1f}% "
                  f"{ceil[1] / t_aot:8.2f}")
            variant = f"{fmt} channel" if group == CHANNEL else f"{fmt} group{group}" if group else fmt
            rows.add("decode", variant, "aot", shape, "GBps", bw_aot / 1e9)
            rows.add("decode", variant, "aot", shape, "pct_of_copy", 100 * bw_aot / copy_bw)
            rows.add("decode", variant, "aot_l2_zeroed", shape, "pct_of_copy", 100 * nbytes / t_dirty / copy_bw)
            rows.add("decode", variant, "aot_chained", shape, "pct_of_copy", 100 * nbytes / t_chained / copy_bw)
            rows.add("decode", variant, "jit", shape, "GBps", bw_jit / 1e9)
            for h, p in pct.items() if a.layout == "nhd" and group != CHANNEL else ():
                rows.add("decode", variant, f"layout_ceiling_{h}head", shape, "pct_of_copy", p)
            del args, kw, out
            torch.cuda.empty_cache()
    if a.plot:
        from plot_decode import plot

        plot(a.out, a.plot, commit=rows.meta["commit"])


if __name__ == "__main__":
    main()
