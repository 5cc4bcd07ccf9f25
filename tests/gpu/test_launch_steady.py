"""The steady-state launch paths on the GPU: an unvalidated eager call that matches an earlier one
(decode, mla_decode, gated_delta_decode, prefix_prefill, gated_delta_prefill) writes what the
fully checked call writes, bit for bit; a view of the same values with other strides is planned
anew (right answer, not a stale plan's); and the steady state captures into a CUDA graph that
replays with new inputs."""
import pytest
import torch

from aotc import loader
from aotc.loader.ops import decode as D
from aotc.loader.ops import gated_delta as GD
from aotc.loader.ops import gated_delta_prefill as GP
from aotc.loader.ops import mla as M
from aotc.loader.ops import prefix_prefill as PP


def _strided(t):
    """t's values in a tensor whose last-but-one dim has twice the stride (same shape)."""
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    view = wide[..., :t.shape[-1]]
    view.copy_(t)
    return view


def _same(a, b) -> bool:
    """Bit for bit, NaN where NaN (a pool's unused slots hold NaN)."""
    return torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)


def _decode_case():
    g = torch.Generator("cuda").manual_seed(7)
    q = torch.randn(3, 32, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(24, 16, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(24, 16, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    table = torch.randperm(24, device="cuda", generator=g).to(torch.int32)[:21].view(3, 7)
    lens = torch.tensor([1, 100, 112], device="cuda", dtype=torch.int32)
    return q, k, v, table, lens


def test_decode_steady_state_equals_the_checked_call_and_replans_a_restrided_query():
    q, k, v, table, lens = _decode_case()
    want = loader.decode(q, k, v, table, lens)
    out = torch.full_like(q, float("nan"))
    for _ in range(3):
        loader.decode(q, k, v, table, lens, out=out, validate=False)
    assert any(e.match(q, k, v, table, lens, None, None, None, "auto", None, None, None, None, out, None, "group",
                       None, False, 0.0, False) for e in D._recent.entries)
    out.fill_(float("nan"))
    loader.decode(q, k, v, table, lens, out=out, validate=False)
    assert torch.equal(out, want)
    out.fill_(float("nan"))
    loader.decode(_strided(q), k, v, table, lens, out=out, validate=False)
    assert torch.equal(out, want)


def test_decode_steady_state_in_a_cuda_graph():
    q, k, v, table, lens = _decode_case()
    out = torch.empty_like(q)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # the steady state on the capture stream, its workspace allocated
            loader.decode(q, k, v, table, lens, out=out, validate=False)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loader.decode(q, k, v, table, lens, out=out, validate=False)
    q.copy_(torch.randn_like(q))
    want = loader.decode(q, k, v, table, lens)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


def test_mla_decode_steady_state_and_plan_equal_the_checked_call():
    g = torch.Generator("cuda").manual_seed(8)
    q = torch.randn(2, 16, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    kv = torch.randn(20, 16, 1, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    table = torch.randperm(20, device="cuda", generator=g).to(torch.int32)[:16].view(2, 8)
    lens = torch.tensor([33, 128], device="cuda", dtype=torch.int32)
    want = loader.mla_decode(q, kv, table, lens, v_head_dim=512)
    out = torch.full_like(want, float("nan"))
    for _ in range(3):
        loader.mla_decode(q, kv, table, lens, v_head_dim=512, out=out, validate=False)
    assert len(M._recent.entries) >= 1 and torch.equal(out, want)
    out.fill_(float("nan"))
    loader.mla_decode(_strided(q), kv, table, lens, v_head_dim=512, out=out, validate=False)
    assert torch.equal(out, want)
    plan = loader.MLADecodePlan(table, lens, q=q, kv_cache=kv, v_head_dim=512)
    out.fill_(float("nan"))
    plan.run(q, kv, out)
    assert torch.equal(out, want)


def test_gated_delta_decode_steady_state_equals_the_checked_call():
    from tests.cpu.kernels.gated_delta.cases import make_case

    args, kw = make_case(B=2, T=1, H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, qk_l2norm=True, pads=(),
                         slots=4, device="cuda")
    state0 = args["state"].clone()
    want = loader.gated_delta_decode(**args, **kw)
    want_state = args["state"].clone()
    out = torch.empty_like(want)
    for _ in range(3):
        args["state"].copy_(state0)
        out.fill_(float("nan"))
        loader.gated_delta_decode(**args, **kw, out=out, validate=False)
    assert len(GD._recent.entries) >= 1
    assert torch.equal(out, want) and _same(args["state"], want_state)


def test_prefix_prefill_steady_state_equals_the_checked_call():
    from tests.cpu.kernels.prefix_prefill.cases import make_case

    case, kw = make_case([64, 5], [16, 9], q_heads=8, kv_heads=2, head_dim=128, block_size=16, dtype=torch.bfloat16,
                         device="cuda")
    want = loader.prefix_prefill(**case, **kw)
    out = torch.full_like(case["q"], float("nan"))
    for _ in range(3):
        loader.prefix_prefill(**case, **kw, out=out, validate=False)
    assert len(PP._recent.entries) >= 1 and torch.equal(out, want)
    out.fill_(float("nan"))
    loader.prefix_prefill(**dict(case, q=_strided(case["q"])), **kw, out=out, validate=False)
    assert torch.equal(out, want)


@pytest.mark.parametrize("kda", [False, True])  # KDA: three precompute launches, their own pointer lists
def test_gated_delta_prefill_steady_state_equals_the_checked_call(kda):
    from tests.cpu.kernels.gated_delta.chunk_cases import make_case

    case = make_case([64, 30], H=4, HV=8, K=128, V=128, dtype=torch.bfloat16, kda=kda, strong_gates=kda, device="cuda")
    state0 = case["state"].clone()
    want = loader.gated_delta_prefill(**case, qk_l2norm=True)
    want_state = case["state"].clone()
    out = torch.empty_like(want)
    for _ in range(3):
        case["state"].copy_(state0)
        out.fill_(float("nan"))
        loader.gated_delta_prefill(**case, qk_l2norm=True, out=out, validate=False)
    assert len(GP._recent.entries) >= 1
    assert torch.equal(out, want) and _same(case["state"], want_state)


@pytest.fixture(autouse=True)
def _fresh_steady_states():
    from aotc.loader import dispatch

    dispatch.reset()
    yield
    dispatch.reset()
