"""Float32 torch reference of the gated delta rule (Gated DeltaNet and Kimi Delta Attention).

Written to be read, not to be fast: one sequence, one token, one value head at a time. The
recurrent state of a value head is h [V, K] ("V-major", K contiguous: the layout SGLang's state
pool uses); per token t:

    h  = h * exp(g_t)                 GDN: one log-gate a head; KDA: one a head and K channel (columns)
    v' = beta_t * (v_t - h k_t)
    h  = h + v' k_t^T
    o_t = scale * h q_t

Grouped value heads (GVA): value head hv reads query/key head hv // (HV // H).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

L2NORM_EPS = 1e-6  # as flash-linear-attention's l2norm: x / sqrt(sum(x^2) + eps)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def fused_gate(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor):
    """SGLang's fused-gate form: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).

    A_log [HV], dt_bias [HV] (GDN, a [.., HV]) or [HV, K] (KDA, a [.., HV, K]); b [.., HV].
    Returns float32 (g, beta).
    """
    a = a.float()
    decay = torch.exp(A_log.float())
    if a.dim() == b.dim() + 1:  # KDA: one gate a K channel
        decay = decay.view(-1, 1)
    g = -decay * F.softplus(a + dt_bias.float())  # softplus(beta=1, threshold=20), as SGLang
    return g, torch.sigmoid(b.float())


def gated_delta_reference(q, k, v, g, beta, state, state_indices, cu_seqlens=None, *, scale=None,
                          qk_l2norm=False, state_layout="vmajor"):
    """The gated delta rule over each sequence, starting from and returning pool states.

    q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV] (GDN) or [B, T, HV, K] (KDA), log-space,
    <= 0; beta [B, T, HV]. Without cu_seqlens, sequence b is row b; with it, B == 1 and sequence n
    is tokens cu_seqlens[n]:cu_seqlens[n+1]. state: the pool, [slots, HV, V, K] ("vmajor") or
    [slots, HV, K, V] ("kmajor"); sequence n starts from state[state_indices[n]] and ends there.
    An index < 0 is a padded sequence: its outputs are zeros and no state changes.
    Returns (out [B, T, HV, V] float32, new pool float32); the inputs are not modified.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    scale = K ** -0.5 if scale is None else scale
    pool = state.float().clone()
    if state_layout == "kmajor":
        pool = pool.transpose(-1, -2)  # a view: writes land in the K-major tensor
    out = torch.zeros(B, T, HV, V, dtype=torch.float32, device=q.device)
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        bounds = [int(x) for x in cu_seqlens]
        spans = [(0, bounds[n], bounds[n + 1]) for n in range(len(bounds) - 1)]
    for n, (row, start, end) in enumerate(spans):
        slot = int(state_indices[n])
        if slot < 0:
            continue
        for hv in range(HV):
            h = pool[slot, hv].clone()  # [V, K]
            for t in range(start, end):
                q_t = q[row, t, hv // group].float()
                k_t = k[row, t, hv // group].float()
                if qk_l2norm:
                    q_t, k_t = l2norm(q_t), l2norm(k_t)
                h = h * torch.exp(g[row, t, hv].float())  # scalar, or [K] scaling the columns
                v_new = beta[row, t, hv].float() * (v[row, t, hv].float() - h @ k_t)
                h = h + torch.outer(v_new, k_t)
                out[row, t, hv] = scale * (h @ q_t)
            pool[slot, hv] = h
    if state_layout == "kmajor":
        pool = pool.transpose(-1, -2)
    return out, pool
