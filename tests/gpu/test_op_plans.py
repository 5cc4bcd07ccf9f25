"""The plan objects of prefix_prefill, gated_delta_decode and gated_delta_prefill on the GPU: a
plan's runs over two layers write what the eager op writes, bit for bit (outputs and states);
runs take the prepared launches (no full check); a GatedDeltaPrefillPlan's workspace is its own
and the same across runs; runs capture into a CUDA graph that replays with new inputs."""
import pytest
import torch

from aotc import loader
from tests.cpu.kernels.gated_delta.cases import make_case as gdn_case
from tests.cpu.kernels.gated_delta.chunk_cases import make_case as chunk_case
from tests.cpu.kernels.prefix_prefill.cases import make_case as pp_case


def _same(a, b) -> bool:
    """Bit for bit, NaN where NaN (a pool's unused slots hold NaN)."""
    return torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)


def _no_full_check(monkeypatch, plan):
    def refuse(*a, **k):
        raise AssertionError("took the full check")

    monkeypatch.setattr(plan, "run_checked", refuse)


def _graph(run, before):
    """run() captured into a CUDA graph (warmed on the capture stream), then `before()` and a replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    before()
    graph.replay()
    torch.cuda.synchronize()


def _second_layer(c, names):
    """Another layer of the same step: `names`' values halved (NaN where the first layer's are)."""
    return dict(c, **{n: c[n] * 0.5 for n in names})


@pytest.mark.parametrize("kv_format", [None, "int8", "int4"])
def test_prefix_prefill_plan_equals_the_op_per_layer_and_in_a_graph(monkeypatch, kv_format):
    """bf16 caches run the Triton kernel; int8/int4 at head_dim 128 the warp-specialized Gluon
    kernel on sm90 (prefix_prefill.kernel_for), whose launch the plan prepares as well."""
    c0, kw = pp_case([64, 5], [16, 9], q_heads=8, kv_heads=2, head_dim=128, block_size=16, dtype=torch.bfloat16,
                     device="cuda", seed=1, kv_format=kv_format)
    scales = {n: kw.pop(n) for n in ("k_scale", "v_scale") if n in kw}
    plan = loader.PrefixPrefillPlan(c0["block_table"], c0["query_start_loc"], c0["seq_lens"], q=c0["q"], k=c0["k"],
                                    v=c0["v"], k_cache=c0["k_cache"], v_cache=c0["v_cache"], **scales, **kw)
    assert plan.prepared
    if kv_format and torch.cuda.get_device_capability() == (9, 0):
        assert plan._aligned_only  # the Gluon kernel's launch (its one binary is ALIGNED)
    halved = ("q", "k", "v") if kv_format else ("q", "k", "v", "k_cache", "v_cache")
    layers = [(c0, scales), (_second_layer(c0, halved), {n: t * 0.5 for n, t in scales.items()})]
    for c, sc in layers:
        want = loader.prefix_prefill(**c, **sc, **kw)
        out = torch.full_like(want, float("nan"))
        plan.run(c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"], out, **sc)  # the first run may take the full check
        assert torch.equal(out, want)
    _no_full_check(monkeypatch, plan)
    out = torch.full_like(c0["q"], float("nan"))
    _graph(lambda: plan.run(c0["q"], c0["k"], c0["v"], c0["k_cache"], c0["v_cache"], out, **scales),
           lambda: (c0["q"].copy_(torch.randn_like(c0["q"])), out.fill_(float("nan"))))
    assert torch.equal(out, loader.prefix_prefill(**c0, **scales, **kw))


@pytest.mark.parametrize("fused", [False, True])
def test_gated_delta_decode_plan_equals_the_op_per_layer_and_in_a_graph(monkeypatch, fused):
    layers = [gdn_case(B=4, T=1, H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, qk_l2norm=True, fused=fused,
                       pads=(2,), slots=9, device="cuda", seed=s) for s in (3, 4)]
    (a0, kw0), (a1, kw1) = layers
    idx = a0["state_indices"]
    gates = ("A_log", "a", "dt_bias", "b")
    plan = loader.GatedDeltaDecodePlan(idx, **{n: t for n, t in a0.items() if n != "state_indices"}, **kw0)
    assert plan.prepared

    def run(a, kw, state, out):
        return plan.run(a["q"], a["k"], a["v"], a["g"], a["beta"], state, out, **{n: kw[n] for n in gates if n in kw})

    for a, kw in layers:
        a = dict(a, state_indices=idx)
        state = a["state"].clone()
        want = loader.gated_delta_decode(**a, **kw)
        out = torch.full_like(want, float("nan"))
        run(a, kw, state, out)
        assert torch.equal(out, want) and _same(state, a["state"])
    _no_full_check(monkeypatch, plan)
    state, out = a0["state"].clone(), torch.full_like(a0["v"], float("nan"))
    start = a0["state"].clone()
    _graph(lambda: run(a0, kw0, state, out),
           lambda: (a0["q"].copy_(torch.randn_like(a0["q"])), state.copy_(start), out.fill_(float("nan"))))
    want = loader.gated_delta_decode(**dict(a0, state=start), **kw0)
    assert torch.equal(out, want) and _same(state, start)


@pytest.mark.parametrize("kda", [False, True])
def test_gated_delta_prefill_plan_equals_the_op_and_owns_its_workspace(monkeypatch, kda):
    c0 = chunk_case([64, 5, 70], H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, kda=kda, device="cuda", seed=5)
    layers = [c0, _second_layer(c0, ("q", "k", "v", "state"))]
    plan = loader.GatedDeltaPrefillPlan(c0["state_indices"], c0["cu_seqlens"], q=c0["q"], k=c0["k"], v=c0["v"],
                                        g=c0["g"], beta=c0["beta"], state=c0["state"], qk_l2norm=True)
    assert plan.prepared
    ws = [t.data_ptr() for t in plan.workspace if t is not None]
    for c in layers:
        state = c["state"].clone()
        want = loader.gated_delta_prefill(**c, qk_l2norm=True)
        out = torch.full_like(want, float("nan"))
        plan.run(c["q"], c["k"], c["v"], c["g"], c["beta"], state, out)
        assert torch.equal(out, want) and _same(state, c["state"])
    assert [t.data_ptr() for t in plan.workspace if t is not None] == ws
    _no_full_check(monkeypatch, plan)
    start, state, out = c0["state"].clone(), c0["state"].clone(), torch.full_like(c0["v"], float("nan"))
    _graph(lambda: plan.run(c0["q"], c0["k"], c0["v"], c0["g"], c0["beta"], state, out),
           lambda: (c0["v"].copy_(torch.randn_like(c0["v"])), state.copy_(start), out.fill_(float("nan"))))
    want = loader.gated_delta_prefill(**dict(c0, state=start), qk_l2norm=True)
    assert torch.equal(out, want) and _same(state, start)
