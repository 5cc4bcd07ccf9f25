"""Gated delta rule (Gated DeltaNet / KDA) recurrent decode, `gated_delta_decode` (the argument
checks it shares with the chunked prefill are gated_delta_rules.py's).

`gated_delta_decode` is declared once as `GDN_DECODE` (library.Op): the op
`torch.ops.aotc.gated_delta_decode` (mutating `state` and `out`), its Meta implementation (the
same checks) and its plan key follow from it, so `torch.compile(fullgraph=True)` traces through
it. Eager calls skip the dispatcher: a plan per input metadata holds the checked, prepared
launch (launch.Launch), as `decode` does. Rules (`_check_decode`), plan (`_make_plan`), launch (`_launch`).
"""
from __future__ import annotations

import math

import torch

from aotc.kernels.gated_delta import spec as S

from ..dispatch import prepare, run_kernel
from . import guards, library, rules, steady
from .gated_delta_rules import (GATE_DTYPES, QKV_DTYPES, check_out, check_qkv, check_scale, check_state,
                                check_state_index_values, check_state_indices, resolve_gates)
from .value_checks import skip_value_checks

OP = "gated_delta_decode"


# ---- the decode op --------------------------------------------------------------------------

def _check_decode(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale, qk_l2norm, state_layout,
                  out, final_state):
    """Every check that needs no tensor values; returns (Dims, scale, fused, the binary's gate axis)."""
    guards.refuse_grad(OP, **_tensors(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, out, final_state))
    d = check_qkv(q, k, v, OP, max_t=S.MAX_T)
    dev = q.device
    kind, fused = resolve_gates(g, beta, A_log, a, dt_bias, b, d, dev, OP)
    check_state(state, state_layout, d, dev, OP)
    rows, cols = state.shape[2], state.shape[3]
    if (rows - 1) * state.stride(2) + cols > rules.I32_MAX:  # the kernel's offsets inside a head are int32
        rules.fail(OP, "state", f"a head's rows within 2**31 elements ((rows - 1) * stride(2) + {cols})",
                   f"stride(2) {state.stride(2)} over {rows} rows")
    if state_indices is None:  # dense: request b's state is state[b]
        rules.need(OP, state.shape[0] == d.B, "state.shape[0]", f"B = {d.B} (one state a request: state_indices "
                   f"is None)", state.shape[0])
    else:
        check_state_indices(state_indices, d.B, dev, OP)
    if final_state is not None:
        rules.tensor(OP, "final_state", final_state, (torch.float32,), 4, dev)
        if final_state.shape != state.shape or final_state.stride() != state.stride():
            rules.fail(OP, "final_state", f"shaped and strided like state ({tuple(state.shape)}, strides "
                       f"{state.stride()})", f"{tuple(final_state.shape)}, strides {final_state.stride()}")
    if out is not None:
        check_out(out, (d.B, d.T, d.HV, d.V), q.dtype, dev, OP)
    if not isinstance(qk_l2norm, bool):
        raise TypeError(f"{OP}: qk_l2norm must be a bool, got {type(qk_l2norm).__name__}")
    gate = S.binary_gate(kind, state_layout, d.T, fused)
    rules.need(OP, d.B <= S.GRID_YZ_MAX, "q.shape[0] (B)", f"at most {S.GRID_YZ_MAX} (the grid's third axis)", d.B)
    rules.need(OP, d.HV <= S.GRID_YZ_MAX, "v.shape[2] (HV)", f"at most {S.GRID_YZ_MAX} (the grid's second axis)",
               d.HV)
    outputs, inputs = _written(_tensors(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, out, final_state))
    guards.check_outputs(OP, outputs, inputs)
    return d, check_scale(scale, d.K, OP), fused, gate


def _tensors(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, out, final_state) -> dict:
    """The decode's tensors by name: out, final_state and state first, then what it only reads."""
    return {"out": out, "final_state": final_state, "state": state, "q": q, "k": k, "v": v, "g": g, "beta": beta,
            "state_indices": state_indices, "A_log": A_log, "a": a, "dt_bias": dt_bias, "b": b}


def _written(named: dict) -> tuple[dict, dict]:
    """(outputs, inputs) of _tensors' dict: state is written in place unless final_state is given."""
    named = dict(named)
    final = named.pop("final_state")
    outputs = {"out": named.pop("out")}
    if final is None:
        outputs["state"] = named.pop("state")
    else:
        outputs["final_state"] = final
    return outputs, named


def _strides(t, n):
    """The first n strides of t, padded with 0 (a GDN gate's K stride: broadcast over K)."""
    return (tuple(t.stride()) + (0,) * n)[:n]


# Where the kernel's `dense` flag (no state_indices: state[b] is request b's) sits in a plan's ints
_DENSE = S.DECODE.arg_index["dense"] - S.DECODE.leading_ptrs


