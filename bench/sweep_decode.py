"""Launch-config sweep of the decode split kernel: BLOCK_N x num_warps x num_stages x maxnreg per
cache format (and quantization group), through Triton's JIT (so configs that are not built can be
timed), next to the copy bandwidth measured in the same run. Each config's output (split + merge)
is checked against the built default's before it is timed. `--kernels` times other copies of
kernel.py (files) side by side with the shipped one. Used to choose `spec.block_n` and
`spec.split_launch`, and to compare kernel rewrites in one run."""
from __future__ import annotations

import argparse
import importlib.util
import itertools

import torch

from aotc import loader
from aotc.kernels.decode import spec as S
from aotc.loader.fallback import jit_function
from bench_decode import make
from harness import Rows, copy_bandwidth, device_time
from launch_overhead import capture_launches

SHAPES = [(32, 4096, 32, 8, 128, 16), (1, 32768, 32, 8, 128, 16), (64, 4096, 32, 8, 128, 16),
          (32, 8192, 32, 8, 128, 16), (32, 4096, 32, 8, 64, 16), (32, 4096, 32, 8, 256, 16), (32, 4096, 32, 8, 96, 16), (32, 4096, 32, 8, 128, 1),
          (32, 4096, 64, 8, 128, 16), (32, 4096, 32, 32, 128, 16),
          (4, 16384, 32, 8, 128, 16), (8, 8192, 32, 8, 128, 16), (16, 8192, 32, 8, 128, 16), (1, 32768, 32, 8, 64, 16),
          (8, 8192, 32, 8, 64, 16), (16, 8192, 32, 8, 64, 16), (64, 4096, 32, 8, 256, 16), (1, 32768, 32, 8, 256, 16),
          (4, 16384, 32, 8, 256, 16), (8, 8192, 32, 8, 256, 16), (16, 8192, 32, 8, 256, 16)]


CU_LIMIT_MAX_L2_FETCH_GRANULARITY = 5  # CUlimit


def set_l2_fetch_granularity(nbytes: int) -> None:
    """cuCtxSetLimit(CU_LIMIT_MAX_L2_FETCH_GRANULARITY) on torch's context; prints before and after."""
    import ctypes

    from aotc.loader.cuda_driver import driver

    torch.zeros(1, device="cuda")
    d = driver()
    value = ctypes.c_size_t()
    limit = CU_LIMIT_MAX_L2_FETCH_GRANULARITY
    d.check("cuCtxGetLimit", d.cuCtxGetLimit(ctypes.byref(value), limit))
    before = value.value
    d.check("cuCtxSetLimit", d.cuCtxSetLimit(limit, ctypes.c_size_t(nbytes)))
    d.check("cuCtxGetLimit", d.cuCtxGetLimit(ctypes.byref(value), limit))
    print(f"L2 fetch granularity: {before} -> {value.value} bytes")


