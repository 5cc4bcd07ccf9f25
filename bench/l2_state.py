"""How the L2 state left before a timed call changes decode's measured bandwidth.

Triton's do_bench empties the L2 between calls by writing 256 MB of zeros.
That leaves up to the whole L2 (50 MB on an H100) dirty, and the timed call then pays for writing
those lines back to DRAM as its reads evict them: 50 MB beside int4's 134 MB of KV at batch 32 x 4K.
A serving engine's decode step follows kernels that mostly read (weights) and write little.

This times one decode call (and its split kernel alone, and the layout read) after each flush:
  dirty: zero a 256 MB buffer (do_bench's flush), clean: read a 256 MB buffer (sum),
and, with --ncu, runs a few flushed calls for `ncu --cache-control none` to count DRAM bytes
read and written during the decode kernels.
"""
from __future__ import annotations

import argparse

import torch

from aotc import loader
from aotc.loader.dispatch import run_kernel
from bench_decode import make
from harness import L2Flush, Rows, copy_bandwidth, device_time
from launch_overhead import capture_launches
from layout_ceiling import ceiling


CASES = [("bf16", 0), ("int8", 128), ("int8", 64), ("int4", 128), ("int4", 64), ("int4", 8)]
SHAPES = [(32, 4096, 32, 8, 128, 16), (64, 4096, 32, 8, 128, 16), (32, 8192, 32, 8, 128, 64)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--ncu", default=None, help="fmt:group:flush, e.g. int4:128:dirty: a few flushed calls only")
    a = ap.parse_args()
    if a.ncu:
        fmt, group, how = a.ncu.split(":")
        args, kw, _ = make(fmt, 32, 4096, 32, 8, 128, 16, group=int(group) or 64)
        out = torch.empty_like(args[0])
        for _ in range(3):
            L2Flush(how)()
            loader.decode(*args, **kw, out=out, validate=False)
        torch.cuda.synchronize()
        return
    rows = Rows(a.out)
    copy = {how: copy_bandwidth(flush=how) for how in ("dirty", "clean")}
    print(f"copy 2 GiB: dirty flush {copy['dirty'] / 1e9:.0f} GB/s, clean flush {copy['clean'] / 1e9:.0f} GB/s")
    for how, bw in copy.items():
        rows.add("copy", "-", f"torch_copy_{how}", "2GiB", "GBps", bw / 1e9)
    ref = copy["clean"]
    print(f"{'fmt':5s} {'group':>5s} {'shape':>10s} | % of copy:  {'call dirty':>10s} {'call clean':>10s} "
          f"{'split clean':>11s} {'read dirty':>10s} {'read clean':>10s} | merge+gap us")
    for fmt, group in CASES:
        for batch, ctx, hq, hkv, hd, page in SHAPES:
            args, kw, nbytes = make(fmt, batch, ctx, hq, hkv, hd, page, group=group or 64)
            out = torch.empty_like(args[0])
            call = lambda: loader.decode(*args, **kw, out=out, validate=False)  # noqa: E731
            launches = capture_launches(call)
            (spec, axes, grid, largs) = launches[0]
            split_only = lambda: run_kernel(spec, axes, grid, largs)  # noqa: E731
            t = {"call dirty": device_time(call, "dirty"), "call clean": device_time(call, "clean"),
                 "split clean": device_time(split_only, "clean")}
            for how in ("dirty", "clean"):
                c = ceiling(args[1], args[2], kw.get("k_scale"), kw.get("v_scale"), args[3], ctx, grid[2],
                            heads_options=(1,), flush=how)
                t[f"read {how}"] = c[1]
            pct = {k: 100 * nbytes / v / ref for k, v in t.items()}
            shape = f"b{batch} ctx{ctx} h{hq}/{hkv} d{hd} page{page}"
            print(f"{fmt:5s} {group or '-':>5} {f'{batch}x{ctx // 1024}K':>10s} |             "
                  + " ".join(f"{pct[k]:10.1f}" if k != "split clean" else f"{pct[k]:11.1f}" for k in t)
                  + f" | {(t['call clean'] - t['split clean']) * 1e6:6.1f}")
            variant = f"{fmt} group{group}" if group else fmt
            for k, v in t.items():
                rows.add("decode", variant, k.replace(" ", "_"), shape, "pct_of_copy", 100 * nbytes / v / ref)
                rows.add("decode", variant, k.replace(" ", "_"), shape, "us", v * 1e6)
            del args, kw, out, launches, largs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