class _Plan:
    """A checked launch: variant axes, grid, the non-pointer arguments, and for CUDA tensors whose
    binaries are built the prepared `launch.Launch` that packs only the pointers per call."""

    __slots__ = ("axes", "grid", "ints", "fused", "fast", "apart", "eager_made", "final")

    def __init__(self, axes, grid, ints, fused, final):
        self.axes, self.grid, self.ints, self.fused, self.fast = axes, grid, ints, fused, None
        self.final = final  # the state written to final_state
        self.apart = None  # guards.Apart of the public function's cached plans
        self.eager_made = 0  # _Eager steady states made from this plan

    @property
    def dense(self) -> bool:
        """No state_indices (the kernel's `dense` argument, held in the ints)."""
        return bool(self.ints[_DENSE])


def _make_plan(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale, qk_l2norm, state_layout, out,
               final_state, fused, gate):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    bk = S.block_k(K)
    rows = S.rows_form(state_layout, K, V, state.stride(2), gate)
    axes = S.axes_for(QKV_DTYPES[q.dtype], bk, state_layout, gate, rows, S.tokens_form(rows, T, state_layout, bk, gate))
    bv = S.constexprs(axes)["BV"]
    gt, bt = (a, b) if fused else (g, beta)
    gs, bs = _strides(gt, 4), _strides(bt, 3)
    if fused:
        ds = _strides(dt_bias, 2)
        codes = (S.GATE_CODES[GATE_DTYPES[a.dtype]], S.GATE_CODES[GATE_DTYPES[b.dtype]],
                 S.GATE_CODES[GATE_DTYPES[A_log.dtype]], S.GATE_CODES[GATE_DTYPES[dt_bias.dtype]])
    else:
        ds = (0, 0)
        codes = (S.GATE_CODES[GATE_DTYPES[g.dtype]], S.GATE_CODES[GATE_DTYPES[beta.dtype]], 0, 0)
    group = HV // H
    ints = (float(scale), T, group, S.group_shift(group), state.shape[0], int(state_indices is None), K, V,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            state.stride(0), state.stride(1), state.stride(2),
            *gs, *bs, *ds, *codes, int(fused), int(qk_l2norm))
    plan = _Plan(axes, S.grid(B, HV, V, bv), ints, fused, final_state is not None)
    if q.is_cuda and math.prod(plan.grid):
        plan.fast = prepare(S.DECODE, axes, plan.grid, ints, q.device.index)
    return plan


def _pointer_tensors(plan, g, beta, state, state_indices, A_log, a, dt_bias, b, final_state):
    """(state_out, gate, beta, A_log's, dt_bias's, index) tensors of the launch: the unfused form's
    A_log and dt_bias slots and the dense form's index slot are never read (an int32 view of
    the state fills them, so a JIT launch types them as the binary does)."""
    idx = state.view(torch.int32) if state_indices is None else state_indices
    gt, bt = (a, b) if plan.fused else (g, beta)
    al, dt = (A_log, dt_bias) if plan.fused else (idx, idx)
    return (state if final_state is None else final_state), gt, bt, al, dt, idx


def _launch(plan, q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, out, final_state) -> None:
    if not math.prod(plan.grid):
        return
    so, gt, bt, al, dt, idx = _pointer_tensors(plan, g, beta, state, state_indices, A_log, a, dt_bias, b, final_state)
    if plan.fast is not None and torch._C._cuda_getDevice() == q.device.index:
        plan.fast((q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), state.data_ptr(), so.data_ptr(),
                   gt.data_ptr(), bt.data_ptr(), al.data_ptr(), dt.data_ptr(), idx.data_ptr()),
                  torch._C._cuda_getCurrentRawStream(q.device.index))
        return
    run_kernel(S.DECODE, plan.axes, plan.grid, _jit_args(plan, q, k, v, state, out, so, gt, bt, al, dt, idx))


def _jit_args(plan, q, k, v, state, out, so, gt, bt, al, dt, idx) -> tuple:
    as_bytes = rules.as_bytes
    return (q, k, v, out, state, so, as_bytes(gt), as_bytes(bt), as_bytes(al), as_bytes(dt), idx, *plan.ints)


def launch_plan(q, k, v, g, beta, state, state_indices, out, *, scale=None, qk_l2norm=False, state_layout="vmajor",
                A_log=None, a=None, dt_bias=None, b=None, final_state=None):
    """(axes, grid, args) of the kernel launch a checked call makes, args as Triton's JIT takes them
    (the bench's --sweep launches the same kernel with other tiles)."""
    _d, scale, fused, gate = _check_decode(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale,
                                           qk_l2norm, state_layout, out, final_state)
    plan = _make_plan(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale, qk_l2norm, state_layout,
                      out, final_state, fused, gate)
    so, gt, bt, al, dt, idx = _pointer_tensors(plan, g, beta, state, state_indices, A_log, a, dt_bias, b, final_state)
    return plan.axes, plan.grid, _jit_args(plan, q, k, v, state, out, so, gt, bt, al, dt, idx)


