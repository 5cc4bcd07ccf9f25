"""aotc.compat.fla with flash-linear-attention's conventions (initial_state [N, HV, K, V], not
modified; (o, final_state) returned; cu_seqlens int64; equal-length batches [B, T]) against the
float32 per-token reference. Tolerance: chunk_cases.TOL, max |got - want| over max |want| of the
whole output or state (bf16 2.5e-2, fp16 5e-3, fp32 2e-4). Lengths 1, 63, 64, 65 (the chunk is
64), GVA (HV = 2H), K = V = 64 and head sizes off the tiles (60, 100); fp32 and mixed dtypes;
KDA's two entry points with fla's gate forms; the autograd guard. Outputs start NaN-free only if
the ops wrote every element (chunk_cases.assert_close rejects NaN through its max)."""
import pytest
import torch

from aotc.compat import fla
from aotc.kernels.gated_delta.reference import gated_delta_reference
from tests.cpu.kernels.gated_delta.chunk_cases import assert_close, make_case


def fla_inputs(lengths, *, equal=False, v_first=False, **kw):
    """fla's arguments for a make_case problem: initial_state [N, HV, K, V] (or [N, HV, V, K])
    holding each sequence's start state; equal: the packed batch reshaped to [B, T, ...]."""
    c = make_case(lengths, state_layout="vmajor" if v_first else "kmajor", **kw)
    h0 = c["state"][c["state_indices"].long()].clone()
    t = {n: c[n] for n in ("q", "k", "v", "g", "beta")}
    if equal:
        b = len(lengths)
        t = {n: x.reshape(b, lengths[0], *x.shape[2:]) for n, x in t.items()}
    return t, h0, c["cu_seqlens"].long()


