"""`GatedDeltaPrefillPlan`: one gated_delta_prefill step planned once, then run per layer.

Every linear-attention layer of a prefill step reads the same packed sequences (cu_seqlens) into
the same state slots (state_indices). The constructor runs every check `gated_delta_prefill`
runs (the values too, once, one device sync) on tensors that stand for every layer's (values
not read), allocates the chunk kernels' workspaces once (W, U, Qg, the row factors, k's gated
copy, the chunks' attention, the decays; KDA's A too) and prepares the precompute and state-pass
launches into private parameter buffers. `run(q, k, v, g, beta, state, out)` is the plan.Plan
sequence: one C call compares the layer's tensors with the plan's, each pointer read once for the
overlap test (out and state against every other argument and the step's cu_seqlens and
state_indices) and the packing, then the two (KDA: four) driver calls on the plan's workspaces:
nothing is allocated, so runs capture into a CUDA graph. The state pass takes its ALIGNED binary
(on sm90 the Gluon kernel) where the layer's pointers allow it, as the eager op does.
"""
from __future__ import annotations

import torch

from ..dispatch import run_kernel
from . import gated_delta_prefill as GP
from . import rules
from .plan import Plan

OP = "GatedDeltaPrefillPlan"


class GatedDeltaPrefillPlan(Plan):
    """`gated_delta_prefill` for one step, planned once and run per layer.

        plan = loader.GatedDeltaPrefillPlan(state_indices, cu_seqlens, q=q0, k=k0, v=v0, g=g0, beta=b0,
                                            state=pool0)
        for layer in range(n):
            plan.run(q[layer], k[layer], v[layer], g[layer], beta[layer], pool[layer], out[layer])

    state_indices `[N]` and cu_seqlens `[N + 1]`: the step's slots and offsets, contiguous int32
    (the kernels read int32; an int64 copy would not see values written later); their values must
    not change while the plan is used except between CUDA-graph replays (with valid offsets).
    q, k, v, g, beta, state, out: tensors with the metadata every layer's will have (values not
    read); g and beta float32 (the eager op converts other dtypes each call: convert once), a KDA
    gate's last dim contiguous; out defaults to a contiguous tensor of v's shape in q's dtype.
    scale, qk_l2norm, state_layout: as `gated_delta_prefill`; validate checks cu_seqlens and the
    slots once, here. `workspace`: the plan's own chunk workspaces. Errors as the op's, raised
    here; `run` raises ValueError/TypeError naming the argument whose dtype, shape, strides or
    device differ from the plan's, or an output that overlaps another argument.
    """

    NAME = OP
    ARGS = ("q", "k", "v", "g", "beta", "state", "out")
    OUTPUTS = ("out", "state")

    def __init__(self, state_indices, cu_seqlens, *, q, k, v, g, beta, state, out=None, scale=None, qk_l2norm=False,
                 state_layout="vmajor", validate=True):
        sc = GP._validate(q, k, v, g, beta, state, state_indices, cu_seqlens, scale, state_layout, out)
        if not isinstance(qk_l2norm, bool):
            raise TypeError(f"{GP.OP}: qk_l2norm must be a bool, got {type(qk_l2norm).__name__}")
        for name, t in (("state_indices", state_indices), ("cu_seqlens", cu_seqlens)):
            if t.dtype != torch.int32 or not t.is_contiguous():
                rules.fail(OP, name, "a contiguous int32 tensor (the kernels read int32: convert once)",
                           f"{t.dtype}, strides {t.stride()}", TypeError if t.dtype != torch.int32 else ValueError)
        for name, t in (("g", g), ("beta", beta)):
            if t.dtype != torch.float32:
                rules.fail(OP, name, "float32 (the kernels read fp32 gates: convert once)", t.dtype, TypeError)
        if g.dim() == 4 and g.shape[-1] > 1 and g.stride(-1) != 1:
            rules.fail(OP, "g", "contiguous in its last dim (a KDA gate's K channels)", f"strides {g.stride()}")
        if validate:
            GP._check_values(q.shape[1], state, state_indices, cu_seqlens)
        if out is None:
            out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
        kda = g.dim() == 4
        self.state_indices, self.cu_seqlens, self.scale = state_indices, cu_seqlens, sc
        self.qk_l2norm, self.state_layout = qk_l2norm, state_layout
        self.workspace = GP.workspace(q, v, state_indices.shape[0], kda)
        launches = GP.prepared_launches(q, k, v, g, beta, state, state_indices, cu_seqlens, out, sc, qk_l2norm,
                                        state_layout, ws=self.workspace)
        if launches is not None:
            self._prep, self._aligned, self._generic = launches
        self._kda, self._ws = kda, GP.workspace_pointers(self.workspace)
        self._cp, self._ip = cu_seqlens.data_ptr(), state_indices.data_ptr()
        self.setup((q, k, v, g, beta, state, out), {"state_indices": state_indices, "cu_seqlens": cu_seqlens},
                   self.ARGS, launches is not None, q.device)

    def run(self, q, k, v, g, beta, state, out):
        """One layer: `gated_delta_prefill(q, k, v, g, beta, state, <plan's state_indices, cu_seqlens>,
        out=out, ...)`, the states updated in place. Returns out."""
        if not (self.match(q, k, v, g, beta, state, out) and self.steady_run(q, k, v, g, beta, state, out)):
            self.run_checked((q, k, v, g, beta, state, out))
        return out

    @staticmethod
    def pointers(q, k, v, g, beta, state, out):
        return q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(), state.data_ptr(), out.data_ptr()

    def go(self, p, stream) -> bool:
        """False (nothing launched) where no prepared state pass takes the pointers: the general path runs."""
        return GP.launch_prepared(self._prep, self._aligned, self._generic, self._kda, stream, *p, self._cp, self._ip,
                                  self._ws)

    def general(self, q, k, v, g, beta, state, out) -> None:
        """The kernels through run_kernel on the plan's workspaces (CPU, the JIT fallback, another current device)."""
        if not (self.state_indices.shape[0] and q.shape[1]):
            return  # an empty batch: nothing to run
        for spec, axes, grid, args in GP.launch_plan(q, k, v, g, beta, state, self.state_indices, self.cu_seqlens,
                                                     out, self.scale, self.qk_l2norm, self.state_layout,
                                                     ws=self.workspace):
            run_kernel(spec, axes, grid, args)