def _decode_op(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale, qk_l2norm, state_layout,
               out, final_state=None) -> None:
    _d, scale, fused, gate = _check_decode(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale,
                                           qk_l2norm, state_layout, out, final_state)
    plan = _make_plan(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale, qk_l2norm, state_layout,
                      out, final_state, fused, gate)
    _launch(plan, q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, out, final_state)


def _decode_fake(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale, qk_l2norm, state_layout,
                 out, final_state=None) -> None:
    _check_decode(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale, qk_l2norm, state_layout, out,
                  final_state)


GDN_DECODE = library.Op(
    "gated_delta_decode(Tensor q, Tensor k, Tensor v, Tensor? g, Tensor? beta, Tensor(a!) state, "
    "Tensor? state_indices, Tensor? A_log, Tensor? a, Tensor? dt_bias, Tensor? b, float? scale, "
    "bool qk_l2norm, str state_layout, Tensor(b!) out, Tensor(c!)? final_state=None) -> ()", impl=_decode_op,
    fake=_decode_fake)


# Plans by the inputs' metadata (GDN_DECODE.key).
_plans = rules.PlanCache()
# Unvalidated eager calls' steady states (_Eager), tried before the plan key is built.
_recent = rules.Recent()
_compiling = torch.compiler.is_compiling


class _Eager(steady.Steady):
    """An unvalidated pool call's steady state for one input metadata (a steady.Steady): the
    kernel's pointers, in its launch's order, go straight to the plan's prepared launch. Only the
    in-place pool form (what engines call each step) makes one."""

    ARGS = ("q", "k", "v", "g", "beta", "state", "state_indices", "A_log", "a", "dt_bias", "b", "out")
    __slots__ = ("pointers", "go")

    def __init__(self, args: tuple, plan: _Plan, named: dict, device_index: int):
        outputs, inputs = _written(named)
        # A_log and dt_bias's slots hold state_indices unfused (never read): not compared
        order = _FUSED_ORDER if plan.fused else _PLAIN_ORDER
        super().__init__(rules.call_matcher(*args), guards.Apart(OP, outputs, inputs), order, device_index)
        self.pointers = self._fused if plan.fused else self._plain
        self.go = plan.fast

    @staticmethod
    def _plain(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, out):
        ip, sp = state_indices.data_ptr(), state.data_ptr()
        return (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), sp, sp, g.data_ptr(), beta.data_ptr(), ip,
                ip, ip)

    @staticmethod
    def _fused(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, out):
        sp = state.data_ptr()
        return (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), sp, sp, a.data_ptr(), b.data_ptr(),
                A_log.data_ptr(), dt_bias.data_ptr(), state_indices.data_ptr())


# The kernel's leading pointers by name (S.DECODE's order; _launch passes the same); the state's
# second slot is State_out, the same tensor in place
_PLAIN_ORDER = ("q", "k", "v", "out", "state", None, "g", "beta", "state_indices", None, None)
_FUSED_ORDER = ("q", "k", "v", "out", "state", None, "a", "b", "A_log", "dt_bias", "state_indices")