def reference(t, h0, cu, *, v_first=False, l2=True, scale=None):
    n = h0.shape[0]
    return gated_delta_reference(t["q"], t["k"], t["v"], t["g"], t["beta"], h0, torch.arange(n), cu, scale=scale,
                                 qk_l2norm=l2, state_layout="vmajor" if v_first else "kmajor")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chunk_varlen_with_initial_and_final_state(dtype):
    t, h0, cu = fla_inputs([1, 63, 64, 65], H=1, HV=2, dtype=dtype, seed=21)
    keep = h0.clone()
    o, ht = fla.chunk_gated_delta_rule(**t, initial_state=h0, output_final_state=True,
                                       use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    want_o, want_h = reference(t, h0, cu)
    assert o.shape == t["v"].shape and o.dtype == dtype and ht.dtype == torch.float32
    assert_close(o, want_o, dtype, "o")
    assert_close(ht, want_h, dtype, "final_state")
    assert torch.equal(h0, keep)  # fla leaves initial_state alone


def test_chunk_equal_lengths_batch_v_first_and_scale():
    t, h0, _ = fla_inputs([70, 70], equal=True, v_first=True, H=2, HV=4, dtype=torch.bfloat16, seed=22)
    o, ht = fla.chunk_gated_delta_rule(**t, scale=0.2, initial_state=h0, output_final_state=True,
                                       use_qk_l2norm_in_kernel=True, state_v_first=True)
    want_o, want_h = reference(t, h0, None, v_first=True, scale=0.2)
    assert o.shape == (2, 70, 4, 64) and ht.shape == (2, 4, 64, 64)
    assert_close(o, want_o, torch.bfloat16, "o")
    assert_close(ht, want_h, torch.bfloat16, "final_state")


def test_chunk_without_state_returns_none():
    t, h0, cu = fla_inputs([5, 40], H=1, HV=2, dtype=torch.float16, l2norm_in_kernel=False, seed=23)
    o, ht = fla.chunk_gated_delta_rule(**t, cu_seqlens=cu)
    assert ht is None
    want_o, _ = reference(t, torch.zeros_like(h0), cu, l2=False)
    assert_close(o, want_o, torch.float16, "o")


def test_fused_recurrent_decode_rows_kda_gates_and_gva():
    # T = 3 without cu_seqlens runs the decode kernel; gk (per-channel decays) and g add in log space.
    t, h0, _ = fla_inputs([3, 3, 3], equal=True, kda=True, H=1, HV=2, dtype=torch.bfloat16, seed=24)
    g_head = -torch.rand(3, 3, 2) * 0.3
    gk = t.pop("g")
    o, ht = fla.fused_recurrent_gated_delta_rule(**t, g=g_head, gk=gk, initial_state=h0, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True)
    t["g"] = gk + g_head[..., None]
    want_o, want_h = reference(t, h0, None)
    assert_close(o, want_o, torch.bfloat16, "o")
    assert_close(ht, want_h, torch.bfloat16, "final_state")


def test_fused_recurrent_varlen_and_long_rows():
    # With cu_seqlens (and for T > 8) the chunked op computes the same recurrence.
    t, h0, cu = fla_inputs([1, 65, 9], H=1, HV=2, dtype=torch.float16, seed=25)
    o, ht = fla.fused_recurrent_gated_delta_rule(**t, initial_state=h0, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    want_o, want_h = reference(t, h0, cu)
    assert_close(o, want_o, torch.float16, "o")
    assert_close(ht, want_h, torch.float16, "final_state")


def test_chunk_gate_and_beta_activations_in_kernel():
    # use_gate_in_kernel: g is raw, g = -exp(A_log) * softplus(g + dt_bias); use_beta_sigmoid_in_kernel
    # with allow_neg_eigval: beta = 2 sigmoid(beta). Given through fla's **kwargs like fla's callers.
    t, h0, cu = fla_inputs([1, 65], H=1, HV=2, dtype=torch.bfloat16, seed=27)
    gen = torch.Generator().manual_seed(27)
    raw_g, raw_b = torch.randn(1, 66, 2, generator=gen), torch.randn(1, 66, 2, generator=gen)
    a_log, dt_bias = torch.log(torch.tensor([0.7, 3.0])), torch.tensor([0.5, -1.0])
    t.update(g=raw_g, beta=raw_b)
    o, ht = fla.chunk_gated_delta_rule(**t, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                       use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, cu_seqlens=cu,
                                       use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias)
    t.update(g=-a_log.exp() * torch.nn.functional.softplus(raw_g + dt_bias), beta=2 * torch.sigmoid(raw_b))
    want_o, want_h = reference(t, h0, cu)
    assert_close(o, want_o, torch.bfloat16, "o")
    assert_close(ht, want_h, torch.bfloat16, "final_state")


@pytest.mark.parametrize("T", [1, 2])
def test_fused_recurrent_v_first_state_decode(T):
    # The decode reads initial_state where it lies and writes a new final state (fla's h0 -> ht):
    # initial_state is left alone; a non-contiguous one is copied first, with the same results.
    t, h0, _ = fla_inputs([T, T], equal=True, v_first=True, H=1, HV=2, dtype=torch.float16, seed=28)
    want_o, want_h = reference(t, h0, None, v_first=True)
    for start in (h0, h0.transpose(2, 3).contiguous().transpose(2, 3)):
        keep = start.clone()
        o, ht = fla.fused_recurrent_gated_delta_rule(**t, initial_state=start, output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True, state_v_first=True)
        assert ht.shape == h0.shape and ht.data_ptr() != start.data_ptr()
        assert torch.equal(start, keep)
        assert_close(o, want_o, torch.float16, "o")
        assert_close(ht, want_h, torch.float16, "final_state")


def test_unsupported_and_bad_arguments_raise():
    t, h0, cu = fla_inputs([4, 4], equal=True, H=1, HV=2, seed=26)
    with pytest.raises(NotImplementedError, match="gv"):
        fla.fused_recurrent_gated_delta_rule(**t, gv=torch.zeros(2, 4, 2, 64))
    with pytest.raises(NotImplementedError, match="head_first"):
        fla.chunk_gated_delta_rule(**t, head_first=True)
    with pytest.raises(NotImplementedError, match="one a value channel"):
        fla.chunk_gated_delta_rule(**{**t, "beta": torch.rand(2, 4, 2, 64)})
    with pytest.raises(ValueError, match=r"initial_state must be \[N, HV, K, V\]"):
        fla.chunk_gated_delta_rule(**t, initial_state=h0[:1])
    with pytest.raises(ValueError, match="batch size must be 1"):
        fla.chunk_gated_delta_rule(**t, cu_seqlens=torch.tensor([0, 2, 4]))
    with pytest.raises(NotImplementedError, match="cp_context"):
        fla.chunk_gated_delta_rule(**t, cp_context=object())
    with pytest.raises(TypeError, match="unexpected keyword"):
        fla.chunk_gated_delta_rule(**t, use_qk_l2nrom_in_kernel=True)
    with pytest.raises(ValueError, match="allow_neg_eigval"):
        fla.fused_recurrent_gated_delta_rule(**t, allow_neg_eigval=True)
    with pytest.raises(ValueError, match="give g"):
        fla.fused_recurrent_gated_delta_rule(**{**t, "g": None})


def test_unsupported_kda_and_deprecated_arguments():
    t, h0, cu = fla_inputs([4, 4], equal=True, kda=True, H=1, HV=2, seed=29)
    with pytest.raises(ValueError, match=r"`chunk_size` must be either 32 or 64"):  # fla's own test's pattern
        fla.chunk_kda(**t, chunk_size=16)
    with pytest.raises(ValueError, match="only allowed in inference mode"):  # fla asserts it
        fla.chunk_kda(**t, return_intermediate_states=True)
    with torch.inference_mode(), pytest.raises(ValueError, match="disable_recompute=False"):
        fla.chunk_kda(**t, return_intermediate_states=True, disable_recompute=True)
    with pytest.raises(ValueError, match=r"g must be \[B, T, HV, K\]"):
        fla.chunk_kda(**{**t, "g": t["g"][..., 0]})
    with pytest.raises(ValueError, match="lower_bound"):
        fla.chunk_kda(**t, use_gate_in_kernel=True, safe_gate=True, A_log=torch.zeros(2))
    with pytest.raises(ValueError, match="A_log"):
        fla.fused_recurrent_kda(**t, use_gate_in_kernel=True)
    with pytest.warns(DeprecationWarning):
        fla.fused_recurrent_kda(**t, transpose_state_layout=True)
    with pytest.raises(ValueError, match="not both"):
        fla.fused_recurrent_kda(**t, state_v_first=True, transpose_state_layout=True)


@pytest.mark.parametrize("chunk_size,equal,v_first", [(64, False, False), (32, True, True)])
def test_chunk_kda_intermediate_states(chunk_size, equal, v_first):
    # fla's return_intermediate_states: h[:, i] is the state before chunk i (k's dtype), o and the
    # final state as without it. Lengths past one chunk, a partial last chunk, an empty sequence.
    lengths = [70, 70] if equal else [1, 130, 0, 64, 65]
    t, h0, cu = fla_inputs(lengths, equal=equal, v_first=v_first, kda=True, H=1, HV=2, dtype=torch.bfloat16,
                           seed=31)
    cu_arg = None if equal else cu
    with torch.inference_mode():
        o, ht, h = fla.chunk_kda(**t, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                 cu_seqlens=cu_arg, chunk_size=chunk_size, return_intermediate_states=True,
                                 state_v_first=v_first)
        o2, ht2 = fla.chunk_kda(**t, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                cu_seqlens=cu_arg, chunk_size=chunk_size, state_v_first=v_first)
    want_o, want_h = reference(t, h0, cu_arg, v_first=v_first)
    assert_close(o, want_o, torch.bfloat16, "o")
    assert_close(ht, want_h, torch.bfloat16, "final_state")
    if chunk_size == 64:  # one chunk a step: the same chunks as one call's, so the same bits
        assert torch.equal(o, o2) and torch.equal(ht, ht2)
    nts = [-(-n // chunk_size) for n in lengths]
    rows = len(lengths) if equal else 1
    assert h.dtype == t["k"].dtype and h.shape == (rows, sum(nts) // rows, 2, 64, 64)
    flat = h.reshape(-1, 2, 64, 64)
    i = 0
    for n, length in enumerate(lengths):  # each chunk's start state: the reference over the tokens before it
        for c in range(nts[n]):
            if equal:
                part = {x: y[n:n + 1, :c * chunk_size] for x, y in t.items()}
                cut = None
            else:
                part = {x: y[:, cu[n]:cu[n] + c * chunk_size] for x, y in t.items()}
                cut = torch.tensor([0, c * chunk_size])
            _, want = reference(part, h0[n:n + 1], cut, v_first=v_first) if c else (None, h0[n:n + 1])
            assert_close(flat[i].float(), want[0], torch.bfloat16, f"h[{n}, {c}]")
            i += 1


@pytest.mark.parametrize("K,V", [(60, 100), (100, 60)])
def test_fp32_and_head_sizes_off_the_tiles(K, V):
    # fp32 q/k/v computed in fp32 (TOL[fp32] is ~100x under one bf16 rounding), K and V padded
    # inside the kernels' 64 / 128 tiles; chunked and recurrent entry points, both state layouts.
    t, h0, cu = fla_inputs([1, 63, 65], K=K, V=V, H=1, HV=2, dtype=torch.float32, seed=K)
    for v_first in (False, True):
        h = h0.transpose(-1, -2).contiguous() if v_first else h0
        want_o, want_h = reference(t, h, cu, v_first=v_first)
        for fn in (fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule):
            o, ht = fn(**t, initial_state=h, output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                       state_v_first=v_first)
            assert o.dtype == torch.float32 and o.shape == (1, 129, 2, V)
            assert_close(o, want_o, torch.float32, "o")
            assert_close(ht, want_h, torch.float32, "final_state")


def test_mixed_dtypes_run_in_the_widest_and_return_vs_dtype():
    # fla's test_fused_recurrent passes fp32 q/k with fp16 v and beta; fla returns o in v's dtype.
    t, h0, _ = fla_inputs([5, 5], equal=True, H=1, HV=2, dtype=torch.float32, seed=30)
    t["v"], t["beta"] = t["v"].half(), t["beta"].half()
    for fn, T in ((fla.fused_recurrent_gated_delta_rule, 5), (fla.chunk_gated_delta_rule, 5)):
        o, ht = fn(**t, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        want_o, want_h = reference(t, h0, None)
        assert o.dtype == torch.float16
        assert_close(o, want_o, torch.float16, "o")
        assert_close(ht, want_h, torch.float32, "final_state")


@pytest.mark.parametrize("entry", ["chunk_kda", "fused_recurrent_kda"])
def test_kda_entry_points_with_fla_gate_forms(entry):
    # Precomputed per-channel gates, then fla's in-kernel forms: -exp(A_log) softplus(g + dt_bias)
    # with dt_bias [HV * K], and lower_bound sigmoid(exp(A_log) (g + dt_bias)); beta sigmoid x 2.
    fn = getattr(fla, entry)
    t, h0, cu = fla_inputs([1, 63, 66], kda=True, H=1, HV=2, K=60, V=64, dtype=torch.bfloat16, seed=33)
    o, ht = fn(**t, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    want_o, want_h = reference(t, h0, cu)
    assert_close(o, want_o, torch.bfloat16, "o")
    assert_close(ht, want_h, torch.bfloat16, "final_state")
    gen = torch.Generator().manual_seed(34)
    raw_g, raw_b = torch.randn(1, 130, 2, 60, generator=gen), torch.randn(1, 130, 2, generator=gen)
    a_log, dt_bias = torch.log(torch.tensor([0.7, 3.0])), torch.randn(2 * 60, generator=gen)
    x = raw_g + dt_bias.view(2, 60)
    for lower_bound, g in ((None, -a_log.exp().view(2, 1) * torch.nn.functional.softplus(x)),
                           (-5.0, -5.0 * torch.sigmoid(a_log.exp().view(2, 1) * x))):
        o, ht = fn(**{**t, "g": raw_g, "beta": raw_b}, initial_state=h0, output_final_state=True,
                   use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
                   lower_bound=lower_bound, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, cu_seqlens=cu)
        want_o, want_h = reference({**t, "g": g, "beta": 2 * torch.sigmoid(raw_b)}, h0, cu)
        assert_close(o, want_o, torch.bfloat16, "o")
        assert_close(ht, want_h, torch.bfloat16, "final_state")


@pytest.mark.parametrize("kda", [False, True])
def test_fused_recurrent_decode_computes_fla_gates_in_the_kernel(kda, monkeypatch):
    # T <= 8 rows with use_gate_in_kernel and use_beta_sigmoid_in_kernel: the raw g, beta, A_log and
    # dt_bias go to the decode kernel's fused-gate form (no torch pass), which equals fla's activations.
    from aotc import loader

    t, h0, _ = fla_inputs([3, 3], equal=True, kda=kda, H=1, HV=2, K=64, V=64, dtype=torch.bfloat16, seed=37)
    gen = torch.Generator().manual_seed(37)
    raw_g, raw_b = torch.randn(*t["g"].shape, generator=gen), torch.randn(2, 3, 2, generator=gen)
    a_log, dt_bias = torch.log(torch.tensor([0.7, 3.0])), torch.randn(2 * (64 if kda else 1), generator=gen)
    seen = []
    decode = loader.gated_delta_decode
    monkeypatch.setattr(loader, "gated_delta_decode", lambda *a, **kw: seen.append((a[3], kw)) or decode(*a, **kw))
    entry = fla.fused_recurrent_kda if kda else fla.fused_recurrent_gated_delta_rule
    o, ht = entry(**{**t, "g": raw_g, "beta": raw_b}, initial_state=h0, output_final_state=True,
                  use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
                  use_beta_sigmoid_in_kernel=True)
    g_arg, kw = seen[0]
    assert g_arg is None and kw["a"] is raw_g and kw["b"] is raw_b and kw["A_log"] is a_log
    x = raw_g + (dt_bias.view(2, 64) if kda else dt_bias)
    g = -(a_log.exp().view(2, 1) if kda else a_log.exp()) * torch.nn.functional.softplus(x)
    packed = {n: x.reshape(1, 6, *x.shape[2:]) for n, x in {**t, "g": g, "beta": torch.sigmoid(raw_b)}.items()}
    want_o, want_h = reference(packed, h0, torch.tensor([0, 3, 6]))
    assert_close(o.reshape(1, 6, 2, 64), want_o, torch.bfloat16, "o")
    assert_close(ht, want_h, torch.bfloat16, "final_state")


@pytest.mark.parametrize("entry", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_kda",
                                   "fused_recurrent_kda"])
def test_inputs_requiring_grad_get_outputs_whose_backward_raises(entry):
    t, h0, _ = fla_inputs([3, 3], equal=True, kda="kda" in entry, H=1, HV=2, dtype=torch.float32, seed=35)
    fn = getattr(fla, entry)
    want_o, want_h = fn(**t, initial_state=h0, output_final_state=True)
    assert want_o.grad_fn is None and not want_o.requires_grad
    leaf = {n: x.clone().requires_grad_() for n, x in t.items()}
    o, ht = fn(**leaf, initial_state=h0, output_final_state=True)
    # the forward is the same computation; the graph ends in a node that refuses to differentiate
    assert torch.equal(o, want_o) and torch.equal(ht, want_h)
    assert o.requires_grad and ht.requires_grad
    with pytest.raises(NotImplementedError, match="inference-only"):
        (o.sum() + ht.sum()).backward()
    assert all(x.grad is None for x in leaf.values())
    with torch.no_grad():
        o, _ = fn(**leaf, initial_state=h0)
    assert not o.requires_grad


@pytest.mark.parametrize("fused", [False, True])
def test_fused_recurrent_past_the_decode_grid_runs_chunked(fused, monkeypatch):
    # more sequences than the decode kernel's grid takes (65535; 2 here) go to the chunked prefill,
    # with fla's in-kernel gate and beta activations applied before it: the same answer
    from aotc import loader
    from aotc.compat import _fla_args

    monkeypatch.setattr(_fla_args, "DECODE_MAX_SEQS", 2)
    monkeypatch.setattr(loader, "gated_delta_decode", lambda *a, **kw: pytest.fail("decode kernel past its grid"))
    t, h0, _ = fla_inputs([2, 2, 2], equal=True, H=1, HV=2, K=64, V=64, dtype=torch.bfloat16, seed=41)
    kw, want_g, want_b = {}, t["g"], t["beta"]
    if fused:
        gen = torch.Generator().manual_seed(41)
        raw_g, raw_b = torch.randn(*t["g"].shape, generator=gen), torch.randn(*t["beta"].shape, generator=gen)
        a_log, dt_bias = torch.log(torch.tensor([0.7, 3.0])), torch.randn(2, generator=gen)
        kw = dict(use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)
        want_g = -a_log.exp() * torch.nn.functional.softplus(raw_g + dt_bias)
        want_b = torch.sigmoid(raw_b)
        t = {**t, "g": raw_g, "beta": raw_b}
    o, ht = fla.fused_recurrent_gated_delta_rule(**t, initial_state=h0, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True, **kw)
    want_o, want_h = reference({**t, "g": want_g, "beta": want_b}, h0, None)
    assert_close(o, want_o, torch.bfloat16, "o")
    assert_close(ht, want_h, torch.bfloat16, "final_state")
