"""flash-linear-attention's gated delta rule entry points, with fla's signatures, on aotc's ops.

    from aotc.compat import fla
    o, ht = fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                       cu_seqlens=cu)

fla 0.6's conventions (fla-core 0.6.0's fla/ops/gated_delta_rule/chunk.py and fused_recurrent.py,
read from its wheel): q, k [B, T, H, K]; v [B, T, HV, V] with grouped value heads when HV > H (HV % H == 0);
g [B, T, HV] log-space decays; beta [B, T, HV]; scale default K ** -0.5; initial_state
[N, HV, K, V] ("K-major"; [N, HV, V, K] with state_v_first=True), N = B, or with
cu_seqlens (B must be 1) N = len(cu_seqlens) - 1; the result is (o [B, T, HV, V] in q's dtype,
final_state [N, HV, K, V] float32 or None when output_final_state is False). fla does not modify
initial_state (its kernels read h0 and write a new ht), so neither does this: the state is
copied into a float32 pool first (one copy of N states), the ops update that pool in place with
state_indices = arange(N), and the pool is the final state. fused_recurrent's gk [B, T, HV, K]
(per-channel decays, as Kimi Delta Attention) maps onto the ops' KDA gates; g and gk together add
in log space. use_qk_l2norm_in_kernel: x / sqrt(sum(x^2) + 1e-6), fla's l2norm. fla's in-kernel
activations are applied here, in float32, before the op (one elementwise pass each):
use_gate_in_kernel (g raw: g = -exp(A_log) * softplus(g + dt_bias)) and use_beta_sigmoid_in_kernel
(beta = sigmoid(beta), times 2 with allow_neg_eigval). fla's scheduling arguments (chunk_size,
cu_seqlens_cpu, chunk_indices) change no result and are accepted unused; the deprecated
transpose_state_layout is state_v_first, as in fla.

Dispatch: fused_recurrent without cu_seqlens and with T <= 8 runs `loader.gated_delta_decode`
(the recurrent kernel); everything else runs `loader.gated_delta_prefill` (equal-length batches
are packed into [1, B * T] with cu_seqlens built on the device, no host sync). The ops' limits
apply (fp16/bf16 q/k/v; K in 64/128/256; V in 64/128/256 for prefill) and raise their
ValueError/TypeError.
Not implemented (NotImplementedError): gv (per-value-channel decays), beta [B, T, HV, V] (per
value channel), cp_context (context parallelism), head_first (removed in fla 0.6 too), float32
q/k/v, backward (forward only, as inference engines use them; the result carries no autograd
graph). An unknown keyword raises TypeError (fla 0.6 ignores some silently).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._convert import guard_call

_DECODE_MAX_T = 8  # loader.gated_delta_decode's MAX_T (kernels/gated_delta/spec.py)


_SCHEDULING = ("chunk_size", "cu_seqlens_cpu", "chunk_indices")


def _options(who, kwargs, state_v_first):
    """fla's **kwargs: (state_v_first, use_gate_in_kernel, A_log, dt_bias); rejects what aotc lacks."""
    kwargs = dict(kwargs)
    if "head_first" in kwargs:
        raise NotImplementedError(f"{who}: head_first ([B, H, T, ...] inputs) is not supported (fla 0.6 removed "
                                  f"it as well); pass [B, T, H, ...]")
    if kwargs.get("cp_context") is not None:
        raise NotImplementedError(f"{who}: cp_context (context parallelism across devices) is not supported")
    kwargs.pop("cp_context", None)
    if "transpose_state_layout" in kwargs:  # fla's deprecated name for state_v_first
        if state_v_first:
            raise ValueError(f"{who}: pass state_v_first or the deprecated transpose_state_layout, not both")
        state_v_first = kwargs.pop("transpose_state_layout")
    cs = kwargs.get("chunk_size", 64)
    if cs not in (16, 32, 64):
        raise ValueError(f"{who}: chunk_size must be 16, 32 or 64 (as fla), got {cs}")
    for name in _SCHEDULING:
        kwargs.pop(name, None)
    gate = (kwargs.pop("use_gate_in_kernel", False), kwargs.pop("A_log", None), kwargs.pop("dt_bias", None))
    if kwargs:
        raise TypeError(f"{who}: unexpected keyword arguments {sorted(kwargs)}")
    return bool(state_v_first), gate


