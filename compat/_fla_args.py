"""What aotc.compat.fla's four entry points share: fla 0.6's keyword handling, its gate and beta
activations, the checks, the forward on aotc's ops and the autograd guard.

Facts from fla-core 0.6.0 (fla/ops/gated_delta_rule/*.py and fla/ops/kda/*.py, read from its
wheel): o has v's dtype; the final state is float32, [N, HV, K, V] or [N, HV, V, K] with
state_v_first; initial_state is left unmodified; `transpose_state_layout` is the deprecated name of
state_v_first (a DeprecationWarning, a ValueError when both are given); the gate activations are
-exp(A_log) * softplus(g + dt_bias) and, for KDA with lower_bound set,
lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) (A_log may then be None: no exp factor); beta's
is sigmoid(beta), times 2 with allow_neg_eigval. fla's fused_recurrent has no backward either:
its autograd node raises NotImplementedError when differentiated.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

DECODE_MAX_T = 8  # loader.gated_delta_decode's MAX_T (kernels/gated_delta/spec.py)
DECODE_MAX_SEQS = 65535  # loader.gated_delta_decode's grid takes sequences on its third axis; more run chunked
SCHEDULING = ("chunk_size", "cu_seqlens_cpu", "chunk_indices", "use_graph", "max_num_seqs", "disable_recompute",
              "safe_gate")  # fla's scheduling and memory options: no effect on a forward result


def state_v_first_of(who, kwargs, state_v_first) -> bool:
    """fla's deprecated `transpose_state_layout` keyword, popped from kwargs, as fla treats it."""
    if "transpose_state_layout" not in kwargs:
        return bool(state_v_first)
    if state_v_first:
        raise ValueError(f"{who}: pass state_v_first or the deprecated transpose_state_layout, not both (as fla)")
    warnings.warn(f"{who}: `transpose_state_layout` is deprecated and renamed to `state_v_first` (as in fla)",
                  DeprecationWarning, stacklevel=3)
    return bool(kwargs.pop("transpose_state_layout"))


def reject_unsupported(who, kwargs, chunk_sizes=(16, 32, 64)) -> None:
    """Pops fla's scheduling keywords (checked as fla checks them) and raises for the rest."""
    if "head_first" in kwargs:
        raise NotImplementedError(f"{who}: head_first ([B, H, T, ...] inputs) is not supported (fla 0.6 removed "
                                  f"it as well); pass [B, T, H, ...]")
    if kwargs.pop("cp_context", None) is not None:
        raise NotImplementedError(f"{who}: cp_context (context parallelism across devices) is not supported")
    cs = kwargs.get("chunk_size", 64)
    if cs not in chunk_sizes:
        raise ValueError(f"{who}: `chunk_size` must be either {' or '.join(map(str, chunk_sizes))} (as fla), got {cs}")
    for name in SCHEDULING:
        kwargs.pop(name, None)
    if kwargs:
        raise TypeError(f"{who}: unexpected keyword arguments {sorted(kwargs)}")


def gate_activation(who, g, use_gate_in_kernel, A_log, dt_bias, lower_bound=None):
    """fla's in-kernel gate, in float32: g raw -> log-space decay. dt_bias [HV] (GDN) or [HV * K]
    (KDA, viewed [HV, K]); A_log [HV]."""
    if not use_gate_in_kernel:
        return g
    if g is None:
        raise ValueError(f"{who}: use_gate_in_kernel=True needs g (the raw gate input)")
    if A_log is None and lower_bound is None:
        raise ValueError(f"{who}: `A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is not "
                         f"set (as fla)")
    x = g.float()
    hv = x.shape[2]
    kda = x.dim() == 4
    if dt_bias is not None:
        x = x + (dt_bias.float().view(hv, -1) if kda else dt_bias.float())
    a = None if A_log is None else A_log.float().exp().view((hv, 1) if kda else (hv,))
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(x if a is None else a * x)
    return -a * F.softplus(x)


def beta_activation(who, beta, use_beta_sigmoid_in_kernel, allow_neg_eigval):
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError(f"{who}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True (as in fla)")
    if use_beta_sigmoid_in_kernel and beta is not None:
        return torch.sigmoid(beta.float()) * (2.0 if allow_neg_eigval else 1.0)
    return beta


