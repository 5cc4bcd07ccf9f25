"""`DecodePlan`: one decode step planned once, then run per layer with pointers only.

A serving engine runs one decode step over many layers with the same page table and lengths
(FlashInfer's `plan()` once a step, `run()` a layer). `DecodePlan(table, seq_lens, q=..., k_cache=...,
v_cache=...)` runs every check `decode` runs (the value checks too, once, with one device sync)
on tensors that stand for every layer's (their shapes, strides and dtypes; values are not read),
takes the plan `decode` caches for that metadata (decode.cached_plan: grids, variant, split count,
every non-pointer argument), and packs the step's own pointers (table, lengths, req_idx, sinks,
and a workspace of its own) into private copies of the two launches' parameter buffers.
`plan.run(q, k_cache, v_cache, out, k_scale, v_scale)` then compares each tensor's dtype, sizes,
strides, device and requires_grad with the plan's in one C call (rules.call_matcher), reads each
pointer once (the overlap test and the packing share them), packs the per-layer pointers (5
into the split kernel's buffer, 1-2 into the merge's) and makes the two driver calls. Anything
the one call does not pass (another mode, a tensor unlike the plan's, another current device)
takes the full check, which names what differs or launches the general way.
Measured against bare driver calls by bench/launch_overhead.py ("aot_plan_run").

What run() checks, and why that is enough: a layer's q, caches, scales, out and lse must have
the plan's dtypes, sizes and strides exactly (so the packed strides and grid fit them, and the
page ids validated at plan time are within every layer's cache), and be on the plan's device;
the caches must start at the address residues the plan's binary was compiled for (even for
int8/int4; vLLM's kv_align 8 record: K 0 and V 4 mod 8, SplitMerge.residues); out and lse may share no byte with the layer's
inputs or the step's table, lengths, req_idx and sinks (guards.Apart: their addresses compared);
no input may require grad while grad mode is on. It does not re-read lengths or page ids: they
were validated when the plan was made, and the table and lengths must not change while the plan
is used (the plan's point). A mismatch raises ValueError/TypeError naming the argument; nothing
is launched.

A plan owns its workspace (split partials): runs of one plan must be ordered, as layers on one
stream are; keep the plan alive while a CUDA graph that captured its runs may replay. A plan is
tied to one (window, sm_scale): alternating sliding-window layers take two plans.
"""
from __future__ import annotations

import torch

from . import decode as D
from . import guards, rules
from .kv_cache import FP8_DTYPES, check_page_values

_MATCH_REBUILDS = 4  # a plan re-derives its matcher this often (a new dispatch mode), then keeps the full check