def load_kernel(path: str):
    """decode_split_kernel of a kernel.py copy at `path` ("" = the shipped one); the copy must read
    its program ids in the shipped grid's order (spec.split_grid)."""
    if not path:
        return None
    mod_spec = importlib.util.spec_from_file_location(f"sweep_kernel_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.decode_split_kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--formats", default="bf16,int8:128,int8:64,int4:128,int4:64",
                    help="format[:group],...; group 'token': one scale a token (group = head_dim)")
    ap.add_argument("--kernels", default="", help="comma-separated kernel.py copies; empty entry = shipped")
    ap.add_argument("--maxnreg", default="0", help="register caps to try; 0 = none")
    ap.add_argument("--shapes", default="0,1", help="indices into SHAPES")
    ap.add_argument("--split-scale", default="1", help="multiples of the op's split count to try (max 64 splits)")
    ap.add_argument("--splits", default="", help="split counts to try in place of --split-scale's multiples")
    ap.add_argument("--block-n", default="64,128")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="2,3")
    ap.add_argument("--l2-fetch", type=int, default=-1,
                    help="set the context's L2 fetch granularity hint (bytes, 0-128) first; -1 leaves it")
    a = ap.parse_args()
    rows = Rows(a.out)
    if a.l2_fetch >= 0:
        set_l2_fetch_granularity(a.l2_fetch)
    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s")
    configs = list(itertools.product(*(map(int, x.split(",")) for x in (a.block_n, a.warps, a.stages, a.maxnreg,
                                                                          a.splits or a.split_scale))))
    kernels = [(path, load_kernel(path)) for path in a.kernels.split(",")]
    for fmt_group in a.formats.split(","):
        fmt, _, group = fmt_group.partition(":")
        for batch, ctx, hq, hkv, hd, page in (SHAPES[int(i)] for i in a.shapes.split(",")):
            quant_group = hd if group == "token" else int(group or 64)
            args, kw, nbytes = make(fmt, batch, ctx, hq, hkv, hd, page, group=quant_group)
            out = torch.empty_like(args[0])
            call = lambda: loader.decode(*args, **kw, out=out, validate=False)  # noqa: E731
            try:
                call()
            except ValueError as e:  # a format/shape pair the op refuses (e.g. a group past 128)
                print(f"{fmt_group:8s} b{batch} ctx{ctx} h{hq}/{hkv} d{hd} page{page}: skipped: {e}")
                continue
            want = out.float().clone()
            (spec, axes, grid, sargs), (mspec, maxes, mgrid, margs) = capture_launches(call)
            merge = jit_function(mspec)
            mce = dict(mspec.compile_constexprs(maxes, 90), BLOCK_S=S.MAX_SPLITS)  # any split count the sweep tries
            shape = f"b{batch} ctx{ctx} h{hq}/{hkv} d{hd} page{page}"
            for (path, kernel), (bn, w, st, nreg, scale) in itertools.product(kernels, configs):
                split = kernel or jit_function(spec)
                if a.splits:
                    splits = scale
                else:
                    splits = min(S.MAX_SPLITS, grid[2] * scale)
                    if scale > 1 and splits == grid[2]:
                        continue
                g = (grid[0], grid[1], splits)
                sa, ma = list(sargs), list(margs)  # workspace for `splits` (PartO, PartLse)
                sa[8] = ma[0] = torch.empty(batch * hq * splits * hd, device="cuda", dtype=torch.float32)
                sa[9] = ma[1] = torch.empty(batch * hq * splits, device="cuda", dtype=torch.float32)
                ma[6] = splits
                ce = dict(spec.compile_constexprs(axes, 90), BLOCK_N=bn)
                if hd > 128 and bn > 64:
                    continue
                opts = dict(num_warps=w, num_stages=st, **({"maxnreg": nreg} if nreg else {}))
                run = lambda: split[g](*sa, **ce, **opts)  # noqa: E731
                try:
                    out.fill_(float("nan"))
                    run()
                    merge[mgrid](*ma, **mce, num_warps=4, num_stages=1)
                    err = ((out.float() - want).norm() / want.norm()).item()
                    t = device_time(run)
                except Exception as e:  # a config that does not compile (shared memory, registers)
                    print(f"{fmt_group:8s} {path or 'shipped':10s} {shape:28s} BLOCK_N={bn:3d} w{w} s{st} r{nreg} x{splits}: "
                          f"failed: {str(e)[:120]}")
                    continue
                pct = 100 * nbytes / t / copy_bw
                name = (path.rsplit("/", 1)[-1] or "shipped") + (f"@l2fetch{a.l2_fetch}" if a.l2_fetch >= 0 else "")
                print(f"{fmt_group:8s} {name:10s} {shape:28s} BLOCK_N={bn:3d} w{w} s{st} r{nreg} x{splits}: {t * 1e6:8.1f} us "
                      f"split {nbytes / t / 1e9:6.0f} GB/s {pct:5.1f}% copy  rel.err {err:.1e}")
                rows.add("decode_sweep", f"{fmt_group} {name} BLOCK_N={bn} w{w} s{st} r{nreg} splits{splits}", "jit_split", shape,
                         "pct_of_copy", pct)
            del args, kw, out
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
