"""`GatedDeltaDecodePlan`: one gated_delta_decode step planned once, then run per layer.

A serving engine's decode step runs every linear-attention layer with the same state slots
(state_indices) and shapes. The constructor runs every check `gated_delta_decode` runs (the index
values too, once, one device sync) on tensors that stand for every layer's (values not read),
makes the launch (`gated_delta._make_plan`: variant, grid, every non-pointer argument) into a
private parameter buffer and packs the step's state_indices there once. `run(q, k, v, g, beta,
state, out)` (or the fused-gate form's A_log, a, dt_bias, b) is the plan.Plan sequence: one C call
compares the layer's tensors with the plan's, each pointer is read once for the overlap test
(out and state against every other argument and the step's state_indices) and the packing, one
driver call. A mismatch raises ValueError/TypeError naming the argument before any launch.
state_indices' values must not change while the plan is used except between CUDA-graph replays
(the kernel treats an index < 0 or >= slots as a padded row, so no value reads out of the pool).
"""
from __future__ import annotations

import torch

from . import gated_delta as G
from .gated_delta_rules import check_state_index_values
from .plan import Plan

OP = "GatedDeltaDecodePlan"


class GatedDeltaDecodePlan(Plan):
    """`gated_delta_decode` for one step, planned once and run per layer.

        plan = loader.GatedDeltaDecodePlan(state_indices, q=q0, k=k0, v=v0, g=g0, beta=b0, state=pool0)
        for layer in range(n):
            plan.run(q[layer], k[layer], v[layer], g[layer], beta[layer], pool[layer], out[layer])

    state_indices: the step's int32 [B] slots (None: dense states, state[b] for request b). q, k,
    v, g, beta (or g=None, beta=None and A_log, a, dt_bias, b: the fused-gate form), state, out:
    tensors with the metadata every layer's will have (any layer's own; values not read); out
    defaults to a contiguous [B, T, HV, V] tensor in q's dtype. scale, qk_l2norm, state_layout:
    as `gated_delta_decode`; validate checks the indices' values once, here. The state is updated
    in place (no final_state form). Errors as `gated_delta_decode`'s, raised here; `run` raises
    ValueError/TypeError naming the argument whose dtype, shape, strides or device differ from
    the plan's, or an output that overlaps another argument. CUDA-graph safe (nothing allocated).
    """

    NAME = OP
    ARGS = ("q", "k", "v", "g", "beta", "state", "out", "A_log", "a", "dt_bias", "b")
    OUTPUTS = ("out", "state")

    def __init__(self, state_indices, *, q, k, v, state, g=None, beta=None, A_log=None, a=None, dt_bias=None, b=None,
                 out=None, scale=None, qk_l2norm=False, state_layout="vmajor", validate=True):
        _d, sc, fused, gate = G._check_decode(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, scale,
                                              qk_l2norm, state_layout, out, None)
        if out is None:
            out = torch.empty((*q.shape[:2], *v.shape[2:]), dtype=q.dtype, device=q.device)
        if validate and state_indices is not None:
            check_state_index_values(state_indices, state.shape[0], G.OP)
        plan = G._make_plan(q, k, v, g, beta, state, state_indices, A_log, a, dt_bias, b, sc, qk_l2norm, state_layout,
                            out, None, fused, gate)
        self.state_indices, self.scale, self.qk_l2norm, self.state_layout = state_indices, sc, qk_l2norm, state_layout
        self._launch = launch = plan.fast  # a private buffer: prepare() packs a new one for every plan
        dense = state_indices is None
        if launch is not None:  # slots 8-10 (A_log's, dt_bias', Idx) hold state_indices where nothing else is read
            if not dense:
                ip = state_indices.data_ptr()
                launch.fix({10: ip} if fused else {8: ip, 9: ip, 10: ip})
            launch.per_call(0, 11 if dense else 10 if fused else 8)
            self.go = launch.launch
        self.pointers, order = _POINTERS[fused, dense]
        self.setup((q, k, v, g, beta, state, out, A_log, a, dt_bias, b), {"state_indices": state_indices}, order,
                   launch is not None, q.device)

    def run(self, q, k, v, g, beta, state, out, A_log=None, a=None, dt_bias=None, b=None):
        """One layer: `gated_delta_decode(q, k, v, g, beta, state, <plan's state_indices>, out=out, ...)`,
        the state updated in place. Returns out."""
        if not (self.match(q, k, v, g, beta, state, out, A_log, a, dt_bias, b)
                and self.steady_run(q, k, v, g, beta, state, out, A_log, a, dt_bias, b)):
            self.run_checked((q, k, v, g, beta, state, out, A_log, a, dt_bias, b))
        return out

    def general(self, q, k, v, g, beta, state, out, A_log, a, dt_bias, b) -> None:
        """The eager op (CPU, the JIT fallback, another current device)."""
        G.gated_delta_decode(q, k, v, g, beta, state, self.state_indices, scale=self.scale, qk_l2norm=self.qk_l2norm,
                             out=out, state_layout=self.state_layout, A_log=A_log, a=a, dt_bias=dt_bias, b=b,
                             validate=False)


# The kernel's leading pointers (S.DECODE: Q, K, V, Out, State, State_out, G, Beta, A_log, Dt_bias,
# Idx) a run packs: up to Beta (unfused) or Dt_bias (fused) with the indices packed once; all
# eleven for dense states, whose index slots hold the state's address (never read as indices).
def _plain(q, k, v, g, beta, state, out, A_log, a, dt_bias, b):
    sp = state.data_ptr()
    return q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), sp, sp, g.data_ptr(), beta.data_ptr()


def _fused(q, k, v, g, beta, state, out, A_log, a, dt_bias, b):
    sp = state.data_ptr()
    return (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), sp, sp, a.data_ptr(), b.data_ptr(),
            A_log.data_ptr(), dt_bias.data_ptr())


def _plain_dense(q, k, v, g, beta, state, out, A_log, a, dt_bias, b):
    sp = state.data_ptr()
    return q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), sp, sp, g.data_ptr(), beta.data_ptr(), sp, sp, sp


def _fused_dense(q, k, v, g, beta, state, out, A_log, a, dt_bias, b):
    sp = state.data_ptr()
    return (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), sp, sp, a.data_ptr(), b.data_ptr(),
            A_log.data_ptr(), dt_bias.data_ptr(), sp)


_HEAD = ("q", "k", "v", "out", "state", None)
_POINTERS = {  # (fused, dense) -> (pointers, what each slot holds)
    (False, False): (_plain, (*_HEAD, "g", "beta")),
    (True, False): (_fused, (*_HEAD, "a", "b", "A_log", "dt_bias")),
    (False, True): (_plain_dense, (*_HEAD, "g", "beta", None, None, None)),
    (True, True): (_fused_dense, (*_HEAD, "a", "b", "A_log", "dt_bias", None)),
}
