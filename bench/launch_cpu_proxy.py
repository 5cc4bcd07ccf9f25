"""CPU proxy of the launch path's host time: the real steady-state code (every plan's `.run`,
eager `loader.<op>(validate=False)`) on CPU tensors, with prepared launches whose driver call is a
no-op Python function (as tests/cpu/loader/ops/test_launch_fast_path.py, without recording).
Prints ns per call (the fastest of 40 batches of 1000) for each path; run it against two checkouts to compare
them (`PYTHONPATH=<checkout's py dir> python bench/launch_cpu_proxy.py`). No GPU needed.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from aotc import loader  # noqa: E402
from aotc.loader import dispatch, workspace  # noqa: E402
from aotc.loader.interpreter import patch_interpreter  # noqa: E402
from aotc.loader.launch import Launch  # noqa: E402
from aotc.loader.ops import decode, decode_plan, gated_delta, mla_plan, prefix_prefill, split_merge  # noqa: E402
from aotc.loader.ops.split_merge import SplitMerge  # noqa: E402

STREAM = 77
calls = [0]


class _Entry:
    num_ctas, launch_cooperative_grid, launch_pdl, key = 1, False, False, "noop"


class _Binary:
    function, block, shared, needs_ex, entry = 1, 128, 0, False, _Entry

    @staticmethod
    def cu_launch(*a):
        calls[0] += 1
        return 0


def _prepare(spec, axes, grid, ints, device, aligned_only=False):
    params = ["*i8" if a.kind == "ptr" else a.kind for a in spec.args] + ["*i8", "*i8"]
    idx = tuple(spec.arg_index[n] for n in spec.divisible_args("aligned") if spec.arg_index[n] < spec.leading_ptrs)
    return Launch(lambda a: _Binary, params, grid, ints, spec.leading_ptrs, True, dispatch._misaligned_function(idx))


def _patch():
    patch_interpreter()
    split_merge.prepare = gated_delta.prepare = dispatch.prepare = _prepare
    init = SplitMerge.__init__

    def prepared_init(self, *a, **k):
        init(self, *a, **k)
        if self.fast_split is None and self.launches_anything():
            s, m = self._prepare()
            m.lock = s.lock
            self.fast_split, self.fast_merge = s, m

    SplitMerge.__init__ = prepared_init
    make = gated_delta._make_plan

    def prepared_make(*a):
        plan = make(*a)
        if plan.fast is None and plan.grid[0]:
            plan.fast = _prepare(gated_delta.S.DECODE, plan.axes, plan.grid, plan.ints, None)
        return plan

    gated_delta._make_plan = prepared_make
    # prefix_prefill makes steady states for CUDA calls only
    if hasattr(prefix_prefill, "_prepares"):
        prefix_prefill._prepares = lambda q: True
    else:  # before that seam: the same function without the test
        src = inspect.getsource(prefix_prefill._make_eager).replace("not q.is_cuda or ", "")
        exec(compile(src, "<proxy>", "exec"), prefix_prefill.__dict__)  # noqa: S102
    current, stream = (lambda: None), (lambda index: STREAM)
    torch._C._cuda_getDevice, torch._C._cuda_getCurrentRawStream = current, stream
    mods = [decode_plan, mla_plan, split_merge, gated_delta, prefix_prefill]
    for name in ("steady", "plan"):  # the shared steady state; the plan objects' base (absent in older checkouts)
        try:
            mods.append(importlib.import_module(f"aotc.loader.ops.{name}"))
        except ImportError:
            pass
    from aotc.loader.ops import gated_delta_prefill
    gated_delta_prefill._current_device, gated_delta_prefill._current_stream = current, stream
    if hasattr(gated_delta_prefill, "_prepares"):
        gated_delta_prefill._prepares = lambda q: True
    for m in mods:
        if hasattr(m, "_current_device"):
            m._current_device, m._current_stream = current, stream
    workspace._buffers[(None, STREAM)] = torch.zeros(1 << 16)


def _time(fn, n=1000, repeat=40) -> float:
    for _ in range(200):
        fn()
    per = []
    for _ in range(repeat):
        t = time.perf_counter_ns()
        for _ in range(n):
            fn()
        per.append((time.perf_counter_ns() - t) / n)
    return min(per)  # the least disturbed batch: this host is shared


def _cases():
    from tests.cpu.kernels.decode.cases import make_case
    from tests.cpu.kernels.decode.test_vllm_caches import _problem, vllm_inline_cache
    from tests.cpu.kernels.gated_delta.cases import make_case as gdn_case

    c = make_case([5, 40, 33], fmt="bf16", seed=61)
    out = torch.empty_like(c.q)
    plan = loader.DecodePlan(c.table, c.seq_lens, q=c.q, k_cache=c.k_cache, v_cache=c.v_cache, out=out)
    yield "DecodePlan.run bf16", lambda: plan.run(c.q, c.k_cache, c.v_cache, out)
    yield "decode eager bf16", lambda: loader.decode(c.q, c.k_cache, c.v_cache, c.table, c.seq_lens, out=out,
                                                     validate=False)
    q, k, v, table, lens = _problem([5, 17], 64)
    kc, vc, ks, vs, _, _ = vllm_inline_cache(k, v, "int8")
    qv = q * 4
    outv = torch.empty_like(q)
    alibi = torch.tensor([2.0 ** -(i + 1) for i in range(q.shape[1])])
    pv = loader.DecodePlan(table, lens, q=qv, k_cache=kc, v_cache=vc, k_scale=ks, v_scale=vs, kv_format="int8",
                           out=outv)
    yield "DecodePlan.run vLLM record (kv_align 8)", lambda: pv.run(qv, kc, vc, outv, ks, vs)
    yield "decode eager vLLM record (kv_align 8)", lambda: loader.decode(
        qv, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format="int8", out=outv, softcap=2.0,
        alibi_slopes=alibi, validate=False)
    args, kw = gdn_case(B=2, T=1, H=2, HV=4, K=64, V=64, pads=(), slots=4)
    gout = torch.empty_like(args["v"])
    yield "gated_delta_decode eager", lambda: loader.gated_delta_decode(**args, **kw, out=gout, validate=False)
    g = torch.Generator().manual_seed(5)
    pq = torch.randn(16, 8, 128, generator=g).to(torch.bfloat16)
    pk, pv_ = (torch.randn(16, 2, 128, generator=g).to(torch.bfloat16) for _ in range(2))
    kcache, vcache = (torch.randn(8, 16, 2, 128, generator=g).to(torch.bfloat16) for _ in range(2))
    bt = torch.arange(8, dtype=torch.int32).view(1, 8)
    qsl = torch.tensor([0, 16], dtype=torch.int32)
    sl = torch.tensor([80], dtype=torch.int32)
    pout = torch.empty_like(pq)
    yield "prefix_prefill eager", lambda: loader.prefix_prefill(pq, pk, pv_, kcache, vcache, bt, qsl, sl, out=pout,
                                                                validate=False)
    plans = "PrefixPrefillPlan" in loader.__all__  # the plan objects (absent in older checkouts)
    if plans:
        pp = loader.PrefixPrefillPlan(bt, qsl, sl, q=pq, k=pk, v=pv_, k_cache=kcache, v_cache=vcache, out=pout)
        yield "PrefixPrefillPlan.run", lambda: pp.run(pq, pk, pv_, kcache, vcache, pout)
        gargs = {n: t for n, t in args.items() if n != "state_indices"}
        gp = loader.GatedDeltaDecodePlan(args["state_indices"], **gargs, **kw, out=gout)
        gq, gk, gv, gg, gb, gs = (args[n] for n in ("q", "k", "v", "g", "beta", "state"))
        yield "GatedDeltaDecodePlan.run", lambda: gp.run(gq, gk, gv, gg, gb, gs, gout)
    from tests.cpu.kernels.gated_delta.chunk_cases import make_case as chunk_case

    c = chunk_case([64], H=2, HV=4, K=64, V=64, dtype=torch.bfloat16)
    cout = torch.empty_like(c["v"])
    yield "gated_delta_prefill eager", lambda: loader.gated_delta_prefill(**c, out=cout, validate=False)
    if plans:
        cp = loader.GatedDeltaPrefillPlan(c["state_indices"], c["cu_seqlens"], q=c["q"], k=c["k"], v=c["v"], g=c["g"],
                                          beta=c["beta"], state=c["state"], out=cout)
        cq, ck, cv, cg, cb, cs = (c[n] for n in ("q", "k", "v", "g", "beta", "state"))
        yield "GatedDeltaPrefillPlan.run", lambda: cp.run(cq, ck, cv, cg, cb, cs, cout)


def main():
    _patch()
    rows = []
    with torch.inference_mode():
        for name, fn in _cases():
            fn()
            fn()  # the full path, then a steady state made
            before = calls[0]
            fn()
            n = calls[0] - before
            rows.append((name, _time(fn), n))
    for name, ns, n in rows:
        print(f"{name:45s} {ns:8.0f} ns/call  ({n} driver calls)")


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
