"""Host time per op call, every op measured the same way side by side in one run: a bare
prepacked driver call of each binary the op launches (the floor: "bare_same_calls" makes the
loader's own driver calls, cuLaunchKernelEx for a dependent launch; "bare_cuLaunchKernel" uses
cuLaunchKernel for every binary, as issue 36's baseline did), the op's plan path
(DecodePlan.run, MLADecodePlan.run, PrefixPrefillPlan.run, GatedDeltaDecodePlan.run,
GatedDeltaPrefillPlan.run), the eager op (`loader.<op>(..., validate=False)`),
and the same kernels through Triton's JIT launcher.

Small shapes, so the GPU finishes each kernel faster than the host can issue the next: the
loop measures the host. The paths are timed interleaved, round by round (`host_times`), and the
run goes under torch.inference_mode(), as a serving engine runs. `--warm` runs each op once and
exits: on a machine without artifacts the calls take the JIT fallback and log their keys, which
`aotc build --from-misses` builds.
"""
from __future__ import annotations

import argparse
import ctypes
import struct
import time

import torch

from aotc import loader
from aotc.kernels.variants import ALIGNED, GENERIC
from aotc.loader import cuda_driver, dispatch
from aotc.loader.fallback import jit_function
from aotc.loader.launch import Launch
from aotc.loader.ops import gated_delta, split_merge

from harness import Rows