def gated_delta_decode(q, k, v, g, beta, state, state_indices, *, scale=None, qk_l2norm=False, out=None,
                       state_layout="vmajor", A_log=None, a=None, dt_bias=None, b=None, final_state=None,
                       validate=True) -> torch.Tensor:
    """One decode step (T <= 8 tokens a request, e.g. speculative verify) of the gated delta
    rule, each request's recurrent state read from and written back to a pool in place.

    Per token and value head (reference.py): h *= exp(g); v' = beta * (v - h k); h += v' k^T;
    o = scale * h q, with h [V, K] fp32.
    Shapes (B <= 65535 requests, T in [1, 8] tokens each, H query/key heads, HV <= 65535 value
    heads, HV % H == 0: value head hv reads q/k head hv // (HV // H)):
      q, k      [B, T, H, K] fp16, bf16 or fp32 (fp32 runs in fp32 throughout), K in [1, 256]
                (the kernel's tile is K rounded up to 64, 128 or 256, masked); last dim contiguous.
      v         [B, T, HV, V] q's dtype; V in [1, 512]; last dim contiguous.
      g         [B, T, HV] (Gated DeltaNet: one log-gate a head) or [B, T, HV, K] (KDA: one a
                head and K channel); log space (<= 0); fp32, fp16 or bf16; any strides.
      beta      [B, T, HV]; fp32, fp16 or bf16.
      Fused-gate form (SGLang's decode): g=None, beta=None and the keywords A_log [HV], a
                [B, T, HV] with dt_bias [HV] (GDN) or a [B, T, HV, K] with dt_bias [HV, K] (KDA),
                b [B, T, HV]; fp32/fp16/bf16 each. The kernel computes
                g = -exp(A_log) * softplus(a + dt_bias) (softplus threshold 20) and beta = sigmoid(b).
      state     fp32 pool, updated in place: [slots, HV, V, K] for state_layout="vmajor" (the
                default, K contiguous) or [slots, HV, K, V] for "kmajor" (V contiguous). The
                layout is always the argument's, never guessed from the shape. Other strides free
                (a head's rows within 2**31 elements).
      state_indices  [B] int32, contiguous: request b uses state[state_indices[b]]. An index < 0
                is a padded row: its outputs are zeros and no state is read or written. (The
                kernel also treats an index >= slots as padded, so nothing out of range is touched
                even with validate=False.) None: dense states, state[b] for request b (state has
                B rows; no padded rows).
      final_state  None (the state is updated in place), or an fp32 tensor shaped and strided like
                state: the updated states are written there (at the rows the state was read from)
                and state is only read (flash-linear-attention's initial_state / final_state).
      scale     float, default K ** -0.5. qk_l2norm: L2-normalize q and k per head in the kernel
                (x / sqrt(sum(x^2) + 1e-6)).
      out       [B, T, HV, V] in q's dtype, last dim contiguous; allocated when None.
      validate  copy state_indices to the host and check every index < slots and no slot named
                twice (one device sync; skipped under CUDA-graph capture and torch.compile).
    Returns out. CUDA-graph safe: the grid is (cdiv(V, BV), HV, B), no length or value in it.
    Raises TypeError (wrong type or dtype) or ValueError (shape, stride, device, option, index;
    an out or state that is an expand()ed view or shares memory with another argument, checked by
    address on every call), naming the argument, before anything is launched; NotImplementedError
    when grad mode is on and a tensor requires grad (aotc is inference-only). NaN and inf in the inputs are not checked:
    NaN in, NaN out (the request's outputs and state from that token on; other requests unaffected).
    """
    matched = False
    if not validate and not _compiling() and final_state is None:
        for e in _recent.entries:  # one C call matches every argument; pointers read once
            if e.match(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale, qk_l2norm, state_layout,
                       out):
                if e.run(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, out):
                    return out
                matched = True  # the full path decides this call (and names any error)
                break
    if _compiling():  # the op's Meta implementation runs the checks
        if out is None:
            out = torch.empty((*q.shape[:2], *v.shape[2:]), dtype=q.dtype, device=q.device)
        GDN_DECODE(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale, qk_l2norm, state_layout, out,
                   final_state)
        return out
    out_given = out
    try:
        if out is None:
            out = torch.empty((*q.shape[:2], *v.shape[2:]), dtype=q.dtype, device=q.device)
        key = GDN_DECODE.key(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale, qk_l2norm,
                             state_layout, out, final_state)
        plan = _plans.get(key)
    except (AttributeError, TypeError, RuntimeError, ValueError):  # not tensors: the checks say what is wrong
        key = plan = None
    named = _tensors(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, out, final_state)
    if plan is None:
        _d, scale_f, fused, gate = _check_decode(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale,
                                                 qk_l2norm, state_layout, out, final_state)
        plan = _make_plan(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale_f, qk_l2norm,
                          state_layout, out, final_state, fused, gate)
        plan.apart = guards.Apart(OP, *_written(named))
        _plans.put(key, plan)
    else:  # a plan hit: sizes and strides were checked when it was made; grad and pointers are this call's
        if torch.is_grad_enabled():
            guards.refuse_grad(OP, **named)
        if final_state is None:
            plan.apart(out, state, q, k, v, g, beta, state_indices, A_log, a, dt_bias, b)
        else:
            plan.apart(out, final_state, state, q, k, v, g, beta, state_indices, A_log, a, dt_bias, b)
    if validate and state_indices is not None and not skip_value_checks(state_indices):
        check_state_index_values(state_indices, state.shape[0], OP)
    _launch(plan, q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, out, final_state)
    if (not (validate or matched) and out_given is out and plan.fast is not None and not (plan.dense or plan.final)
            and plan.eager_made < steady.MAX_PER_PLAN and steady.grad_free(named.values())):
        plan.eager_made += 1  # bounded: a call unlike every steady state (another mode) re-derives one
        _recent.add(_Eager((q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale, qk_l2norm,
                            state_layout, out), plan, named, q.device.index))
    return out
