"""flash-linear-attention's gated delta rule and KDA entry points, with fla's signatures, on aotc's ops.

    from aotc.compat import fla
    o, ht = fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                       cu_seqlens=cu)
    o, ht = fla.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                          use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)

fla-core 0.6.0's conventions (its fla/ops/gated_delta_rule and fla/ops/kda, read from its wheel):
q, k [B, T, H, K]; v [B, T, HV, V] with grouped value heads when HV > H (HV % H == 0); K, V any
size up to 256; fp16, bf16 or fp32 (fp32 runs in fp32; q/k/v of different dtypes run in the widest
of them); g [B, T, HV] (GDN) or [B, T, HV, K] (KDA: one decay a K channel), log space; beta [B, T,
HV]; scale default K ** -0.5; initial_state [N, HV, K, V] ([N, HV, V, K] with state_v_first=True),
N = B, or with cu_seqlens (B must be 1) N = len(cu_seqlens) - 1. Returns (o [B, T, HV, V] in v's
dtype, final_state float32 or None when output_final_state is False). fla does not modify
initial_state, so neither does this: the decode (below) reads a contiguous float32 initial_state
where it lies and writes the final state to a new tensor (fla's own traffic); otherwise the state
is copied into a float32 pool (one copy of N states), the ops update that pool in place with
state_indices = arange(N), and the pool is the final state. fused_recurrent's gk [B, T, HV, K] and g add in log space (KDA gates).
use_qk_l2norm_in_kernel: x / sqrt(sum(x^2) + 1e-6), fla's l2norm. fla's gate and beta activations
(use_gate_in_kernel with A_log, dt_bias and for KDA lower_bound; use_beta_sigmoid_in_kernel,
allow_neg_eigval) run inside the decode kernel where fused_recurrent takes that path with both on,
dt_bias given and neither lower_bound nor allow_neg_eigval (its fused-gate form is exactly
-exp(A_log) softplus(g + dt_bias), sigmoid(beta)); elsewhere they are applied here in float32
before the op (one elementwise pass each; the chunked prefill has no in-kernel gate yet).
Scheduling options (chunk_size, cu_seqlens_cpu, chunk_indices, safe_gate, disable_recompute,
use_graph, max_num_seqs) change no result and are accepted unused; chunk_size is checked as fla
checks it.

Dispatch: fused_recurrent without cu_seqlens, with T <= 8 and at most 65535 sequences (the decode
grid's limit) runs `loader.gated_delta_decode`;
everything else runs `loader.gated_delta_prefill` (equal-length batches are packed into
[1, B * T] with cu_seqlens built on the device, no host sync).

Autograd: aotc is inference-only. With grad mode on and an input that requires grad, the outputs
are attached to a node whose backward raises NotImplementedError (as fla's own fused_recurrent
does): a forward runs, a backward never returns a gradient that silently leaves those inputs out.
chunk_kda's return_intermediate_states (inference mode, as fla) returns (o, final_state, h), h the
state before every chunk in k's dtype: the prefill then runs one chunk of every sequence at a time
(_fla_chunk_states.py).
Not implemented (NotImplementedError): gv (per-value-channel decays), beta [B, T, HV, V], cp_context,
head_first (fla 0.6 removed it too). An unknown keyword raises TypeError (fla 0.6 ignores some
silently).
"""
from __future__ import annotations

import torch

from . import _fla_args as A


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                                     state_v_first=False, cu_seqlens=None, **kwargs):
    """fla's `fused_recurrent_gated_delta_rule`: returns (o, final_state or None); see the module docstring.

    g [B, T, HV] and/or gk [B, T, HV, K] (at least one); beta None means ones. Not implemented:
    gv, beta per value channel, cp_context.
    """
    who = "fused_recurrent_gated_delta_rule"
    A.check_qkv(who, q, k, v, beta)
    v_first = A.state_v_first_of(who, kwargs, state_v_first)
    A.reject_unsupported(who, kwargs)
    if gv is not None:
        raise NotImplementedError(f"{who}: gv (per-value-channel decays [B, T, HV, V]) is not supported")
    if gk is not None and (not isinstance(gk, torch.Tensor) or gk.dim() != 4):
        raise ValueError(f"{who}: gk must be a [B, T, HV, K] tensor")
    if g is None and gk is None:
        raise ValueError(f"{who}: give g [B, T, HV] or gk [B, T, HV, K] (aotc has no ungated delta rule)")

    return A.forward(who, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                     cu_seqlens=cu_seqlens, v_first=v_first, recurrent=True, use_gate_in_kernel=use_gate_in_kernel,
                     A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                     allow_neg_eigval=allow_neg_eigval, gk=gk)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, **kwargs):
    """fla's `chunk_gated_delta_rule`: returns (o, final_state or None); see the module docstring.

    state_v_first=True: initial and final states [N, HV, V, K] (aotc's native V-major layout, no
    transpose anywhere). kwargs as fla's: use_gate_in_kernel, A_log, dt_bias, chunk_size,
    transpose_state_layout. Not implemented: cp_context, head_first, beta per value channel.
    """
    who = "chunk_gated_delta_rule"
    A.check_qkv(who, q, k, v, beta)
    kwargs = dict(kwargs, cp_context=cp_context)
    v_first = A.state_v_first_of(who, kwargs, state_v_first)
    gate_in_kernel, A_log, dt_bias = (kwargs.pop("use_gate_in_kernel", False), kwargs.pop("A_log", None),
                                      kwargs.pop("dt_bias", None))
    A.reject_unsupported(who, kwargs)
    if g is None:
        raise ValueError(f"{who}: g [B, T, HV] is required")

    return A.forward(who, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                     cu_seqlens=cu_seqlens, v_first=v_first, recurrent=False, use_gate_in_kernel=gate_in_kernel,
                     A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                     allow_neg_eigval=allow_neg_eigval)