def check_qkv(who, q, k, v, beta):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{who}: q, k [B, T, H, K] and v [B, T, HV, V] must be 4-D, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[2] != k.shape[2] or v.shape[2] % q.shape[2]:
        raise ValueError(f"{who}: q and k need the same heads H and v a multiple HV of them, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if isinstance(beta, torch.Tensor) and beta.dim() == 4:
        raise NotImplementedError(f"{who}: beta {tuple(beta.shape)} (one a value channel) is not supported; "
                                  f"beta must be [B, T, HV]")


def _initial_pool(who, initial_state, n, hv, k_dim, v_dim, v_first, device, copy=True):
    """A float32 copy of initial_state (zeros when None): the pool the ops update in place
    (copy=False: initial_state itself, checked)."""
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
    if not copy:
        return initial_state.detach()
    # contiguous whatever initial_state's strides (the ops read rows with a unit last stride)
    return torch.empty(want, dtype=torch.float32, device=device).copy_(initial_state.detach())


def _decode_states(who, initial_state, n, hv, k_dim, v_dim, v_first, device):
    """(the state the decode reads, the tensor it writes or None for in place): a contiguous
    float32 initial_state is read as it is and the final state goes to a new tensor (fla's
    h0 -> ht, no copy); otherwise a float32 copy (_initial_pool) is updated in place."""
    t = initial_state
    if (isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device == device and t.dim() == 4
            and t.shape[0] == n and t.is_contiguous()):
        pool = _initial_pool(who, t, n, hv, k_dim, v_dim, v_first, device, copy=False)  # the shape check
        return pool, torch.empty_like(pool)
    return _initial_pool(who, initial_state, n, hv, k_dim, v_dim, v_first, device), None


def _common_dtype(q, k, v):
    """q/k/v in one dtype for the ops (fla reads each in its own): the widest of the three, so a
    mixed call (fla's tests pass fp32 q/k with fp16 v) loses nothing; widening is exact."""
    dt = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    return tuple(t if t.dtype == dt else t.to(dt) for t in (q, k, v))


def forward(who, q, k, v, g, beta, *, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
            v_first, recurrent, use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None,
            use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, gk=None, chunk_states=None):
    """An entry point's forward, checked arguments in: the gate and beta activations, the ops, the
    autograd guard (`guarded`). `recurrent`: fused_recurrent's (decode kernel for T <= 8 without
    cu_seqlens, where fla's in-kernel gate and beta sigmoid run inside it too); gk adds to g in log
    space (exp(g) exp(gk) = exp(g + gk)); chunk_states: a chunk size, for fla's
    return_intermediate_states (returns (o, final state or None, h); _fla_chunk_states.py)."""
    def compute():
        decode = recurrent and cu_seqlens is None and q.shape[1] <= DECODE_MAX_T and q.shape[0] <= DECODE_MAX_SEQS
        if (decode and use_gate_in_kernel and use_beta_sigmoid_in_kernel and not allow_neg_eigval and gk is None
                and lower_bound is None and A_log is not None and dt_bias is not None and beta is not None):
            # the decode kernel's fused-gate form is fla's: -exp(A_log) softplus(g + dt_bias), sigmoid(beta)
            fused = {"A_log": A_log, "a": g, "b": beta,
                     "dt_bias": dt_bias.view(v.shape[2], -1) if g.dim() == 4 else dt_bias}
            return run(who, q, k, v, None, None, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                       cu_seqlens, v_first, True, fused)
        gate = gate_activation(who, g, use_gate_in_kernel, A_log, dt_bias, lower_bound)
        b = beta_activation(who, beta, use_beta_sigmoid_in_kernel, allow_neg_eigval)
        if gk is not None:
            gate = gk if gate is None else gk.float() + gate.float()[..., None]
        return run(who, q, k, v, gate, b, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                   cu_seqlens, v_first, recurrent, chunk_states=chunk_states)

    return guarded(who, compute, dict(q=q, k=k, v=v, g=g, gk=gk, beta=beta, initial_state=initial_state,
                                      A_log=A_log, dt_bias=dt_bias))


def run(who, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
        v_first, allow_decode, fused=None, chunk_states=None):
    """(o in v's dtype, final state or None) from aotc's ops; g [B, T, HV] (GDN) or [B, T, HV, K];
    `fused`: the decode kernel's fused-gate keywords (A_log, a, dt_bias, b) in place of g and beta;
    `chunk_states` (a chunk size): (o in q's dtype, final state or None, h), as fla's
    return_intermediate_states (_fla_chunk_states.py)."""
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
    if beta is None and fused is None:  # fla's default: no scaling of the delta
        beta = torch.ones(B, T, HV, dtype=torch.float32, device=dev)
    out_dtype = q.dtype if chunk_states else v.dtype
    h_dtype = k.dtype  # fla's h: k.new_empty(...)
    q, k, v = _common_dtype(q, k, v)
    layout = "vmajor" if v_first else "kmajor"
    if cu_seqlens is None and allow_decode and T <= DECODE_MAX_T and B <= DECODE_MAX_SEQS:
        # fla's own traffic: initial_state read where it lies, the final state written to a new tensor
        h0, final = _decode_states(who, initial_state, n, HV, K, V, v_first, dev)
        o = loader.gated_delta_decode(q, k, v, g, beta, h0, None, scale=scale, qk_l2norm=use_qk_l2norm_in_kernel,
                                      state_layout=layout, final_state=final, **(fused or {}))
        if o.dtype != out_dtype:
            o = o.to(out_dtype)
        return o, ((h0 if final is None else final) if output_final_state else None)
    pool = _initial_pool(who, initial_state, n, HV, K, V, v_first, dev)
    slots = torch.arange(n, dtype=torch.int32, device=dev)
    rows = B if cu_seqlens is None else 1  # h's batch dim: fla's B, or 1 with cu_seqlens
    if cu_seqlens is None:  # B equal-length sequences, packed
        cu_seqlens = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=dev)
        q, k, v, g, beta = (t.reshape(1, B * T, *t.shape[2:]) for t in (q, k, v, g, beta))
    if chunk_states:
        from ._fla_chunk_states import run_by_chunk

        o, h = run_by_chunk(q, k, v, g, beta, pool, cu_seqlens, chunk_states, h_dtype, scale=scale,
                            qk_l2norm=use_qk_l2norm_in_kernel, layout=layout)
        return o.view(B, T, HV, V).to(out_dtype), (pool if output_final_state else None), \
            h.view(rows, -1, *h.shape[1:])
    o = loader.gated_delta_prefill(q, k, v, g, beta, pool, slots, cu_seqlens, scale=scale,
                                   qk_l2norm=use_qk_l2norm_in_kernel, state_layout=layout)
    o = o.view(B, T, HV, V)
    if o.dtype != out_dtype:
        o = o.to(out_dtype)
    return o, (pool if output_final_state else None)


