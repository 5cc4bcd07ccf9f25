"""The public gated_delta_prefill op: argument checks (each raising before any launch), the
torch.library op and its Meta implementation, and the small conveniences (out allocated,
int64 metadata, fp16/bf16 gates)."""
import pytest
import torch

import aotc.loader
from aotc.loader import sm_count as sm_count_module
from aotc.kernels.gated_delta.reference import gated_delta_reference
from aotc.loader.ops import gated_delta_prefill as op
from tests.cpu.kernels.gated_delta.chunk_cases import assert_close, make_case


@pytest.fixture
def good():
    return make_case([3, 70, 0], H=1, HV=2, seed=11)


@pytest.fixture
def no_launch(monkeypatch):
    """Fails the test if a kernel would launch: errors must come first."""
    import aotc.loader.dispatch as dispatch

    def boom(*a, **k):
        raise AssertionError("launched a kernel despite bad input")

    monkeypatch.setattr(dispatch, "run_kernel", boom)


BAD = [  # (name, change(case, options), exception, words the message must hold)
    ("q dtype", lambda c, o: c.update(q=c["q"].double()), TypeError, "q must be of dtype"),
    ("q not a tensor", lambda c, o: c.update(q=c["q"].tolist()), TypeError, "q must be a torch.Tensor"),
    ("k dtype", lambda c, o: c.update(k=c["k"].half()), TypeError, "k must be of dtype"),
    ("batch of 2", lambda c, o: c.update(q=c["q"].expand(2, -1, -1, -1), k=c["k"].expand(2, -1, -1, -1),
                                         v=c["v"].expand(2, -1, -1, -1)), ValueError, "q.shape[0] must be 1"),
    ("K past 256", lambda c, o: c.update(q=torch.randn(1, 73, 1, 264).bfloat16(),
                                         k=torch.randn(1, 73, 1, 264).bfloat16()), ValueError,
     "q.shape[3] (K) must be in [1, 256]"),
    ("V past 256", lambda c, o: c.update(v=torch.randn(1, 73, 2, 264).bfloat16()), ValueError,
     "v.shape[3] (V) must be in [1, 256]"),
    ("HV not a multiple", lambda c, o: c.update(q=torch.cat([c["q"]] * 3, 2), k=torch.cat([c["k"]] * 3, 2)),
     ValueError, "HV"),
    ("v tokens", lambda c, o: c.update(v=c["v"][:, :-1]), ValueError, "v must be"),
    ("q last dim strided", lambda c, o: c.update(q=torch.randn(1, 73, 1, 128).bfloat16()[..., ::2]), ValueError,
     "q must be contiguous in its last dim"),
    ("g shape", lambda c, o: c.update(g=c["g"][:, :-1]), ValueError, "g must be"),
    ("g dtype", lambda c, o: c.update(g=c["g"].double()), TypeError, "g must be of dtype"),
    ("beta shape", lambda c, o: c.update(beta=c["beta"][..., :1]), ValueError, "beta must be"),
    ("state dtype", lambda c, o: c.update(state=c["state"].half()), TypeError, "state must be of dtype"),
    ("state shape", lambda c, o: c.update(state=c["state"][:, :1]), ValueError, "state must be"),
    ("layout name", lambda c, o: o.update(state_layout="hnd"), ValueError, "state_layout must be one of"),
    ("kmajor shape for K != V", lambda c, o: (c.update(v=torch.randn(1, 73, 2, 128).bfloat16(),
                                                       state=torch.zeros(6, 2, 128, 64)),
                                              o.update(state_layout="kmajor")), ValueError, "state must be"),
    ("state_indices dtype", lambda c, o: c.update(state_indices=c["state_indices"].float()), TypeError,
     "state_indices must be of dtype"),
    ("state_indices length", lambda c, o: c.update(state_indices=c["state_indices"][:2]), ValueError,
     "cu_seqlens must be [N + 1]"),
    ("cu_seqlens dtype", lambda c, o: c.update(cu_seqlens=c["cu_seqlens"].short()), TypeError,
     "cu_seqlens must be of dtype"),
    ("cu_seqlens 2-D", lambda c, o: c.update(cu_seqlens=c["cu_seqlens"][None]), ValueError, "cu_seqlens must be 1-D"),
    ("out dtype", lambda c, o: o.update(out=torch.empty(1, 73, 2, 64)), TypeError, "out must be of dtype"),
    ("out shape", lambda c, o: o.update(out=torch.empty(1, 72, 2, 64).bfloat16()), ValueError, "out must be"),
    ("out aliases v", lambda c, o: o.update(out=c["v"]), ValueError, "out overlaps v in memory"),
    ("scale nan", lambda c, o: o.update(scale=float("nan")), ValueError, "scale must be a finite float"),
    ("qk_l2norm type", lambda c, o: o.update(qk_l2norm=1), TypeError, "qk_l2norm must be a bool"),
    ("device", lambda c, o: c.update(cu_seqlens=c["cu_seqlens"].to("meta")), ValueError,
     "cu_seqlens must be on cpu"),
    # Value checks (the metadata is on the CPU here, so they run by default):
    ("cu_seqlens start", lambda c, o: c["cu_seqlens"].add_(1), ValueError, "cu_seqlens[0] must be 0"),
    ("cu_seqlens order", lambda c, o: c["cu_seqlens"].copy_(torch.tensor([0, 50, 20, 73])), ValueError,
     "non-decreasing"),
    ("cu_seqlens end", lambda c, o: c["cu_seqlens"].copy_(torch.tensor([0, 3, 50, 60])), ValueError,
     "cu_seqlens[-1] must be q.shape[1] = 73"),
    # checked before int64 is narrowed to int32 (where 2**32 + 73 would read as 73)
    ("cu_seqlens int64 past int32", lambda c, o: c.update(cu_seqlens=torch.tensor([0, 3, 73, 2 ** 32 + 73])),
     ValueError, "cu_seqlens[-1] must be q.shape[1] = 73"),
    ("index past the pool", lambda c, o: c["state_indices"].__setitem__(1, 6), ValueError, "state_indices[1] = 6"),
    ("index twice", lambda c, o: c["state_indices"].copy_(torch.tensor([2, 2, -1])), ValueError, "slot 2 twice"),
]


