"""Launch-config sweep of the decode split kernel: BLOCK_N x num_warps x num_stages per cache
format, through Triton's JIT (so configs that are not built can be timed), next to the copy
bandwidth measured in the same run. Each config's output (split + merge) is checked against the
built default's before it is timed. Used to choose `spec.block_n` and `spec.split_launch`."""
from __future__ import annotations

import argparse
import itertools

import torch

from aotc import loader
from aotc.loader.fallback import jit_function
from bench_decode import make
from harness import Rows, copy_bandwidth, device_time
from launch_overhead import capture_launches

SHAPES = [(32, 4096, 32, 8, 128, 16), (1, 32768, 32, 8, 128, 16)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--formats", default="bf16,int8,int4")
    ap.add_argument("--block-n", default="64,128")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="2,3")
    a = ap.parse_args()
    rows = Rows(a.out)
    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s")
    configs = list(itertools.product(*(map(int, x.split(",")) for x in (a.block_n, a.warps, a.stages))))
    for fmt in a.formats.split(","):
        for batch, ctx, hq, hkv, hd, page in SHAPES:
            args, kw, nbytes = make(fmt, batch, ctx, hq, hkv, hd, page)
            out = torch.empty_like(args[0])
            call = lambda: loader.decode(*args, **kw, out=out, validate=False)  # noqa: E731
            call()
            want = out.float().clone()
            (spec, axes, grid, sargs), (mspec, maxes, mgrid, margs) = capture_launches(call)
            split, merge = jit_function(spec), jit_function(mspec)
            mce = mspec.constexprs(maxes)
            shape = f"b{batch} ctx{ctx} h{hq}/{hkv} d{hd} page{page}"
            for bn, w, st in configs:
                ce = dict(spec.constexprs(axes), BLOCK_N=bn)
                if hd > 128 and bn > 64:
                    continue
                run = lambda: split[grid](*sargs, **ce, num_warps=w, num_stages=st)  # noqa: E731
                try:
                    out.fill_(float("nan"))
                    run()
                    merge[mgrid](*margs, **mce, num_warps=4, num_stages=1)
                    err = ((out.float() - want).norm() / want.norm()).item()
                    t = device_time(run)
                except Exception as e:  # a config that does not compile (shared memory, registers)
                    print(f"{fmt:5s} {shape:28s} BLOCK_N={bn:3d} w{w} s{st}: failed: {str(e)[:120]}")
                    continue
                pct = 100 * nbytes / t / copy_bw
                print(f"{fmt:5s} {shape:28s} BLOCK_N={bn:3d} w{w} s{st}: {t * 1e6:8.1f} us split "
                      f"{nbytes / t / 1e9:6.0f} GB/s {pct:5.1f}% copy  rel.err {err:.1e}")
                rows.add("decode_sweep", f"{fmt} BLOCK_N={bn} w{w} s{st}", "jit_split", shape, "pct_of_copy", pct)
            del args, kw, out
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