class _NoBackward(torch.autograd.Function):
    """Passes the forward's outputs through; differentiating them raises (fla's fused_recurrent does
    the same): a caller's graph never silently loses these inputs' gradients."""

    @staticmethod
    def forward(ctx, who, outs, names, *inputs):
        ctx.who, ctx.names = who, names
        return tuple(o.detach() for o in outs)

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(f"{ctx.who}: aotc is inference-only (forward kernels, no backward): the gradient "
                                  f"of {', '.join(ctx.names)} cannot be computed; fla's own op (or no_grad / "
                                  f"inference_mode, or detached inputs) is the way to run this")


def guarded(who, compute, inputs: dict):
    """Runs compute() (-> (o, final_state or None)) without building a graph; when grad mode is on
    and an input requires grad, the outputs come back attached to a node whose backward raises
    NotImplementedError (forward-only use, e.g. fla's tests with requires_grad inputs that never
    differentiate, keeps working)."""
    live = {n: t for n, t in inputs.items() if isinstance(t, torch.Tensor) and t.requires_grad}
    if not torch.is_grad_enabled() or not live:
        return compute()
    with torch.no_grad():
        o, ht = compute()
    outs = (o,) if ht is None else (o, ht)
    res = _NoBackward.apply(who, outs, tuple(live), *live.values())
    return res[0], (res[1] if ht is not None else None)