class DecodePlan:
    """`decode` for one step, planned once and run per layer.

        plan = loader.DecodePlan(table, seq_lens, q=q0, k_cache=k0, v_cache=v0, k_scale=ks0, v_scale=vs0)
        for layer in range(n):
            plan.run(q[layer], k_cache[layer], v_cache[layer], out[layer], k_scale[layer], v_scale[layer])

    table, seq_lens, req_idx: the step's page table, lengths and rows (as `decode` takes them);
    their values must not change while the plan is used. q, k_cache, v_cache, k_scale, v_scale,
    out, lse: tensors with the metadata every layer's will have (any layer's own; their values
    are not read); out defaults to a contiguous tensor of q's shape and dtype, lse (with
    return_lse=True) to a contiguous [B, H] fp32 one. fp8 scales must be fp32 (or None).
    kv_format, scale_layout, sm_scale, window, sinks, num_splits, validate: as `decode` (validate checks the
    lengths and used page ids once, here). return_lse: `run` also writes the log-sum-exp.
    Errors as `decode`'s, raised here; `run` raises ValueError/TypeError naming the argument
    whose dtype, shape, strides or device differ from the plan's.
    """

    def __init__(self, table, seq_lens, *, q, k_cache, v_cache, k_scale=None, v_scale=None, out=None,
                 req_idx=None, kv_format="auto", scale_layout="group", sm_scale=None, window=None, sinks=None,
                 num_splits=None, return_lse=False, lse=None, validate=True):
        rules.tensor("DecodePlan", "q", q, (torch.float16, torch.bfloat16), dim=3)
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if return_lse and lse is None:
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        elif lse is not None and not return_lse:
            raise ValueError("lse is written only with return_lse=True")
        d = D.check_decode(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale,
                            window, sinks, num_splits, out, lse, scale_layout)
        if d.kv.fmt in FP8_DTYPES:
            if (k_scale is None) != (v_scale is None):
                raise ValueError("k_scale/v_scale: a DecodePlan takes both fp8 scales or neither")
            for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
                if s is not None and s.dtype != torch.float32:
                    raise TypeError(f"{name}: a DecodePlan takes fp8 scales in fp32 (got {s.dtype}); convert once")
        if validate:
            check_page_values(d)
        key = D.DECODE.key(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale,
                           window, sinks, num_splits, out, lse, scale_layout, None, False, 0.0)  # no score modifiers
        self._plan = plan = D.cached_plan(key, d, out)
        self._d = d  # holds table, seq_lens, req_idx and sinks alive: their pointers are packed
        self.return_lse = bool(return_lse)
        self.device = q.device
        self._meta = [rules.Meta(t) for t in (q, k_cache, v_cache, out)]
        self._expect = (*(m.dtype for m in self._meta), *(m.size for m in self._meta),
                        *(m.stride for m in self._meta), q.device)
        self._scale_meta = (rules.Meta(k_scale), rules.Meta(v_scale)) if k_scale is not None else None
        self._fp8 = d.kv.fmt in FP8_DTYPES
        self._lse_meta = rules.Meta(lse) if lse is not None else None
        self._halfword = plan.halfword
        self._mask, self._k_res, self._v_res = plan.residues  # the cache addresses the plan's binary takes
        # out and lse apart from every layer's inputs and from the step's own tensors, by address, every run
        self._apart = guards.Apart("DecodePlan.run", {"out": out, "lse": lse}, {
            "q": q, "k_cache": k_cache, "v_cache": v_cache, "k_scale": k_scale, "v_scale": v_scale},
            fixed={"table": table, "seq_lens": seq_lens, "req_idx": req_idx, "sinks": sinks})
        self._bound = plan.bind(table, seq_lens, req_idx, sinks, self.return_lse)
        self._lse_size = q.shape[:2]
        self._index = q.device.index
        self._meets = self._apart.on_pointers()
        self._rebuilds = 0
        self._adopt(self._bound, (q, k_cache, v_cache, out, k_scale, v_scale, lse))

    def _adopt(self, bound, tensors) -> None:
        """Run with `bound`'s launches (None: the general path), matching calls like `tensors`."""
        self._bound = b = bound
        self._match = self._matcher(*tensors)
        if b is not None:  # what run() reads of it, as attributes of the plan
            self._one, self._launch = b.one, b.run

    def _matcher(self, q, k_cache, v_cache, out, k_scale, v_scale, lse):
        """The run's one-call check over these tensors, or `rules.never` where runs take the full
        check: no prepared launch (CPU, the JIT fallback), or a tensor that requires grad (the
        full check refuses it when grad mode is on)."""
        tensors = (q, k_cache, v_cache, out, k_scale, v_scale, lse)
        if self._bound is None or any(t is not None and t.requires_grad for t in tensors):
            return rules.never
        return rules.call_matcher(*tensors)

    def _refuse(self, q, k_cache, v_cache, out, k_scale, v_scale, lse):
        names = ("q", "k_cache", "v_cache", "out")
        for name, m, t in zip(names, self._meta, (q, k_cache, v_cache, out)):
            if not isinstance(t, torch.Tensor) or not m.matches(t):
                err = TypeError if not isinstance(t, torch.Tensor) or t.dtype is not m.dtype else ValueError
                raise err(f"{name}: {rules.describe(t)}; this DecodePlan was made for {m.describe()} on {self.device}")
        if self._scale_meta is None:
            if k_scale is not None or v_scale is not None:
                raise ValueError("k_scale/v_scale: this DecodePlan was made without scales")
        else:
            for name, m, t in zip(("k_scale", "v_scale"), self._scale_meta, (k_scale, v_scale)):
                if not isinstance(t, torch.Tensor) or not m.matches(t):
                    raise ValueError(f"{name}: {rules.describe(t)}; this DecodePlan was made for {m.describe()}")
        if lse is not None:
            if self._lse_meta is None:
                raise ValueError("lse: this DecodePlan was made without return_lse=True")
            raise ValueError(f"lse: {rules.describe(lse)}; this DecodePlan was made for {self._lse_meta.describe()}")
        raise ValueError("inputs differ from the plan")  # not reached: one of the above differs

    def run(self, q, k_cache, v_cache, out, k_scale=None, v_scale=None, lse=None):
        """Decode one layer: `decode(q, k_cache, v_cache, <plan's table and lengths>, out=out, ...)`.

        q, k_cache, v_cache, out (and k_scale, v_scale for int8/int4/fp8-with-scales plans, lse
        for return_lse plans, allocated when None) must have the plan's dtypes, shapes, strides
        and device. Returns out, or (out, lse) for a return_lse plan.
        """
        if lse is None and self.return_lse:
            lse = torch.empty(self._lse_size, dtype=torch.float32, device=self.device)
        if self._match(q, k_cache, v_cache, out, k_scale, v_scale, lse) and _current_device() == self._index:
            qp, kp, vp, op = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr()
            if k_scale is None:
                ksp = vsp = self._one  # fp8 without scales reads 1.0; fp16/bf16 read none
            else:
                ksp, vsp = k_scale.data_ptr(), v_scale.data_ptr()
            lsep = None if lse is None else lse.data_ptr()
            if not (((kp - self._k_res) | (vp - self._v_res)) & self._mask
                    or self._meets(op, lsep, qp, kp, vp, ksp, vsp)):
                self._launch(qp, kp, vp, ksp, vsp, op, lsep, _current_stream(self._index))  # split_merge.Bound.run
                return (out, lse) if self.return_lse else out
        return self._run_checked(q, k_cache, v_cache, out, k_scale, v_scale, lse)

    def _run_checked(self, q, k_cache, v_cache, out, k_scale, v_scale, lse):
        """run() with every check spelled out: names what differs from the plan, else launches
        (the prepared way, or the general path: CPU, the JIT fallback, another current device)."""
        # Every layer tensor has the plan's dtype, size, strides and device (16 reads: the slow way).
        e, sm = self._expect, self._scale_meta
        try:
            ok = (q.dtype is e[0] and k_cache.dtype is e[1] and v_cache.dtype is e[2] and out.dtype is e[3]
                  and q.size() == e[4] and k_cache.size() == e[5] and v_cache.size() == e[6] and out.size() == e[7]
                  and q.stride() == e[8] and k_cache.stride() == e[9] and v_cache.stride() == e[10]
                  and out.stride() == e[11] and q.device == e[12] and k_cache.device == e[12]
                  and v_cache.device == e[12] and out.device == e[12])
            if ok and sm is not None:
                ok = sm[0].matches(k_scale) and sm[1].matches(v_scale)
        except AttributeError:  # not a tensor
            ok = False
        if not ok:
            self._refuse(q, k_cache, v_cache, out, k_scale, v_scale, None)
        if sm is None and (k_scale is not None or v_scale is not None):
            if not self._fp8:
                self._refuse(q, k_cache, v_cache, out, k_scale, v_scale, None)
            for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):  # fp8 plan made with unit scales
                if t is not None:
                    raise ValueError(f"{name}: this DecodePlan was made with fp8 scales of 1.0 (None)")
        if self.return_lse:
            if not self._lse_meta.matches(lse):
                self._refuse(q, k_cache, v_cache, out, k_scale, v_scale, lse)
        elif lse is not None:
            self._refuse(q, k_cache, v_cache, out, k_scale, v_scale, lse)
        if torch.is_grad_enabled():
            guards.refuse_grad("DecodePlan.run", q=q, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale,
                               v_scale=v_scale, out=out, lse=lse)
        self._apart(out, lse, q, k_cache, v_cache, k_scale, v_scale)
        bound = self._bound
        if bound is not None and torch._C._cuda_getDevice() == bound.index:
            qp, kp, vp = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr()
            if self._halfword:
                self._plan.check_halfword(kp, vp)
            if k_scale is not None:
                ksp, vsp = k_scale.data_ptr(), v_scale.data_ptr()
            else:
                ksp = vsp = bound.one  # fp8 without scales reads 1.0; fp16/bf16 read none
            bound.run(qp, kp, vp, ksp, vsp, out.data_ptr(), None if lse is None else lse.data_ptr(),
                      torch._C._cuda_getCurrentRawStream(bound.index))
            if self._rebuilds < _MATCH_REBUILDS:  # checked and launched, yet not matched: another dispatch mode
                self._rebuilds += 1
                self._match = self._matcher(q, k_cache, v_cache, out, k_scale, v_scale, lse)
        else:
            d = self._d  # the general path: CPU (interpreter), the JIT fallback, another current device
            self._plan.launch(q, k_cache, v_cache, k_scale, v_scale, d.table, d.req_idx, d.seq_lens, d.sinks, out,
                              lse)
        return (out, lse) if self.return_lse else out


# torch's own bindings, called directly (a CPU-only torch has none: its plans never match)
_current_device = getattr(torch._C, "_cuda_getDevice", None)
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
