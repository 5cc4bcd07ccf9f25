"""Decode bandwidth: KV bytes (plus scales) read once over kernel time, for bf16, int8 and int4
caches, next to the device-to-device copy bandwidth measured in the same run; aotc (AOT) and the
same kernels through Triton's JIT side by side. int8/int4 run with one scale a token (group =
head_dim, the kernel's per-token path) and with groups of 64, 32 and 8 channels (the per-group paths);
int8 also with one fp32 scale a KV head and channel ("channel", scale_layout="channel": no layout
ceiling is read for it).
Beside each, the layout's ceiling (layout_ceiling.py): the same bytes read with decode's grid and
no attention math, one KV head a program (decode's grid) and two.

Timing (harness.device_time): CUDA events around each call, the L2 emptied before every call by
reading a 256 MB buffer. The "L2 zeroed" column times the same call after writing that buffer
instead (Triton do_bench's flush), which leaves the L2 dirty and makes the call pay the write-back:
see l2_state.py. The "chained" column times the call right after the flush kernel with no event
between them (harness.chained_time), as decode follows another kernel in a serving step: on sm90
the split kernel is a dependent launch of that kernel (PDL) and is scheduled while it drains."""
from __future__ import annotations

import argparse
import warnings

import torch

from aotc import loader
from harness import Rows, chained_time, copy_bandwidth, device_time
from launch_overhead import capture_launches
from layout_ceiling import ceiling

CHANNEL = -1  # int8 with fp32 scales [kv_heads, head_dim] (scale_layout="channel")
FORMATS = [("bf16", 0), ("int8", 128), ("int8", 64), ("int8", 32), ("int8", 8), ("int8", CHANNEL), ("int4", 128),
           ("int4", 64), ("int4", 32), ("int4", 8)]
SHAPES = [  # (batch, context, q_heads, kv_heads, head_dim, page)
    (32, 4096, 32, 8, 128, 16),
    (64, 4096, 32, 8, 128, 16),
    (32, 8192, 32, 8, 128, 64),
    (1, 32768, 32, 8, 128, 16),
]


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
    a = ap.parse_args()
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


if __name__ == "__main__":
    main()