def _kda_gate_shape(who, g, q, v):
    if not isinstance(g, torch.Tensor):
        raise TypeError(f"{who}: g must be a torch.Tensor, got {type(g).__name__}")
    want = (*q.shape[:2], v.shape[2], q.shape[3])
    if tuple(g.shape) != want:
        raise ValueError(f"{who}: g must be [B, T, HV, K] = {list(want)} (one decay a K channel), got "
                         f"{tuple(g.shape)}")


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
    """fla's `chunk_kda` (Kimi Delta Attention, chunked): returns (o, final_state or None).

    g [B, T, HV, K] (log-space decays, or with use_gate_in_kernel the raw input of
    -exp(A_log) * softplus(g + dt_bias) / lower_bound * sigmoid(exp(A_log) * (g + dt_bias)), A_log
    [HV] and dt_bias [HV * K] as keywords); chunk_size 32 or 64 as fla. safe_gate checks
    lower_bound as fla does (in [-5, 0) with use_gate_in_kernel) and changes nothing else here.
    return_intermediate_states=True (under torch.inference_mode(), as fla): returns (o in q's dtype,
    final_state or None, h [B, NT, HV, K, V] in k's dtype, the state before each chunk of chunk_size
    tokens; [1, all sequences' chunks, ...] with cu_seqlens). Not implemented: cp_context.
    """
    who = "chunk_kda"
    A.check_qkv(who, q, k, v, beta)
    kwargs = dict(kwargs, cp_context=cp_context)
    v_first = A.state_v_first_of(who, kwargs, state_v_first)
    A_log, dt_bias = kwargs.pop("A_log", None), kwargs.pop("dt_bias", None)
    chunk_size = kwargs.get("chunk_size", 64)
    A.reject_unsupported(who, kwargs, chunk_sizes=(32, 64))
    if return_intermediate_states:  # fla's conditions (its asserts)
        if not torch.is_inference_mode_enabled():
            raise ValueError(f"{who}: return_intermediate_states is only allowed in inference mode (as fla)")
        if disable_recompute:
            raise ValueError(f"{who}: return_intermediate_states must be used with disable_recompute=False (as fla)")
    _kda_gate_shape(who, g, q, v)
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError(f"{who}: `lower_bound` must be specified when `safe_gate=True` and "
                             f"`use_gate_in_kernel=True` (as fla)")
        if not -5 <= lower_bound < 0:
            raise ValueError(f"{who}: `lower_bound` must be in the safe range [-5, 0), got {lower_bound} (as fla)")
    if initial_state is not None and isinstance(initial_state, torch.Tensor) and initial_state.dtype != torch.float32:
        raise TypeError(f"{who}: initial_state must be float32 (as fla), got {initial_state.dtype}")

    return _kda(who, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                cu_seqlens, v_first, False, use_gate_in_kernel, A_log, dt_bias, lower_bound,
                use_beta_sigmoid_in_kernel, allow_neg_eigval, chunk_size if return_intermediate_states else None)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                        state_v_first=False, cu_seqlens=None, **kwargs):
    """fla's `fused_recurrent_kda`: returns (o, final_state or None); the gate as chunk_kda's.
    Without cu_seqlens and with T <= 8 it runs the decode kernel, else the chunked prefill (the same
    recurrence)."""
    who = "fused_recurrent_kda"
    A.check_qkv(who, q, k, v, beta)
    v_first = A.state_v_first_of(who, kwargs, state_v_first)
    A.reject_unsupported(who, kwargs)
    _kda_gate_shape(who, g, q, v)

    return _kda(who, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                cu_seqlens, v_first, True, use_gate_in_kernel, A_log, dt_bias, lower_bound,
                use_beta_sigmoid_in_kernel, allow_neg_eigval)


def _kda(who, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
         v_first, recurrent, use_gate_in_kernel, A_log, dt_bias, lower_bound, use_beta_sigmoid_in_kernel,
         allow_neg_eigval, chunk_states=None):
    return A.forward(who, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                     cu_seqlens=cu_seqlens, v_first=v_first, recurrent=recurrent,
                     use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                     chunk_states=chunk_states)
