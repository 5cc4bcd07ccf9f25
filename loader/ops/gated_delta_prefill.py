"""Chunked gated delta rule prefill over packed variable-length sequences, as `aotc::gated_delta_prefill`."""
from __future__ import annotations

import math

import torch

from aotc.kernels.gated_delta import chunk_spec as _spec

from . import library

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_GATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)
_LAYOUTS = ("vmajor", "kmajor")
_I32_MAX = 2 ** 31 - 1


def _need(cond: bool, name: str, expected: str, got) -> None:
    if not cond:
        raise ValueError(f"gated_delta_prefill: {name} must be {expected}, got {got}")


def _tensor(name, t, dtypes, ndim, device=None, last_contiguous=True):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"gated_delta_prefill: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"gated_delta_prefill: {name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    _need(t.dim() == ndim, name, f"{ndim}-D", f"shape {tuple(t.shape)}")
    if device is not None:
        _need(t.device == device, name, f"on {device} (like q)", t.device)
    if last_contiguous:
        _need(t.stride(-1) == 1 or t.shape[-1] == 1, name, "contiguous in its last dim", f"strides {t.stride()}")
    _need(all(0 <= s <= _I32_MAX for s in t.stride()), f"{name}'s strides", "in [0, 2**31)", t.stride())


def _validate(q, k, v, g, beta, state, state_indices, cu_seqlens, scale, state_layout, out):
    _tensor("q", q, tuple(_DTYPES), 4)
    dev = q.device
    _tensor("k", k, (q.dtype,), 4, dev)
    _tensor("v", v, (q.dtype,), 4, dev)
    one, T, H, K = q.shape
    _need(one == 1, "q.shape[0]", "1 (sequences are packed along dim 1; see cu_seqlens)", one)
    _need(K in _spec.HEAD_DIMS, "q.shape[3] (K)", f"one of {_spec.HEAD_DIMS}", K)
    _need(tuple(k.shape) == tuple(q.shape), "k", f"shaped like q {tuple(q.shape)}", tuple(k.shape))
    _need(v.shape[:2] == q.shape[:2], "v", f"[1, {T}, HV, V]", tuple(v.shape))
    HV, V = v.shape[2], v.shape[3]
    _need(V in _spec.HEAD_DIMS, "v.shape[3] (V)", f"one of {_spec.HEAD_DIMS}", V)
    _need(H > 0 and HV % H == 0, "v.shape[2] (HV)", f"a positive multiple of q's {H} heads", HV)
    if not isinstance(g, torch.Tensor):
        raise TypeError(f"gated_delta_prefill: g must be a torch.Tensor, got {type(g).__name__}")
    kda = g.dim() == 4
    _tensor("g", g, _GATE_DTYPES, 4 if kda else 3, dev, last_contiguous=kda)
    want_g = (1, T, HV, K) if kda else (1, T, HV)
    _need(tuple(g.shape) == want_g, "g", f"{list(want_g)} (log-gates: [1, T, HV] GDN or [1, T, HV, K] KDA)",
          tuple(g.shape))
    _tensor("beta", beta, _GATE_DTYPES, 3, dev, last_contiguous=False)
    _need(tuple(beta.shape) == (1, T, HV), "beta", f"[1, {T}, {HV}]", tuple(beta.shape))
    if state_layout not in _LAYOUTS:
        raise ValueError(f"gated_delta_prefill: state_layout must be one of {_LAYOUTS}, got {state_layout!r}")
    _tensor("state", state, (torch.float32,), 4, dev, last_contiguous=False)
    inner = (V, K) if state_layout == "vmajor" else (K, V)
    _need(tuple(state.shape[1:]) == (HV,) + inner, "state",
          f"[slots, {HV}, {inner[0]}, {inner[1]}] ({state_layout})", tuple(state.shape))
    _tensor("state_indices", state_indices, _INDEX_DTYPES, 1, dev, last_contiguous=False)
    _tensor("cu_seqlens", cu_seqlens, _INDEX_DTYPES, 1, dev, last_contiguous=False)
    N = state_indices.shape[0]
    _need(cu_seqlens.shape[0] == N + 1, "cu_seqlens", f"[N + 1] = [{N + 1}] (state_indices has {N} entries)",
          tuple(cu_seqlens.shape))
    if scale is not None:
        _need(isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale), "scale",
              "a finite float", scale)
    if out is not None:
        _tensor("out", out, (q.dtype,), 4, dev)
        _need(tuple(out.shape) == tuple(v.shape), "out", f"shaped like v {tuple(v.shape)}", tuple(out.shape))
        _need(not _overlaps(out, (q, k, v, state)), "out", "a tensor that shares no memory with q, k, v or state",
              "an overlapping tensor")
    _need(T < _I32_MAX // 2, "q.shape[1]", "below 2**30 tokens", T)


def _overlaps(a, others) -> bool:
    lo = a.data_ptr()
    hi = lo + a.untyped_storage().nbytes()
    for b in others:
        if b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr() or (
                b.data_ptr() < hi and lo < b.data_ptr() + b.numel() * b.element_size()):
            return True
    return False


def _check_values(T, state, state_indices, cu_seqlens):
    """Data checks on host copies (one device sync): offsets from 0 to T, non-decreasing; slots
    within the pool and no slot used twice (two sequences would race on it)."""
    cu = cu_seqlens.tolist()
    idx = state_indices.tolist()
    _need(cu[0] == 0, "cu_seqlens[0]", "0", cu[0])
    _need(all(a <= b for a, b in zip(cu, cu[1:])), "cu_seqlens", "non-decreasing", cu if len(cu) < 20 else "...")
    _need(cu[-1] == T, "cu_seqlens[-1]", f"q.shape[1] = {T}", cu[-1])
    slots = state.shape[0]
    bad = [i for i in idx if i >= slots]
    _need(not bad, "state_indices", f"< {slots} (the pool's slots; < 0 marks a padded sequence)", bad[:4])
    used = [i for i in idx if i >= 0]
    _need(len(set(used)) == len(used), "state_indices", "distinct for the sequences that are not padded",
          sorted(i for i in set(used) if used.count(i) > 1)[:4])


def launch_plan(q, k, v, g, beta, state, state_indices, cu_seqlens, out, scale, qk_l2norm, state_layout):
    """The two launches [(spec, axes, grid, args), ...] for validated arguments, with their
    workspace (the bench reuses it). cu_seqlens and state_indices are int32 here."""
    _, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = state_indices.shape[0]
    kda = g.dim() == 4
    dev, dt = q.device, q.dtype
    slots = T // _spec.CHUNK + N  # the device-side chunk schedule's bound (chunk.py)
    w = torch.empty(T, HV, K, dtype=dt, device=dev)
    u = torch.empty(T, HV, V, dtype=dt, device=dev)
    qg = torch.empty(T, HV, K, dtype=dt, device=dev)
    kg = torch.empty(T, HV, K, dtype=dt, device=dev)
    aqk = torch.empty(T, HV, _spec.CHUNK, dtype=dt, device=dev)
    decay = torch.empty(slots, HV, K, dtype=torch.float32, device=dev)
    name = _DTYPES[dt]
    prep = (_spec.GDN_CHUNK_PREP, _spec.prep_axes(name, K, V, kda), (slots, HV, 1), (
        q, k, v, g, beta, w, u, qg, kg, aqk, decay, cu_seqlens, state_indices,
        float(scale), int(qk_l2norm), N, HV, HV // H,
        q.stride(1), q.stride(2), k.stride(1), k.stride(2), v.stride(1), v.stride(2),
        g.stride(1), g.stride(2), beta.stride(1), beta.stride(2)))
    if state_layout == "vmajor":
        s_v, s_k = state.stride(2), state.stride(3)
    else:
        s_k, s_v = state.stride(2), state.stride(3)
    st = (_spec.GDN_CHUNK_STATE, _spec.state_axes(name, K, V), (N, HV, V // _spec.block_v(V)), (
        w, u, qg, kg, aqk, out, state, decay, cu_seqlens, state_indices, N, HV,
        out.stride(1), out.stride(2), state.stride(0), state.stride(1), s_v, s_k))
    return [prep, st]


def _prefill_op(q, k, v, g, beta, state, state_indices, cu_seqlens, out, scale, qk_l2norm, state_layout,
                validate) -> None:
    from aotc.loader.dispatch import run_kernel

    if validate:
        _check_values(q.shape[1], state, state_indices, cu_seqlens)
    if state_indices.shape[0] == 0 or q.shape[1] == 0:
        return
    for spec, axes, grid, args in launch_plan(q, k, v, g, beta, state, state_indices, cu_seqlens, out, scale,
                                              qk_l2norm, state_layout):
        run_kernel(spec, axes, grid, args)


def _prefill_fake(q, k, v, g, beta, state, state_indices, cu_seqlens, out, scale, qk_l2norm, state_layout,
                  validate) -> None:
    return None  # the public function validated every argument before calling the op


library.define("gated_delta_prefill(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor(a!) state, "
               "Tensor state_indices, Tensor cu_seqlens, Tensor(b!) out, float scale, bool qk_l2norm, "
               "str state_layout, bool validate) -> ()", _prefill_op, _prefill_fake)


def gated_delta_prefill(q, k, v, g, beta, state, state_indices, cu_seqlens, *, scale=None, qk_l2norm=False,
                        state_layout="vmajor", out=None, validate=None) -> torch.Tensor:
    """Gated DeltaNet / KDA prefill of packed sequences, chunked (64 tokens, WY form), from and into a state pool.

    Per value head and token: h *= exp(g); v' = beta (v - h k); h += v' k^T; o = scale h q
    (h [V, K]; see kernels/gated_delta/reference.py). Shapes (T packed tokens, N sequences):
      q, k `[1, T, H, K]`, v `[1, T, HV, V]`: fp16 or bf16, last dim contiguous, HV a multiple of H
        (value head hv reads q/k head hv // (HV // H)); K, V in (64, 128, 256).
      g: log-gates (<= 0), `[1, T, HV]` (GDN) or `[1, T, HV, K]` (KDA: one a K channel, last dim
        contiguous); beta `[1, T, HV]`. float32, or fp16/bf16 (converted to float32 first).
      state: float32 pool, `[slots, HV, V, K]` for state_layout="vmajor" (default) or
        `[slots, HV, K, V]` for "kmajor"; any strides. Sequence n starts from
        state[state_indices[n]] and its final state is written there, in place. An index < 0
        marks a padded sequence: its outputs are zeros and no state is read or written.
      state_indices `[N]`, cu_seqlens `[N + 1]`: int32 or int64 (int64 is converted to int32);
        sequence n is tokens cu_seqlens[n]:cu_seqlens[n+1]. Chunks never cross sequences.
    Options: scale (default K ** -0.5); qk_l2norm: q and k divided by sqrt(sum(x^2) + 1e-6) in
      the kernel; out `[1, T, HV, V]` (q's dtype, last dim contiguous), allocated when None.
      validate: copy cu_seqlens and state_indices to the host and check them (cu_seqlens from 0
      to T, non-decreasing; indices below the pool's slots, no slot twice): one device sync.
      Default on, except under CUDA-graph capture and torch.compile. The kernels themselves find
      each chunk's sequence on the device, so no lengths are read on the host otherwise.
    Workspace: W, U, q exp(G), k exp(G_last - G) `[T, HV, K or V]` and the chunk's attention
      `[T, HV, 64]` in q's dtype, allocated per call (torch's caching allocator).
    Returns out. Raises TypeError for a wrong type or dtype and ValueError for a wrong shape,
    stride, device, option or (when validated) value, naming the argument, before any launch.
    """
    _validate(q, k, v, g, beta, state, state_indices, cu_seqlens, scale, state_layout, out)
    if out is None:
        out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    g = g if g.dtype == torch.float32 else g.float()
    beta = beta if beta.dtype == torch.float32 else beta.float()
    state_indices = state_indices if state_indices.dtype == torch.int32 else state_indices.to(torch.int32)
    cu_seqlens = cu_seqlens if cu_seqlens.dtype == torch.int32 else cu_seqlens.to(torch.int32)
    if validate is None:
        validate = not (torch.compiler.is_compiling()
                        or (q.is_cuda and torch.cuda.is_current_stream_capturing()))
    sc = q.shape[3] ** -0.5 if scale is None else float(scale)
    torch.ops.aotc.gated_delta_prefill(q, k, v, g, beta, state, state_indices, cu_seqlens, out, sc,
                                       bool(qk_l2norm), state_layout, bool(validate))
    return out