@pytest.mark.parametrize("name,change,exc,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_before_launch(good, no_launch, name, change, exc, words):
    case, options = dict(good), {}
    change(case, options)
    with pytest.raises(exc) as err:
        op.gated_delta_prefill(**case, **options)
    assert words in str(err.value), str(err.value)
    assert "gated_delta_prefill" in str(err.value)


def test_public_name_and_library_op(good):
    assert aotc.loader.gated_delta_prefill is op.gated_delta_prefill
    assert hasattr(torch.ops.aotc, "gated_delta_prefill")
    # The Meta implementation: fake tensors trace through the op without running a kernel.
    meta = {n: t.to("meta") for n, t in good.items()}
    out = torch.empty(meta["v"].shape, dtype=meta["q"].dtype, device="meta")
    torch.ops.aotc.gated_delta_prefill(meta["q"], meta["k"], meta["v"], meta["g"], meta["beta"], meta["state"],
                                       meta["state_indices"], meta["cu_seqlens"], out, 0.125, True, "vmajor", False)


def test_allocates_out_and_takes_half_gates(good):
    # out=None allocates; bf16 g and beta are widened to float32 first (the reference gets the
    # same widened values); an empty sequence leaves its slot as it was... after 0 tokens.
    c = dict(good, g=good["g"].bfloat16(), beta=good["beta"].bfloat16())
    pool = c["state"].clone()
    out = op.gated_delta_prefill(c["q"], c["k"], c["v"], c["g"], c["beta"], pool, c["state_indices"],
                                 c["cu_seqlens"], qk_l2norm=True)
    assert out.shape == c["v"].shape and out.dtype == c["q"].dtype
    ref_out, ref_pool = gated_delta_reference(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"],
                                              c["state_indices"], c["cu_seqlens"], qk_l2norm=True)
    assert_close(out, ref_out, torch.bfloat16, "out")
    used = c["state_indices"].long()
    assert_close(pool[used], ref_pool[used], torch.bfloat16, "states")
    assert torch.equal(pool[used[2]], c["state"][used[2]])  # the empty sequence's state, bit for bit


def _plan(case, **kw):
    c = case
    out = torch.empty(c["v"].shape, dtype=c["q"].dtype)
    return op.launch_plan(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"], c["state_indices"],
                          c["cu_seqlens"], out, 0.125, True, "vmajor", **kw)


def test_state_tile_follows_the_batch_shape():
    # Off CUDA the plan assumes an H100's 132 SMs: the wide tile (bv = V) once N * HV >= 132.
    assert op.sm_count(torch.device("cpu")) == op.INTERPRETER_SMS == 132
    few = make_case([3, 70, 0], H=1, HV=2, seed=12)  # 3 x 2 sequence-heads
    _, (_, axes, grid, _) = _plan(few)
    assert axes == {"dtype": "bf16", "head_k": 64, "head_v": 64, "bv": 32} and grid == (3, 2, 2)
    many = make_case([1, 2], H=1, HV=66, seed=13)  # 2 x 66 = 132 sequence-heads
    _, (_, axes, grid, _) = _plan(many)
    assert axes["bv"] == 64 and grid == (2, 66, 1)
    less = make_case([1, 2], H=1, HV=65, seed=13)  # 130
    assert _plan(less)[1][1]["bv"] == 32
    # lengths never change it (one CUDA graph serves every length): only N, HV, K, V do
    longer = make_case([200, 1], H=1, HV=66, seed=13)
    assert _plan(longer)[1][1:3] == _plan(many)[1][1:3]
    assert _plan(many, bv=32)[1][1:3] == (dict(axes, bv=32), (2, 66, 2))


def test_sm_count_of_a_cuda_device_is_read_once_per_index(monkeypatch):
    calls = []

    class Props:
        multi_processor_count = 108

    def props(index):
        calls.append(index)
        return Props()

    monkeypatch.setattr(sm_count_module, "_counts", {})
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert op.sm_count(torch.device("cuda", 1)) == 108
    assert op.sm_count(torch.device("cuda")) == 108  # the current device: index 1
    assert op.sm_count(torch.device("cuda", 0)) == 108
    assert calls == [1, 0]


def test_the_op_launches_the_chosen_tile(monkeypatch):
    import aotc.loader.dispatch as dispatch

    launched = []
    monkeypatch.setattr(dispatch, "run_kernel", lambda spec, axes, grid, args: launched.append((spec.name, axes, grid)))
    c = make_case([1, 2], H=1, HV=66, seed=13)
    op.gated_delta_prefill(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"], c["state_indices"], c["cu_seqlens"])
    assert [(n, a.get("bv"), g) for n, a, g in launched] == [("gdn_chunk_prep", None, (2 * 66, 1, 1)),
                                                              ("gdn_chunk_state", 64, (2, 66, 1))]


def test_kda_launches_its_three_precompute_kernels(monkeypatch):
    # chunk slots T // 64 + N = 71 // 64 + 2 = 3; each kernel a program a chunk slot and value head
    import aotc.loader.dispatch as dispatch

    launched = []
    monkeypatch.setattr(dispatch, "run_kernel", lambda spec, axes, grid, args: launched.append((spec.name, axes, grid)))
    c = make_case([1, 70], H=1, HV=2, kda=True, seed=15)
    op.gated_delta_prefill(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"], c["state_indices"], c["cu_seqlens"])
    assert [(n, g) for n, _, g in launched] == [("kda_chunk_intra", (3 * 2, 1, 1)), ("kda_chunk_inter", (3 * 2, 1, 1)),
                                               ("kda_chunk_wy", (3 * 2, 1, 1)), ("gdn_chunk_state", (2, 2, 2))]
    assert [a for _, a, _ in launched[:3]] == [{"dtype": "bf16", "head_k": 64}, {"dtype": "bf16", "head_k": 64},
                                               {"dtype": "bf16", "head_k": 64, "head_v": 64}]


def test_misaligned_calls_route_to_the_generic_state_spec(monkeypatch):
    # K = V = 100 (rows not 16-byte multiples): the state pass runs GDN_CHUNK_STATE_GENERIC's binary
    # (chunk_spec.state_launch_generic); K = V = 64 the aligned spec's.
    import aotc.loader.dispatch as dispatch

    for K, want in ((100, "gdn_chunk_state_generic"), (64, "gdn_chunk_state")):
        launched = []
        monkeypatch.setattr(dispatch, "run_kernel", lambda spec, axes, grid, args: launched.append((spec.name, axes)))
        c = make_case([3, 70], H=1, HV=2, K=K, V=K, seed=14)
        op.gated_delta_prefill(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"], c["state_indices"],
                               c["cu_seqlens"])
        assert [n for n, _ in launched] == ["gdn_chunk_prep", want]
        assert launched[1][1]["head_k"] == (128 if K == 100 else 64)


def test_a_batch_past_the_precompute_grid_is_refused_before_launch(no_launch):
    """The precompute's grid is (T // 64 + N) * HV programs in one dimension: past 2**31 a clear
    error (stride-0 views stand in for tensors that large)."""
    T, HV = 2 ** 21, 2 ** 16
    q = torch.zeros(1, 1, 1, 1, dtype=torch.bfloat16).expand(1, T, 1, 1)
    v = torch.zeros(1, 1, HV, 1, dtype=torch.bfloat16).expand(1, T, HV, 1)
    g = torch.zeros(1, 1, HV).expand(1, T, HV)
    state = torch.zeros(1, HV, 1, 1)
    cu = torch.tensor([0, T], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\(T // 64 \+ N\) \* HV below 2\*\*31"):
        op.gated_delta_prefill(q, q, v, g, g, state, torch.zeros(1, dtype=torch.int32), cu)


def test_a_kda_batch_past_the_precompute_grid_is_refused_before_launch(no_launch):
    """KDA's three precompute kernels share GDN's grid, (T // 64 + N) * HV programs: refused from
    the first batch past 2**31."""
    T, HV = 2 ** 23 - 64, 2 ** 14
    q = torch.zeros(1, 1, 1, 1, dtype=torch.bfloat16).expand(1, T, 1, 1)
    v = torch.zeros(1, 1, HV, 1, dtype=torch.bfloat16).expand(1, T, HV, 1)
    g = torch.zeros(1, 1, HV, 1).expand(1, T, HV, 1)
    beta = torch.zeros(1, 1, HV).expand(1, T, HV)
    state = torch.zeros(1, HV, 1, 1)
    cu = torch.tensor([0, T], dtype=torch.int32)
    assert (T // 64 + 1) * HV == 2 ** 31
    with pytest.raises(ValueError, match=r"\(T // 64 \+ N\) \* HV below 2\*\*31"):
        op.gated_delta_prefill(q, q, v, g, beta, state, torch.zeros(1, dtype=torch.int32), cu)
