"""Chunked gated delta rule prefill over packed variable-length sequences, declared once as
`GDN_PREFILL` (library.Op: the `aotc::gated_delta_prefill` op). Rules (`_validate`, with
gated_delta_rules.py's `check_*`), plan (`launch_plan`: the chunk kernels' grids and arguments),
launch (`run_kernel`, through the general `launch.Launch` path: each call's lengths differ).
Unvalidated eager calls keep their checked metadata (`_recent`: one C call matches every
argument, the overlap test runs on addresses) and go straight to the launches."""
from __future__ import annotations

import os

import torch

from aotc.kernels.gated_delta import chunk_spec as _spec
from aotc.kernels.gated_delta import state_ws_spec as _ws

from ..sm_count import cuda_sm_count
from . import guards, library, rules
from .gated_delta_rules import (QKV_DTYPES, check_gates, check_out, check_qkv, check_scale, check_state,
                                check_state_index_values, check_state_indices)
from .value_checks import skip_value_checks

OP = "gated_delta_prefill"
_INDEX_DTYPES = (torch.int32, torch.int64)


def _validate(q, k, v, g, beta, state, state_indices, cu_seqlens, scale, state_layout, out):
    """Every check that needs no tensor values (the decode op's shared checks plus the varlen
    ones); returns the scale. state_indices and cu_seqlens may still be int64 here."""
    reads = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "state_indices": state_indices, "cu_seqlens": cu_seqlens}
    guards.refuse_grad(OP, **reads, state=state, out=out)
    d = check_qkv(q, k, v, OP, max_k=_spec.MAX_HEAD, max_v=_spec.MAX_HEAD, min_t=0)  # T = 0: an empty batch, a no-op
    dev = q.device
    if d.B != 1:
        rules.fail(OP, "q.shape[0]", "1 (sequences are packed along dim 1; cu_seqlens says where each starts)", d.B)
    check_gates(g, beta, d, dev, OP)
    check_state(state, state_layout, d, dev, OP)
    rules.tensor(OP, "state_indices", state_indices, _INDEX_DTYPES, 1, dev, int32_strides=True)
    rules.tensor(OP, "cu_seqlens", cu_seqlens, _INDEX_DTYPES, 1, dev, int32_strides=True)
    n = state_indices.shape[0]
    if cu_seqlens.shape[0] != n + 1:
        rules.fail(OP, "cu_seqlens", f"[N + 1] = [{n + 1}] (state_indices names N = {n} sequences)", tuple(cu_seqlens.shape))
    if out is not None:
        check_out(out, tuple(v.shape), q.dtype, dev, OP)
    guards.check_outputs(OP, {"out": out, "state": state}, reads)
    if d.T >= 2 ** 30:
        rules.fail(OP, "q.shape[1] (T)", "below 2**30 tokens", d.T)
    programs = (d.T // _spec.CHUNK + n) * v.shape[2]  # launch_plan's flat grid (every precompute kernel's)
    if programs >= 2 ** 31:
        rules.fail(OP, "q.shape[1] (T)", "(T // 64 + N) * HV below 2**31 (the precompute's grid)", programs)
    return check_scale(scale, d.K, OP)


def _check_values(T, state, state_indices, cu_seqlens):
    """Data checks on host copies (one device sync): cu_seqlens from 0 to T, non-decreasing;
    slots below the pool's size and none twice (two sequences would race on it)."""
    cu = cu_seqlens.tolist()
    if cu[0] != 0:
        rules.fail(OP, "cu_seqlens[0]", "0", cu[0])
    drops = [i for i in range(len(cu) - 1) if cu[i + 1] < cu[i]]
    if drops:
        i = drops[0]
        rules.fail(OP, "cu_seqlens", "non-decreasing", f"cu_seqlens[{i}] = {cu[i]} > cu_seqlens[{i + 1}] = {cu[i + 1]}")
    if cu[-1] != T:
        rules.fail(OP, "cu_seqlens[-1]", f"q.shape[1] = {T} (every packed token belongs to a sequence)", cu[-1])
    check_state_index_values(state_indices, state.shape[0], OP)


# SMs assumed off CUDA (the interpreter): an H100's, so a CPU run picks the BV an H100 would.
INTERPRETER_SMS = 132


def sm_count(device) -> int:
    """Multiprocessors of a CUDA device (loader/sm_count.py); INTERPRETER_SMS for any other device."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    return cuda_sm_count(device)


def launch_plan(q, k, v, g, beta, state, state_indices, cu_seqlens, out, scale, qk_l2norm, state_layout,
                bv=None, ws=None):
    """The launches [(spec, axes, grid, args), ...] for validated arguments (the precompute: one
    kernel for GDN, three for KDA; then the state pass), with their
    workspace (`ws`, workspace()'s tuple: a plan's own; None: allocated). cu_seqlens and
    state_indices are int32 here. `bv`: the state
    pass's value tile, by default chunk_spec.state_block_v of the shapes and q's device's SMs (no
    length: one CUDA graph serves every length); one of chunk_spec.state_block_vs(K, V)."""
    _, T, H, K_dim = q.shape
    HV, V_dim = v.shape[2], v.shape[3]
    K, V = _spec.head_tile(K_dim), _spec.head_tile(V_dim)  # the tiles; workspaces are tile-wide
    N = state_indices.shape[0]
    name = QKV_DTYPES[q.dtype]
    if bv is None:
        bv = _spec.state_block_v(N, HV, K, V, sm_count(q.device), name)
    kda = g.dim() == 4
    slots = T // _spec.CHUNK + N  # the device-side chunk schedule's bound (chunk.py)
    subblocks = _spec.prep_subblocks(name, K, kda)
    w, u, qg, fq, kg, aqk, decay, akk = workspace(q, v, N, kda) if ws is None else ws
    if kda:  # three precompute kernels (kda_chunk.py): A's diagonal blocks, those below, the inverse and W/U
        common = (cu_seqlens, state_indices, float(scale), int(qk_l2norm), N, state.shape[0], HV, HV // H, K_dim,
                  q.stride(1), q.stride(2), k.stride(1), k.stride(2), g.stride(1), g.stride(2), beta.stride(1),
                  beta.stride(2))
        a_axes = _spec.kda_a_axes(name, K)
        pre = [(_spec.KDA_CHUNK_INTRA, a_axes, (slots * HV, 1, 1), (q, k, g, beta, aqk, akk) + common),
               (_spec.KDA_CHUNK_INTER, a_axes, (slots * HV, 1, 1),
                (q, k, g, beta, w, qg, fq, kg, aqk, akk, decay) + common),
               (_spec.KDA_CHUNK_WY, _spec.kda_wy_axes(name, K, V), (slots * HV, 1, 1), (
                   akk, v, beta, w, u, cu_seqlens, state_indices, N, state.shape[0], HV, K_dim, V_dim,
                   v.stride(1), v.stride(2), beta.stride(1), beta.stride(2)))]
    else:
        pre = [(_spec.GDN_CHUNK_PREP, _spec.prep_axes(name, K, V, kda), (slots * HV, 1, 1), (
            q, k, v, g, beta, w, u, qg, fq, kg, aqk, decay, cu_seqlens, state_indices,
            float(scale), int(qk_l2norm), N, state.shape[0], HV, HV // H, K_dim, V_dim,
            q.stride(1), q.stride(2), k.stride(1), k.stride(2), v.stride(1), v.stride(2),
            g.stride(1), g.stride(2), beta.stride(1), beta.stride(2)))]
    if subblocks:
        qs, group, s_qt, s_qh = qg, 1, qg.stride(0), qg.stride(1)
    else:
        qs, group, s_qt, s_qh = q, HV // H, q.stride(1), q.stride(2)
    if state_layout == "vmajor":
        s_v, s_k = state.stride(2), state.stride(3)
    else:
        s_k, s_v = state.stride(2), state.stride(3)
    st_args = (w, u, qs, fq, kg, aqk, out, state, decay, cu_seqlens, state_indices, N, state.shape[0], HV, group,
               K_dim, V_dim, s_qt, s_qh, out.stride(1), out.stride(2), state.stride(0), state.stride(1), s_v, s_k)
    saxes = _spec.state_axes(name, K, V, bv)
    st = (_state_spec(st_args, saxes), saxes, (N, HV, V // bv), st_args)
    return [*pre, st]


def workspace(q, v, N: int, kda: bool):
    """The chunk kernels' workspaces for one call (torch's caching allocator): W, U, Qg, q's row
    factors, k's gated copy, the chunks' attention, the decays, and for KDA A (fp32 [T, HV, 64]:
    kda_chunk_intra / kda_chunk_inter write it, kda_chunk_wy inverts it; None for GDN)."""
    _, T, _, K_dim = q.shape
    HV, V_dim = v.shape[2], v.shape[3]
    K, V = _spec.head_tile(K_dim), _spec.head_tile(V_dim)
    dev, dt = q.device, q.dtype
    w = torch.empty(T, HV, K, dtype=dt, device=dev)
    u = torch.empty(T, HV, V, dtype=dt, device=dev)
    # q's rows for the state pass: the sub-block precompute's gated copy Qg (KDA); else q itself (w,
    # aligned like every workspace, stands in for the Qg the precompute never touches then), both
    # scaled by fq.
    qg = torch.empty(T, HV, K, dtype=dt, device=dev) if _spec.prep_subblocks(QKV_DTYPES[dt], K, kda) else w
    fq = torch.empty(T, HV, dtype=torch.float32, device=dev)
    kg = torch.empty(T, HV, K, dtype=dt, device=dev)
    aqk = torch.empty(T, HV, _spec.CHUNK, dtype=dt, device=dev)
    decay = torch.empty(T // _spec.CHUNK + N, HV, K, dtype=torch.float32, device=dev)
    akk = torch.empty(T, HV, _spec.CHUNK, dtype=torch.float32, device=dev) if kda else None
    return w, u, qg, fq, kg, aqk, decay, akk


def _state_spec(args, axes):
    """The state pass's spec for these arguments: where they meet the ALIGNED assumptions, the
    Gluon kernel on sm90 or GDN_CHUNK_STATE (aligned_state_spec); else GDN_CHUNK_STATE_GENERIC (its
    own launch config: chunk_spec.state_launch_generic)."""
    from aotc.loader.dispatch import check_assumptions

    spec = _spec.GDN_CHUNK_STATE
    values = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
    if check_assumptions(spec, spec.divisible_args("aligned"), values) is not None:
        return _spec.GDN_CHUNK_STATE_GENERIC
    return aligned_state_spec(axes, args[0])


def aligned_state_spec(axes, first):
    """The ALIGNED state pass for a call whose first workspace is `first`: the warp-specialized
    Gluon kernel (state_ws_spec.GDN_CHUNK_STATE_WS, the same arguments and grid) where
    state_ws_spec.ws_serves says so (an sm90 GPU, 16-bit, K = V tiles <= 128), else the Triton
    GDN_CHUNK_STATE. Artifacts built without the Gluon kernel keep the Triton kernel's binary rather
    than a JIT fallback of the Gluon one; AOTC_GDN_STATE_WS=0 switches it off."""
    if not (getattr(first, "is_cuda", False) and _ws.ws_variant(axes)) or os.environ.get(_ws.ENV_WS, "1") == "0":
        return _spec.GDN_CHUNK_STATE
    from aotc.loader import dispatch

    device = first.get_device()
    gpu = dispatch.device_of(device)
    ws = _ws.GDN_CHUNK_STATE_WS
    if not (gpu.vendor == "nvidia" and _ws.ws_serves(axes, gpu.capability, True)):
        return _spec.GDN_CHUNK_STATE
    if not dispatch.is_built(ws, axes, device) and dispatch.is_built(_spec.GDN_CHUNK_STATE, axes, device):
        return _spec.GDN_CHUNK_STATE
    return ws


def _prefill_op(q, k, v, g, beta, state, state_indices, cu_seqlens, out, scale, qk_l2norm, state_layout,
                validate) -> None:
    from aotc.loader.dispatch import run_kernel

    # called as torch.ops.aotc.gated_delta_prefill directly, no public checks ran: no gradient dropped either way
    guards.refuse_grad(OP, q=q, k=k, v=v, g=g, beta=beta, state=state, out=out)
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


GDN_PREFILL = library.Op(
    "gated_delta_prefill(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor(a!) state, "
    "Tensor state_indices, Tensor cu_seqlens, Tensor(b!) out, float scale, bool qk_l2norm, "
    "str state_layout, bool validate) -> ()", impl=_prefill_op, fake=_prefill_fake)


class _Checked:
    """An unvalidated call's checked metadata: `match` (rules.call_matcher over every argument),
    the scale it resolved to, the overlap test of out and state on the call's addresses, and,
    for CUDA calls whose gates and indices need no conversion, both chunk kernels' prepared
    launches (`run`: fresh workspaces, pointers packed; the state pass's ALIGNED kernel where the
    pointers allow it, as `_state_spec` picks)."""

    __slots__ = ("match", "scale", "meets", "prep", "aligned", "generic", "index", "kda")

    def __init__(self, args, scale, outputs, reads):
        self.match, self.scale = rules.call_matcher(*args), scale
        self.meets = guards.Apart(OP, outputs, reads).on_pointers()
        self.prep = self.aligned = self.generic = None

    def apart(self, q, k, v, g, beta, state, state_indices, cu_seqlens, out) -> bool:
        return not self.meets(None if out is None else out.data_ptr(), state.data_ptr(), q.data_ptr(), k.data_ptr(),
                              v.data_ptr(), g.data_ptr(), beta.data_ptr(), state_indices.data_ptr(),
                              cu_seqlens.data_ptr())

    def prepare(self, q, k, v, g, beta, state, state_indices, cu_seqlens, out, qk_l2norm, state_layout) -> None:
        """The prepared launches, where this call needs no conversion and every binary is built."""
        if not (_prepares(q) and g.dtype == beta.dtype == torch.float32 and (g.dim() == 3 or g.stride(-1) == 1)
                and state_indices.dtype == cu_seqlens.dtype == torch.int32 and state_indices.is_contiguous()
                and cu_seqlens.is_contiguous()):
            return
        if out is None:
            out = torch.empty(v.shape, dtype=q.dtype, device=q.device)  # stands in for each call's
        launches = prepared_launches(q, k, v, g, beta, state, state_indices, cu_seqlens, out, self.scale, qk_l2norm,
                                     state_layout)
        if launches is not None:
            self.prep, self.aligned, self.generic = launches
            self.index, self.kda = q.device.index, g.dim() == 4

    def run(self, q, k, v, g, beta, state, state_indices, cu_seqlens, out):
        """Both launches with fresh workspaces: out, or None where the checked path must run (no
        prepared launch, another current device, pointers no prepared state kernel takes)."""
        if self.prep is None or _current_device() != self.index:
            return None
        keep = workspace(q, v, state_indices.shape[0], self.kda)  # alive until the launches are issued
        if out is None:
            out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
        if not launch_prepared(self.prep, self.aligned, self.generic, self.kda, _current_stream(self.index),
                               q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(),
                               state.data_ptr(), out.data_ptr(), cu_seqlens.data_ptr(), state_indices.data_ptr(),
                               workspace_pointers(keep)):
            return None
        del keep
        return out


def prepared_launches(q, k, v, g, beta, state, state_indices, cu_seqlens, out, scale, qk_l2norm, state_layout,
                      ws=None):
    """(precompute launches, ALIGNED state pass, GENERIC state pass) prepared for checked CUDA
    arguments needing no conversion (fp32 gates, a KDA gate's rows contiguous, contiguous int32
    indices) and a non-empty batch, or None where a binary is not built (run_kernel's path).
    A state pass may be None (not both): launch_prepared takes the other where it can."""
    if not (_prepares(q) and state_indices.shape[0] and q.shape[1]):
        return None
    from aotc.loader.dispatch import prepare

    index = q.device.index
    *pre, (_, saxes, sgrid, sargs) = launch_plan(
        q, k, v, g, beta, state, state_indices, cu_seqlens, out, scale, qk_l2norm, state_layout, ws=ws)
    prep = [prepare(pspec, paxes, pgrid, pargs[pspec.leading_ptrs:], index) for pspec, paxes, pgrid, pargs in pre]
    aligned, generic = (prepare(spec, saxes, sgrid, sargs[spec.leading_ptrs:], index, aligned_only=True)
                        for spec in (aligned_state_spec(saxes, q), _spec.GDN_CHUNK_STATE_GENERIC))
    if None in prep or (aligned is None and generic is None):
        return None
    return prep, aligned, generic


def _prepares(q) -> bool:
    """Whether calls on q's device launch prepared binaries (CUDA; the tests' recorded launches too)."""
    return q.is_cuda


def workspace_pointers(ws) -> tuple:
    """workspace()'s tensors as launch_prepared takes them: (W, U, Qg, Fq, Kg, Aqk, Decay, A) addresses
    (A 0 for GDN), then whether Qg is its own tensor (else the state pass reads q)."""
    w, u, qg, fq, kg, aqk, decay, akk = ws
    return (w.data_ptr(), u.data_ptr(), qg.data_ptr(), fq.data_ptr(), kg.data_ptr(), aqk.data_ptr(), decay.data_ptr(),
            0 if akk is None else akk.data_ptr(), qg is not w)


def launch_prepared(prep, aligned, generic, kda, stream, qp, kp, vp, gp, bp, sp, op, cp, ip, ws) -> bool:
    """The chunk kernels' prepared launches (prepared_launches) on `stream` with these pointers
    and workspace (workspace_pointers); False, launching nothing, where no prepared state pass
    takes them (the ALIGNED one needs its pointers aligned)."""
    wp, up, qgp, fqp, kgp, ap, dp, akp, own_qg = ws
    st = (wp, up, qgp if own_qg else qp, fqp, kgp, ap, op, sp, dp, cp, ip)
    launch = aligned if aligned is not None and not aligned.misaligned(st) else generic
    if launch is None:
        return False
    if kda:  # kda_chunk_intra, kda_chunk_inter, kda_chunk_wy (launch_plan's order)
        prep[0]((qp, kp, gp, bp, ap, akp, cp, ip), stream)
        prep[1]((qp, kp, gp, bp, wp, qgp, fqp, kgp, ap, akp, dp, cp, ip), stream)
        prep[2]((akp, vp, bp, wp, up, cp, ip), stream)
    else:
        prep[0]((qp, kp, vp, gp, bp, wp, up, qgp, fqp, kgp, ap, dp, cp, ip), stream)
    launch(st, stream)
    return True


_recent = rules.Recent()
_compiling = torch.compiler.is_compiling
# torch's own bindings, called directly (a CPU-only torch has none, and prepares no launch)
_current_device = getattr(torch._C, "_cuda_getDevice", None)
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def gated_delta_prefill(q, k, v, g, beta, state, state_indices, cu_seqlens, *, scale=None, qk_l2norm=False,
                        state_layout="vmajor", out=None, validate=None) -> torch.Tensor:
    """Gated DeltaNet / KDA prefill of packed sequences, chunked (64 tokens, WY form), from and into a state pool.

    Per value head and token: h *= exp(g); v' = beta (v - h k); h += v' k^T; o = scale h q
    (h [V, K]; see kernels/gated_delta/reference.py). Shapes (T packed tokens, N sequences):
      q, k `[1, T, H, K]`, v `[1, T, HV, V]`: fp16, bf16 or fp32 (fp32 computed in fp32: workspace
        fp32, dots tf32x3 on CUDA), last dim contiguous, HV a multiple of H (value head hv reads
        q/k head hv // (HV // H)); K, V any size in [1, 256] (the kernels' tiles are 64, 128 or
        256 wide, the rest masked).
      g: log-gates (<= 0), `[1, T, HV]` (GDN) or `[1, T, HV, K]` (KDA: one a K channel, last dim
        contiguous); beta `[1, T, HV]`. float32, or fp16/bf16 (converted to float32 first).
      state: float32 pool, `[slots, HV, V, K]` for state_layout="vmajor" (default) or
        `[slots, HV, K, V]` for "kmajor"; any strides. Sequence n starts from
        state[state_indices[n]] and its final state is written there, in place. An index < 0
        marks a padded sequence: its outputs are zeros and no state is read or written.
      state_indices `[N]`, cu_seqlens `[N + 1]`: int32 or int64 (int64 is converted to int32; a
        value outside int32 is refused when validated, and an unvalidated such state index is
        padded); sequence n is tokens cu_seqlens[n]:cu_seqlens[n+1]. Chunks never cross sequences.
        An empty batch (T = 0, N >= 0) is a no-op: states untouched, an empty out returned.
    Options: scale (default K ** -0.5); qk_l2norm: q and k divided by sqrt(sum(x^2) + 1e-6) in
      the kernel; out `[1, T, HV, V]` (q's dtype, last dim contiguous), allocated when None.
      validate: copy cu_seqlens and state_indices to the host and check them (cu_seqlens from 0
      to T, non-decreasing; indices below the pool's slots, no slot twice): one device sync.
      Default on, except under CUDA-graph capture and torch.compile. The kernels find each
      chunk's sequence on the device (binary search over cu_seqlens), so no lengths are read on
      the host otherwise and the launch needs no sync. Unvalidated, an index >= slots is treated
      as padded (nothing out of the pool is touched); cu_seqlens must still hold valid offsets.
      The state pass's value tile follows N, HV, K, V and the GPU's SM count, never the lengths
      (chunk_spec.state_block_v): one captured CUDA graph serves every length.
    Kernels: the per-chunk precompute (GDN one kernel; KDA three: A's diagonal 16 x 16 blocks, the
      blocks below them, the inverse and W/U), then the state pass: on sm90 (16-bit, K and V tiles <= 128,
      16-byte-aligned arguments) a warp-specialized Gluon kernel, else Triton's; both write the
      same final states (AOTC_GDN_STATE_WS=0 keeps Triton's on sm90 too).
    Workspace: W, U, k exp(G_last - G) (and for KDA q exp(G)) `[T, HV, K or V tile]` and the chunk's
      attention `[T, HV, 64]` in q's dtype, q's row factors `[T, HV]` fp32 (KDA: also A `[T, HV, 64]`
      fp32), allocated per call
      (torch's caching allocator).
    Returns out. Raises TypeError for a wrong type or dtype and ValueError for a wrong shape,
    stride, device, option or (when validated) value, naming the argument, before any launch;
    ValueError naming out or state when either shares memory with another argument or is an
    expand()ed (stride-0) view; NotImplementedError when grad mode is on and an input requires
    grad (aotc is inference-only).
    NaN and inf in the inputs are not checked: NaN in, NaN out (a sequence's outputs and final
    state from that token on; other sequences unaffected).
    """
    args = (q, k, v, g, beta, state, state_indices, cu_seqlens, scale, qk_l2norm, state_layout, out)
    for c in (_recent.entries if validate is False and not _compiling() else ()):
        if c.match(*args):  # checked before; grad and overlap are this call's
            if c.apart(q, k, v, g, beta, state, state_indices, cu_seqlens, out):
                done = c.run(q, k, v, g, beta, state, state_indices, cu_seqlens, out)
                if done is not None:
                    return done
                return _launch(q, k, v, g, beta, state, state_indices, cu_seqlens, c.scale, qk_l2norm, state_layout,
                               out, False, dispatcher=False)
            break  # overlapping: the checks below name it
    sc = _validate(q, k, v, g, beta, state, state_indices, cu_seqlens, scale, state_layout, out)
    if not isinstance(qk_l2norm, bool):
        raise TypeError(f"{OP}: qk_l2norm must be a bool, got {type(qk_l2norm).__name__}")
    reads = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "state_indices": state_indices, "cu_seqlens": cu_seqlens}
    if (validate is False and not _compiling() and not any(c.match(*args) for c in _recent.entries)
            and not any(t is not None and t.requires_grad for t in (state, out, *reads.values()))):
        c = _Checked(args, sc, {"out": out, "state": state}, reads)
        if c.match(*args):  # (a call that passes one tensor twice never matches: it keeps the checks)
            c.prepare(q, k, v, g, beta, state, state_indices, cu_seqlens, out, qk_l2norm, state_layout)
            _recent.add(c)
    if validate is None:
        validate = not skip_value_checks(q)
    if validate:  # on the caller's tensors, before int64 values are narrowed
        _check_values(q.shape[1], state, state_indices, cu_seqlens)
    return _launch(q, k, v, g, beta, state, state_indices, cu_seqlens, sc, qk_l2norm, state_layout, out, validate)


def _launch(q, k, v, g, beta, state, state_indices, cu_seqlens, sc, qk_l2norm, state_layout, out, validate,
            dispatcher=True):
    """A checked call's conversions and launches: through the op (fake tensors get its Meta
    implementation), or, for a matched steady state (real tensors), its implementation directly."""
    # Converted once: the kernels read fp32 gates (a KDA gate row contiguous) and int32 metadata.
    g = g.float()
    if g.dim() == 4 and g.stride(-1) != 1:
        g = g.contiguous()
    beta = beta.float()
    # int64 values outside int32 would wrap onto another slot: refused when validated, padded when not
    state_indices = guards.to_int32(OP, "state_indices", state_indices, validate, pad=-1).contiguous()
    cu_seqlens = guards.to_int32(OP, "cu_seqlens", cu_seqlens, validate).contiguous()
    check_state_indices(state_indices, state_indices.shape[0], q.device, OP)
    if out is None:
        out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    (GDN_PREFILL if dispatcher else _prefill_op)(q, k, v, g, beta, state, state_indices, cu_seqlens, out, sc, qk_l2norm,
                                                 state_layout, False)
    return out