def host_times(fns: dict, iters: int, repeats: int = 9) -> dict:
    """Median host seconds per call of each function, the functions interleaved round by round
    (this VM's host speed drifts over seconds: measured one after the other, the first would win)."""
    for fn in fns.values():
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            n = iters // 4 if name == "triton_jit" else iters
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - t0) / n)
            torch.cuda.synchronize()
    return {name: sorted(v)[len(v) // 2] for name, v in samples.items()}


def capture_launches(call):
    """(selection, grid, args) of every kernel launch one op call makes, taken where every launch
    of the general path passes (dispatch.Selection.launch); prepared launches are switched off and
    the op's plans forgotten while it runs."""
    seen = []
    real_launch = dispatch.Selection.launch
    real = split_merge.prepare, gated_delta.prepare

    def spy(sel, grid, args, stream):
        seen.append((sel, tuple(grid), list(args)))
        return real_launch(sel, grid, args, stream)

    dispatch.Selection.launch = spy
    split_merge.prepare = gated_delta.prepare = lambda *a, **k: None
    dispatch.reset()
    try:
        call()
        torch.cuda.synchronize()
    finally:
        dispatch.Selection.launch = real_launch
        split_merge.prepare, gated_delta.prepare = real
        dispatch.reset()
    return seen


def bare_calls(launches, stream, plain=False):
    """Each captured launch as one driver call with its arguments packed once (a cuLaunchKernelEx
    config built once where the binary is a dependent launch; with `plain`, cuLaunchKernel for
    every binary, as issue 36's baseline launched them); None if a binary is not built."""
    calls, keep = [], []
    drv = cuda_driver.driver()
    for sel, grid, args in launches:
        values, misaligned = sel.values(args)
        level = ALIGNED if sel.has_aligned and not misaligned else GENERIC if sel.has_generic else None
        if level is None:
            return None
        b = sel.binary(level)
        packed = Launch(None, b.entry.params)
        struct.pack_into(packed.format, packed.buffer, 0, *values, 0, 0)
        keep.append(packed)
        if b.needs_ex and not plain:
            e = b.entry
            config, attrs = cuda_driver.cluster_launch_config(grid, b.block, b.shared, stream, e.num_ctas,
                                                              e.launch_cooperative_grid, e.launch_pdl)
            keep.append((config, attrs))
            calls.append((drv.cuLaunchKernelEx, (ctypes.byref(config), b.function, packed.pointers, None)))
        else:
            calls.append((b.cu_launch, (b.function, *grid, b.block, 1, 1, b.shared, stream, packed.pointers, None)))

    def bare():
        for fn, a in calls:
            fn(*a)
    bare.keep = keep
    return bare


def jit_calls(launches):
    jit = []
    for sel, grid, args in launches:
        spec, axes = sel.spec, sel.axes
        cfg = spec.launch(axes, 90)
        jit.append((jit_function(spec), grid, args, dict(spec.compile_constexprs(axes, 90), **cfg.triton_options())))

    def run():
        for fn, grid, args, kw in jit:
            fn[grid](*args, **kw)
    return run


# -- each op's inputs (small: the host is the bottleneck) ----------------------------------------
def decode_case():
    q = torch.randn(1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(16, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    table = torch.randperm(16, device="cuda", dtype=torch.int32).view(1, 16)
    lens = torch.full((1,), 256, device="cuda", dtype=torch.int32)
    out = torch.empty_like(q)
    plan = loader.DecodePlan(table, lens, q=q, k_cache=k, v_cache=v, out=out)
    return ("decode", "bf16 b1 h32/8 d128 page16 len256",
            lambda: loader.decode(q, k, v, table, lens, out=out, validate=False),
            lambda: plan.run(q, k, v, out), plan._bound is not None)


def mla_case():
    q = torch.randn(1, 16, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(16, 16, 1, 576, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(16, device="cuda", dtype=torch.int32).view(1, 16)
    lens = torch.full((1,), 256, device="cuda", dtype=torch.int32)
    out = torch.empty(1, 16, 512, device="cuda", dtype=torch.bfloat16)
    plan = loader.MLADecodePlan(table, lens, q=q, kv_cache=kv, v_head_dim=512, out=out)
    return ("mla_decode", "bf16 b1 h16 d576/512 page16 len256",
            lambda: loader.mla_decode(q, kv, table, lens, v_head_dim=512, out=out, validate=False),
            lambda: plan.run(q, kv, out), plan._bound is not None)


def prefix_prefill_case():
    from tests.cpu.kernels.prefix_prefill.cases import make_case

    case, kw = make_case([64], [16], q_heads=8, kv_heads=2, head_dim=128, block_size=16, dtype=torch.bfloat16,
                         device="cuda")
    out = torch.empty_like(case["q"])
    plan = loader.PrefixPrefillPlan(case["block_table"], case["query_start_loc"], case["seq_lens"], q=case["q"],
                                    k=case["k"], v=case["v"], k_cache=case["k_cache"], v_cache=case["v_cache"],
                                    out=out, **kw)
    q, k, v, kc, vc = (case[n] for n in ("q", "k", "v", "k_cache", "v_cache"))
    return ("prefix_prefill", "bf16 b1 ctx64 new16 h8/2 d128 block16",
            lambda: loader.prefix_prefill(**case, **kw, out=out, validate=False),
            lambda: plan.run(q, k, v, kc, vc, out), plan.prepared)


def gated_delta_decode_case():
    from tests.cpu.kernels.gated_delta.cases import make_case

    args, kw = make_case(B=1, T=1, H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, qk_l2norm=True, pads=(),
                         slots=4, device="cuda")
    out = torch.empty_like(args["v"])
    plan_args = {n: t for n, t in args.items() if n != "state_indices"}
    plan = loader.GatedDeltaDecodePlan(args["state_indices"], **plan_args, **kw, out=out)
    q, k, v, g, beta, state = (args[n] for n in ("q", "k", "v", "g", "beta", "state"))
    return ("gated_delta_decode", "bf16 b1 t1 h4/8 k128 v128",
            lambda: loader.gated_delta_decode(**args, **kw, out=out, validate=False),
            lambda: plan.run(q, k, v, g, beta, state, out), plan.prepared)


def gated_delta_prefill_case():
    from tests.cpu.kernels.gated_delta.chunk_cases import make_case

    case = make_case([64], H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(case["v"])
    plan = loader.GatedDeltaPrefillPlan(case["state_indices"], case["cu_seqlens"], q=case["q"], k=case["k"],
                                        v=case["v"], g=case["g"], beta=case["beta"], state=case["state"], out=out,
                                        qk_l2norm=True)
    q, k, v, g, beta, state = (case[n] for n in ("q", "k", "v", "g", "beta", "state"))
    return ("gated_delta_prefill", "bf16 1x64 tokens h4/8 k128 v128",
            lambda: loader.gated_delta_prefill(**case, qk_l2norm=True, out=out, validate=False),
            lambda: plan.run(q, k, v, g, beta, state, out), plan.prepared)


def store_kv_case():
    k = torch.randn(1, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kc = torch.zeros(16, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    slots = torch.tensor([37], device="cuda", dtype=torch.int32)
    return ("store_kv", "bf16 1 token h8 d128 page16",
            lambda: loader.store_kv(k, v, kc, vc, slots, validate=False), None, False)


CASES = (decode_case, mla_case, prefix_prefill_case, gated_delta_decode_case, gated_delta_prefill_case, store_kv_case)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--warm", action="store_true", help="run each op once (JIT fallback: logs misses) and exit")
    a = ap.parse_args()
    rows = Rows(a.out)
    torch.inference_mode().__enter__()
    stream = torch._C._cuda_getCurrentRawStream(0)
    for make in CASES:
        try:
            op, shape, eager, plan, plan_prepared = make()
            eager()
            if plan:
                plan()
        except Exception as e:  # noqa: BLE001 - report and go on to the next op
            print(f"{make.__name__}: {type(e).__name__}: {e}")
            continue
        torch.cuda.synchronize()
        if a.warm:
            continue
        launches = capture_launches(eager)
        fns = {}
        bare = bare_calls(launches, stream) if launches else None
        if launches and bare is None:
            print(f"{op}: a binary is not built; skipped")
            continue
        if bare is not None:
            fns["bare_same_calls"] = bare
            fns["bare_cuLaunchKernel"] = bare_calls(launches, stream, plain=True)
        if plan is not None:
            assert plan_prepared, f"{op}: the plan did not take the prepared path"
            fns["aot_plan_run"] = plan
        eager()  # the op's plan again (capture_launches forgot it)
        fns["aot_eager"] = eager
        if launches:
            fns["triton_jit"] = jit_calls(launches)
        results = host_times(fns, a.iters)
        base, plain = results.get("bare_same_calls"), results.get("bare_cuLaunchKernel")
        print(f"{op} ({shape}; {len(launches)} launches a call): host us per call")
        for name, t in results.items():
            ratio = f"{t / base:5.2f}x bare, {t / plain:5.2f}x bare cuLaunchKernel" if base else "(torch ops)"
            print(f"  {name:22s} {t * 1e6:7.2f} us   {ratio}")
            rows.add(op, shape, name, "launch", "host_us_per_call", t * 1e6)
            if base:
                rows.add(op, shape, name, "launch", "ratio_vs_bare", t / base)
                rows.add(op, shape, name, "launch", "ratio_vs_bare_cuLaunchKernel", t / plain)


if __name__ == "__main__":
    main()
