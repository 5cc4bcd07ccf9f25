"""flash-linear-attention's gated delta rule entry points, with fla's signatures, on aotc's ops.

    from aotc.compat import fla
    o, ht = fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                       cu_seqlens=cu)

fla 0.6's conventions (fla/ops/gated_delta_rule/chunk.py and fused_recurrent.py, read through the
code index): q, k [B, T, H, K]; v [B, T, HV, V] with grouped value heads when HV > H (HV % H == 0);
g [B, T, HV] log-space decays; beta [B, T, HV]; scale default K ** -0.5; initial_state
[N, HV, K, V] ("K-major"; [N, HV, V, K] with chunk's state_v_first=True), N = B, or with
cu_seqlens (B must be 1) N = len(cu_seqlens) - 1; the result is (o [B, T, HV, V] in q's dtype,
final_state [N, HV, K, V] float32 or None when output_final_state is False). fla does not modify
initial_state (its kernels read h0 and write a new ht), so neither does this: the state is
copied into a float32 pool first (one copy of N states), the ops update that pool in place with
state_indices = arange(N), and the pool is the final state. fused_recurrent's gk [B, T, HV, K]
(per-channel decays, as Kimi Delta Attention) maps onto the ops' KDA gates; g and gk together add
in log space. use_qk_l2norm_in_kernel: x / sqrt(sum(x^2) + 1e-6), fla's l2norm.

Dispatch: fused_recurrent without cu_seqlens and with T <= 8 runs `loader.gated_delta_decode`
(the recurrent kernel); everything else runs `loader.gated_delta_prefill` (equal-length batches
are packed into [1, B * T] with cu_seqlens built on the device, no host sync). The ops' limits
apply (fp16/bf16 q/k/v; K in 64/128/256; V in 64/128/256 for prefill) and raise their
ValueError/TypeError.
Not implemented (NotImplementedError): gv (per-value-channel decays), beta [B, T, HV, V] (per
value channel), head_first=True, float32 q/k/v, backward (these functions are forward only, as
inference engines use them; the result carries no autograd graph).
"""
from __future__ import annotations

import torch

_DECODE_MAX_T = 8  # loader.gated_delta_decode's MAX_T (kernels/gated_delta/spec.py)


def _check(who, q, v, beta, head_first=False):
    if head_first:
        raise NotImplementedError(f"{who}: head_first=True ([B, H, T, ...] inputs) is not supported; pass "
                                  f"[B, T, H, ...] (fla deprecated head_first too)")
    for name, t in (("q", q), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dtype == torch.float32:
        raise NotImplementedError(f"{who}: float32 q/k/v are not supported (fp16 or bf16)")
    if q.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{who}: q [B, T, H, K] and v [B, T, HV, V] must be 4-D, got {tuple(q.shape)} and "
                         f"{tuple(v.shape)}")
    if isinstance(beta, torch.Tensor) and beta.dim() == 4:
        raise NotImplementedError(f"{who}: beta {tuple(beta.shape)} (one a value channel) is not supported; "
                                  f"beta must be [B, T, HV]")


def _initial_pool(who, initial_state, n, hv, k_dim, v_dim, v_first, device):
    """A float32 copy of initial_state (zeros when None): the pool the ops update in place."""
    inner = (v_dim, k_dim) if v_first else (k_dim, v_dim)
    want = (n, hv) + inner
    if initial_state is None:
        return torch.zeros(want, dtype=torch.float32, device=device)
    if not isinstance(initial_state, torch.Tensor):
        raise TypeError(f"{who}: initial_state must be a torch.Tensor or None, got {type(initial_state).__name__}")
    if tuple(initial_state.shape) != want:
        spelled = "[N, HV, V, K]" if v_first else "[N, HV, K, V]"
        raise ValueError(f"{who}: initial_state must be {spelled} = {list(want)} (N = "
                         f"{'len(cu_seqlens) - 1' if n else 'B'}), got {tuple(initial_state.shape)}")
    if initial_state.device != device:
        raise ValueError(f"{who}: initial_state must be on {device} (like q), got {initial_state.device}")
    return initial_state.to(torch.float32, copy=True)


def _run(who, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
         v_first, allow_decode):
    from aotc import loader

    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"{who}: the batch size must be 1 with cu_seqlens (packed sequences), got {B}")
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
            raise ValueError(f"{who}: cu_seqlens must be a 1-D tensor [N + 1]")
        n = cu_seqlens.shape[0] - 1
    else:
        n = B
    if beta is None:  # fla's default: no scaling of the delta
        beta = torch.ones(B, T, HV, dtype=torch.float32, device=dev)
    pool = _initial_pool(who, initial_state, n, HV, K, V, v_first, dev)
    layout = "vmajor" if v_first else "kmajor"
    slots = torch.arange(n, dtype=torch.int32, device=dev)
    if cu_seqlens is None and allow_decode and T <= _DECODE_MAX_T:
        o = loader.gated_delta_decode(q, k, v, g, beta, pool, slots, scale=scale, qk_l2norm=use_qk_l2norm_in_kernel,
                                      state_layout=layout)
    else:
        if cu_seqlens is None:  # B equal-length sequences, packed
            cu_seqlens = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=dev)
            q, k, v, g, beta = (t.reshape(1, B * T, *t.shape[2:]) for t in (q, k, v, g, beta))
        o = loader.gated_delta_prefill(q, k, v, g, beta, pool, slots, cu_seqlens, scale=scale,
                                       qk_l2norm=use_qk_l2norm_in_kernel, state_layout=layout)
        o = o.view(B, T, HV, V)
    return o, (pool if output_final_state else None)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    """fla's `fused_recurrent_gated_delta_rule`: returns (o, final_state or None); see the module docstring.

    g [B, T, HV] and/or gk [B, T, HV, K] (at least one); beta None means ones. Not implemented:
    gv, beta per value channel, float32 inputs.
    """
    who = "fused_recurrent_gated_delta_rule"
    _check(who, q, v, beta)
    if gv is not None:
        raise NotImplementedError(f"{who}: gv (per-value-channel decays [B, T, HV, V]) is not supported")
    if gk is not None:
        if not isinstance(gk, torch.Tensor) or gk.dim() != 4:
            raise ValueError(f"{who}: gk must be a [B, T, HV, K] tensor")
        gate = gk if g is None else gk.float() + g.float()[..., None]  # exp(g) exp(gk) = exp(g + gk)
    elif g is not None:
        gate = g
    else:
        raise ValueError(f"{who}: give g [B, T, HV] or gk [B, T, HV, K] (aotc has no ungated delta rule)")
    return _run(who, q, k, v, gate, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                cu_seqlens, False, True)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, head_first=False, state_v_first=False,
                           auto_cp=True, enable_fwd_cp_cache=True):
    """fla's `chunk_gated_delta_rule`: returns (o, final_state or None); see the module docstring.

    state_v_first=True: initial and final states [N, HV, V, K] (aotc's native V-major layout, no
    transpose anywhere). auto_cp and enable_fwd_cp_cache are fla's scheduling switches (context
    parallelism inside one GPU, a backward cache) and change no result: accepted and unused.
    Not implemented: head_first=True, beta per value channel, float32 inputs.
    """
    who = "chunk_gated_delta_rule"
    _check(who, q, v, beta, head_first)
    if g is None:
        raise ValueError(f"{who}: g [B, T, HV] is required")
    return _run(who, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                cu_seqlens, bool(state_v_first), False)