def _activations(who, g, beta, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval):
    """fla's in-kernel gate and beta activations, applied here in float32."""
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError(f"{who}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True (as in fla)")
    if use_gate_in_kernel:
        if A_log is None or g is None:
            raise ValueError(f"{who}: use_gate_in_kernel=True needs g (raw) and A_log [HV]")
        x = g.float() if dt_bias is None else g.float() + dt_bias.float()
        g = -A_log.float().exp() * F.softplus(x)  # A_log, dt_bias [HV] broadcast over [B, T, HV]
    if use_beta_sigmoid_in_kernel and beta is not None:
        beta = torch.sigmoid(beta.float()) * (2.0 if allow_neg_eigval else 1.0)
    return g, beta


def _check(who, q, k, v, beta):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dtype == torch.float32:
        raise NotImplementedError(f"{who}: float32 q/k/v are not supported (fp16 or bf16)")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{who}: q, k [B, T, H, K] and v [B, T, HV, V] must be 4-D, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[2] != k.shape[2] or v.shape[2] % q.shape[2]:
        raise ValueError(f"{who}: q and k need the same heads H and v a multiple HV of them, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
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
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                                     state_v_first=False, cu_seqlens=None, **kwargs):
    """fla's `fused_recurrent_gated_delta_rule`: returns (o, final_state or None); see the module docstring.

    g [B, T, HV] and/or gk [B, T, HV, K] (at least one); beta None means ones. Not implemented:
    gv, beta per value channel, cp_context, float32 inputs.
    """
    who = "fused_recurrent_gated_delta_rule"
    guard_call(who, {}, {"q": q, "k": k, "v": v, "g": g, "gk": gk, "gv": gv, "beta": beta,
                         "initial_state": initial_state, "A_log": A_log, "dt_bias": dt_bias})
    _check(who, q, k, v, beta)
    v_first, _ = _options(who, kwargs, state_v_first)
    if gv is not None:
        raise NotImplementedError(f"{who}: gv (per-value-channel decays [B, T, HV, V]) is not supported")
    g, beta = _activations(who, g, beta, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                           allow_neg_eigval)
    if gk is not None:
        if not isinstance(gk, torch.Tensor) or gk.dim() != 4:
            raise ValueError(f"{who}: gk must be a [B, T, HV, K] tensor")
        gate = gk if g is None else gk.float() + g.float()[..., None]  # exp(g) exp(gk) = exp(g + gk)
    elif g is not None:
        gate = g
    else:
        raise ValueError(f"{who}: give g [B, T, HV] or gk [B, T, HV, K] (aotc has no ungated delta rule)")
    return _run(who, q, k, v, gate, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                cu_seqlens, v_first, True)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, **kwargs):
    """fla's `chunk_gated_delta_rule`: returns (o, final_state or None); see the module docstring.

    state_v_first=True: initial and final states [N, HV, V, K] (aotc's native V-major layout, no
    transpose anywhere). kwargs as fla's: use_gate_in_kernel, A_log, dt_bias, chunk_size,
    transpose_state_layout. Not implemented: cp_context, head_first, beta per value channel,
    float32 inputs.
    """
    who = "chunk_gated_delta_rule"
    guard_call(who, {}, {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": initial_state,
                         "A_log": kwargs.get("A_log"), "dt_bias": kwargs.get("dt_bias")})
    _check(who, q, k, v, beta)
    v_first, gate = _options(who, dict(kwargs, cp_context=cp_context), state_v_first)
    if g is None:
        raise ValueError(f"{who}: g [B, T, HV] is required")
    g, beta = _activations(who, g, beta, *gate, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    return _run(who, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                cu_seqlens, v_first, False)
