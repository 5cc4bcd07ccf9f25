"""The float32 reference itself (both gated-delta ops test against it): a two-token example worked
by hand, the KDA gate scaling columns, GVA head mapping, the K-major pool as the V-major one
transposed, padded sequences, and varlen (cu_seqlens) equal to one row per sequence."""
import math

import torch

from aotc.kernels.gated_delta.reference import fused_gate, gated_delta_reference


def _one(q, k, v, g, beta, h0, **kw):
    """One sequence, one head: tensors [T, K] / [T, V] / [T] (or [T, K] for KDA g) and h0 [V, K]."""
    idx = torch.tensor([0], dtype=torch.int32)
    return gated_delta_reference(q[None, :, None], k[None, :, None], v[None, :, None], g[None, :, None],
                                 beta[None, :, None], h0[None, None], idx, scale=1.0, **kw)


def test_two_tokens_by_hand():
    # t0: h = 0; v' = v0; h = v0 k0^T = [[3, 0], [4, 0]]; o = h q0 = [3, 4].
    # t1: h *= 0.5 -> [[1.5, 0], [2, 0]]; h k1 = 0; v' = 0.5 * v1 = [0.5, 1];
    #     h += v' k1^T -> [[1.5, 0.5], [2, 1]]; o = h q1 = [2, 3].
    q = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    v = torch.tensor([[3.0, 4.0], [1.0, 2.0]])
    g = torch.tensor([0.0, math.log(0.5)])
    beta = torch.tensor([1.0, 0.5])
    out, pool = _one(q, k, v, g, beta, torch.zeros(2, 2))
    assert torch.allclose(out[0, :, 0], torch.tensor([[3.0, 4.0], [2.0, 3.0]]))
    assert torch.allclose(pool[0, 0], torch.tensor([[1.5, 0.5], [2.0, 1.0]]))


def test_kda_gate_scales_columns_and_l2norm():
    h0 = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    g = torch.tensor([[math.log(0.5), 0.0]])  # channel 0 halves, channel 1 keeps
    q = torch.tensor([[3.0, 4.0]])  # normalized: [0.6, 0.8]
    k = torch.tensor([[0.0, 2.0]])  # normalized: [0, 1]
    v = torch.tensor([[0.0, 0.0]])
    out, pool = _one(q, k, v, g, torch.tensor([1.0]), h0, qk_l2norm=True)
    # h = [[0.5, 2], [1.5, 4]]; h k = [2, 4]; v' = -[2, 4]; h += v' k^T -> [[0.5, 0], [1.5, 0]]
    assert torch.allclose(pool[0, 0], torch.tensor([[0.5, 0.0], [1.5, 0.0]]), atol=1e-5)
    assert torch.allclose(out[0, 0, 0], torch.tensor([0.3, 0.9]), atol=1e-5)


def test_fused_gate_formula():
    A_log, a, dt_bias, b = torch.tensor([0.5]), torch.tensor([[0.3]]), torch.tensor([-0.1]), torch.tensor([[2.0]])
    g, beta = fused_gate(A_log, a, dt_bias, b)
    assert torch.allclose(g, torch.tensor([[-math.exp(0.5) * math.log1p(math.exp(0.2))]]))
    assert torch.allclose(beta, torch.tensor([[1 / (1 + math.exp(-2.0))]]))
    g_kda, _ = fused_gate(A_log, a[..., None].expand(1, 1, 3), dt_bias[:, None].expand(1, 3), b)
    assert g_kda.shape == (1, 1, 3) and torch.allclose(g_kda, g[..., None].expand(1, 1, 3))


def _random(B=3, T=4, H=2, HV=4, K=8, V=6, slots=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -torch.rand(B, T, HV, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen)
    pool = torch.randn(slots, HV, V, K, generator=gen)
    idx = torch.tensor([4, -1, 1], dtype=torch.int32)
    return q, k, v, g, beta, pool, idx


def test_gva_layouts_padding_and_varlen_agree():
    q, k, v, g, beta, pool, idx = _random()
    out, new = gated_delta_reference(q, k, v, g, beta, pool, idx, qk_l2norm=True)
    # GVA: value heads 2h and 2h+1 read q/k head h; value head 1 alone == a one-head run.
    o1, p1 = gated_delta_reference(q[:, :, :1], k[:, :, :1], v[:, :, 1:2], g[:, :, 1:2], beta[:, :, 1:2],
                                   pool[:, 1:2], idx, qk_l2norm=True)
    assert torch.allclose(out[:, :, 1:2], o1) and torch.allclose(new[:, 1:2], p1)
    # K-major pool: the same states transposed.
    ok, nk = gated_delta_reference(q, k, v, g, beta, pool.transpose(-1, -2).contiguous(), idx, qk_l2norm=True,
                                   state_layout="kmajor")
    # (equal up to float32 summation order: the matmuls run on transposed views)
    assert torch.allclose(ok, out, atol=1e-6, rtol=1e-5) and torch.allclose(nk, new.transpose(-1, -2), atol=1e-6,
                                                                            rtol=1e-5)
    # Padded row: zeros, and only the named slots change.
    assert (out[1] == 0).all()
    changed = (new != pool).flatten(1).any(1).nonzero().flatten().tolist()
    assert changed == [1, 4]
    # Varlen: the rows packed into one sequence dimension with cu_seqlens.
    T = q.shape[1]
    cu = torch.tensor([0, T, 2 * T, 3 * T], dtype=torch.int32)
    packed = [x.reshape(1, -1, *x.shape[2:]) for x in (q, k, v, g, beta)]
    ov, nv = gated_delta_reference(*packed, pool, idx, cu, qk_l2norm=True)
    assert torch.allclose(ov.view_as(out), out, atol=1e-6, rtol=1e-5) and torch.allclose(nv, new, atol=1e-6, rtol=1e-5)
