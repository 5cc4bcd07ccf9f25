"""Host time per launch: loader.decode and DecodePlan.run vs the same kernels through Triton's
JIT vs a bare prepacked ctypes cuLaunchKernel, measured side by side in one run.

Small shapes, so the GPU finishes each kernel faster than the host can issue the next: the
loop measures the host. Run after `aotc build --arch sm90 --kernel decode_split --kernel decode_merge`.
"""
from __future__ import annotations

import argparse

import torch

from aotc import loader
from aotc.loader import cuda_driver, dispatch
from aotc.kernels.decode import spec as S
from aotc.loader.fallback import jit_function

from harness import Rows, host_time_per_call


def capture_launches(call):
    """The (spec, axes, grid, args) of every kernel launch one op call makes (through run_kernel:
    prepared launches are switched off, and the op's plans forgotten, while it runs)."""
    import aotc.loader.ops.decode as decode_module

    seen = []
    real, real_prepare = decode_module.run_kernel, decode_module.prepare

    def spy(spec, axes, grid, args):
        seen.append((spec, dict(axes), tuple(grid), list(args)))
        return real(spec, axes, grid, args)

    decode_module.run_kernel, decode_module.prepare = spy, (lambda *a, **k: None)
    decode_module._plans.clear()
    try:
        call()
    finally:
        decode_module.run_kernel, decode_module.prepare = real, real_prepare
        decode_module._plans.clear()
    return seen


def decode_inputs(batch=1, q_heads=32, kv_heads=8, head_dim=128, page=16, seq=256, dtype=torch.bfloat16):
    pages_per_seq = seq // page
    num_pages = batch * pages_per_seq
    q = torch.randn(batch, q_heads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(num_pages, page, kv_heads, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    table = torch.randperm(num_pages, device="cuda", dtype=torch.int32).view(batch, pages_per_seq)
    lens = torch.full((batch,), seq, device="cuda", dtype=torch.int32)
    return q, k, v, table, lens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--iters", type=int, default=2000)
    a = ap.parse_args()
    rows = Rows(a.out)
    q, k, v, table, lens = decode_inputs()
    out = torch.empty_like(q)
    call = lambda: loader.decode(q, k, v, table, lens, out=out, validate=False)  # noqa: E731
    call()
    torch.cuda.synchronize()
    launches = capture_launches(call)
    n = len(launches)
    sels = [dispatch._selections[(spec.name, tuple(axes.items()), 0)] for spec, axes, _, _ in launches]
    for sel in sels:
        assert sel.loaded, f"{sel.spec.name} ran through the JIT: build the decode artifacts first"
    # The bare baseline replays each binary with the arguments the loader packed last time.
    bare = [(next(iter(s.loaded.values())), grid) for s, (_, _, grid, _) in zip(sels, launches)]
    drv = cuda_driver.driver()
    cu = drv.cuLaunchKernel
    stream = torch._C._cuda_getCurrentRawStream(0)
    packed = [(l.function, g[0], g[1], g[2], l.block, l.shared, l.pointers) for l, g in bare]

    def bare_launches():
        for f, gx, gy, gz, bx, sh, p in packed:
            cu(f, gx, gy, gz, bx, 1, 1, sh, stream, p, None)

    def loader_launch_layer():
        for (spec, axes, grid, args), sel in zip(launches, sels):
            sel.launch(grid, args, torch._C._cuda_getCurrentRawStream(0))

    import aotc.loader.ops.decode as decode_module

    call()
    (plan,) = decode_module._plans.values()
    assert plan.fast_split is not None, "decode did not take the prepared path"
    prepared = [(plan.fast_split, tuple(a.data_ptr() if hasattr(a, "data_ptr") else a
                                        for a in launches[0][3][:S.SPLIT.leading_ptrs])),
                (plan.fast_merge, tuple(a.data_ptr() for a in launches[1][3][:S.MERGE.leading_ptrs]))]

    def prepared_launches():
        stream = torch._C._cuda_getCurrentRawStream(0)
        for prep, pointers in prepared:
            prep(pointers, stream)

    def run_kernel_path():
        for spec, axes, grid, args in launches:
            dispatch.run_kernel(spec, axes, grid, args)

    jit = []
    for spec, axes, grid, args in launches:
        cfg = spec.launch(axes, 90)
        jit.append((jit_function(spec), grid, args, dict(spec.compile_constexprs(axes, 90), **cfg.triton_options())))

    def triton_jit():
        for fn, grid, args, kw in jit:
            fn[grid](*args, **kw)

    triton_jit()
    # DecodePlan: planned once (a decode step), run per layer with pointers only. Its bare
    # counterpart replays the same two launches through the driver call it makes (cuLaunchKernelEx
    # with the plan's config where the binary is a dependent launch, on sm90), arguments as packed.
    dplan = loader.DecodePlan(table, lens, q=q, k_cache=k, v_cache=v, out=out)
    plan_run = lambda: dplan.run(q, k, v, out)  # noqa: E731
    plan_run()
    assert dplan._fast is not None, "DecodePlan did not take the prepared path"
    import ctypes

    plan_bare = []
    for launch, ptr in zip(dplan._fast[:2], ((q.data_ptr() | k.data_ptr() | v.data_ptr()), out.data_ptr())):
        prep = launch.prep
        la = prep.sel.l_aligned if prep.use_aligned and not ptr & 15 else prep.sel.l_generic
        if la.needs_ex:
            config = prep.ex_configs[la][0]
            plan_bare.append((True, drv.cuLaunchKernelEx, (ctypes.byref(config), la.function, prep.pointers, None)))
        else:
            plan_bare.append((False, cu, (la.function, *prep.grid, la.block, 1, 1, la.shared, stream,
                                          prep.pointers, None)))

    def bare_plan_launches():
        for _, fn, args in plan_bare:
            fn(*args)

    torch.cuda.synchronize()
    results = {}
    validated = lambda: loader.decode(q, k, v, table, lens, out=out)  # noqa: E731  (reads lengths back: syncs)
    for name, fn in (("bare_cuLaunchKernel", bare_launches), ("bare_plan_launches", bare_plan_launches),
                     ("aot_plan_run", plan_run), ("aot_prepared_launch", prepared_launches),
                     ("aot_launch_layer", loader_launch_layer),
                     ("aot_run_kernel", run_kernel_path), ("aot_loader_decode", call), ("triton_jit", triton_jit),
                     ("aot_decode_validated", validated)):
        results[name] = host_time_per_call(fn, a.iters) / n
    print(f"host time per kernel launch ({n} launches per decode call), median of 7 x {a.iters}:")
    for name, t in results.items():
        ratio = t / results["bare_cuLaunchKernel"]
        print(f"  {name:22s} {t * 1e6:7.2f} us   {ratio:5.2f}x bare")
        rows.add("decode", "bf16 b1 h32/8 d128 page16 len256", name, "launch", "host_us_per_launch", t * 1e6)
        rows.add("decode", "bf16 b1 h32/8 d128 page16 len256", name, "launch", "ratio_vs_bare", ratio)
    ex = " (cuLaunchKernelEx: dependent launches)" if any(e for e, _, _ in plan_bare) else ""
    print(f"DecodePlan.run: {results['aot_plan_run'] / results['bare_cuLaunchKernel']:.2f}x a bare prepacked "
          f"cuLaunchKernel pair (issue 21 target <= 1.15x), "
          f"{results['aot_plan_run'] / results['bare_plan_launches']:.2f}x the same launches bare{ex}")


if __name__ == "__main__":
    main()
