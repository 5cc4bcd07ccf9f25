"""`MLADecodePlan`: one MLA decode step planned once, then run per layer.

As `DecodePlan` (decode_plan.py) for `decode`: the constructor runs every check `mla_decode` runs
(the value checks too, once) on tensors that stand for every layer's, and keeps the plan
(variant, grids, split count, every non-pointer argument); `run(q, kv_cache, out)` compares each
layer tensor's dtype, size, stride and device with the plan's and launches the plan's two
kernels with that layer's pointers (split_merge.Bound, as DecodePlan: the plan's own launches
and workspace, the step's table and lengths packed once). As DecodePlan's, a run first tries one
C call over its tensors (rules.call_matcher) and reads each pointer once; anything else takes
the full check. out and lse may share no byte with the layer's inputs or the step's table,
lengths and req_idx (checked by address every run). The split count depends on no length, so
runs captured in a CUDA graph replay at any length; the table and lengths must not change
shape while the plan is used.
"""
from __future__ import annotations

import torch

from . import guards, rules
from . import mla as M
from .decode_plan import _MATCH_REBUILDS
from .kv_cache import as_paged, check_page_values

OP = "MLADecodePlan"


class MLADecodePlan:
    """`mla_decode` for one step, planned once and run per layer.

        plan = loader.MLADecodePlan(table, seq_lens, q=q0, kv_cache=kv0, v_head_dim=512)
        for layer in range(n):
            plan.run(q[layer], kv_cache[layer], out[layer])

    table, seq_lens, req_idx: the step's page table, lengths and rows; q, kv_cache, out, lse,
    k_scale: tensors with the metadata every layer's will have (values not read); out defaults
    to a contiguous [B, H, v_head_dim] tensor in q's dtype, lse (return_lse=True) to a
    contiguous [B, H] fp32 one. fp8 scales must be fp32 (or None: 1.0). kv_format, sm_scale,
    num_splits, validate: as `mla_decode` (validate checks lengths and used page ids once,
    here). Errors as `mla_decode`'s, raised here; `run` raises ValueError/TypeError naming the
    argument whose dtype, shape, strides or device differ from the plan's.
    """

    def __init__(self, table, seq_lens, *, q, kv_cache, v_head_dim=512, k_scale=None, out=None, req_idx=None,
                 kv_format="auto", sm_scale=None, num_splits=None, return_lse=False, lse=None, validate=True):
        rules.tensor(OP, "q", q, (torch.float16, torch.bfloat16), dim=3)
        M.check_latent(OP, kv_cache, v_head_dim)
        if out is None:
            out = torch.empty((*q.shape[:2], v_head_dim), dtype=q.dtype, device=q.device)
        if return_lse and lse is None:
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        elif lse is not None and not return_lse:
            raise ValueError("lse is written only with return_lse=True")
        if k_scale is not None and isinstance(k_scale, torch.Tensor) and k_scale.dtype != torch.float32:
            raise TypeError(f"k_scale: an MLADecodePlan takes its fp8 scale in fp32 (got {k_scale.dtype}); convert once")
        c = M.check(q, kv_cache, kv_cache[..., :v_head_dim], table, seq_lens, req_idx, k_scale, k_scale, kv_format,
                    sm_scale, None, None, num_splits, True, out, lse)
        if validate:
            check_page_values(c)
        key = M.MLA_DECODE.key(q, kv_cache, kv_cache[..., :v_head_dim], table, seq_lens, req_idx, k_scale, k_scale,
                               kv_format, sm_scale, None, None, num_splits, True, out, lse)
        self._plan = plan = M.cached_plan(key, c)
        self._c = c  # holds table, seq_lens and req_idx alive
        self.v_head_dim = v_head_dim
        self.return_lse = bool(return_lse)
        self.device = q.device
        self._meta = [rules.Meta(t) for t in (q, kv_cache, out)]
        self._scale_meta = rules.Meta(k_scale) if k_scale is not None else None
        self._lse_meta = rules.Meta(lse) if lse is not None else None
        self._bound = plan.bind(table, seq_lens, req_idx, None, self.return_lse)
        self._apart = guards.Apart(OP + ".run", {"out": out, "lse": lse}, {"q": q, "kv_cache": kv_cache,
                                                                           "k_scale": k_scale},
                                   fixed={"table": table, "seq_lens": seq_lens, "req_idx": req_idx})
        self._meets = self._apart.on_pointers()
        self._lse_size = q.shape[:2]
        self._index = q.device.index
        self._rebuilds = 0
        self._match = self._matcher(q, kv_cache, out, k_scale, lse)

    def _matcher(self, q, kv_cache, out, k_scale, lse):
        """The run's one-call check (rules.call_matcher), or `rules.never`: no prepared launch, or a
        tensor that requires grad (the full check refuses it when grad mode is on)."""
        tensors = (q, kv_cache, out, k_scale, lse)
        if self._bound is None or any(t is not None and t.requires_grad for t in tensors):
            return rules.never
        return rules.call_matcher(*tensors)

    def _check(self, q, kv_cache, out, k_scale, lse) -> None:
        for name, m, t in zip(("q", "kv_cache", "out"), self._meta, (q, kv_cache, out)):
            if not isinstance(t, torch.Tensor) or not m.matches(t):
                err = TypeError if not isinstance(t, torch.Tensor) or t.dtype is not m.dtype else ValueError
                raise err(f"{name}: {rules.describe(t)}; this MLADecodePlan was made for {m.describe()} on {self.device}")
        if self._scale_meta is None:
            if k_scale is not None:
                raise ValueError("k_scale: this MLADecodePlan was made without a scale")
        elif not isinstance(k_scale, torch.Tensor) or not self._scale_meta.matches(k_scale):
            raise ValueError(f"k_scale: {rules.describe(k_scale)}; this MLADecodePlan was made for "
                             f"{self._scale_meta.describe()}")
        if lse is not None:
            if self._lse_meta is None:
                raise ValueError("lse: this MLADecodePlan was made without return_lse=True")
            if not self._lse_meta.matches(lse):
                raise ValueError(f"lse: {rules.describe(lse)}; this MLADecodePlan was made for {self._lse_meta.describe()}")

    def run(self, q, kv_cache, out, k_scale=None, lse=None):
        """One layer: `mla_decode(q, kv_cache, <plan's table and lengths>, out=out, ...)`. Returns
        out, or (out, lse) for a return_lse plan (lse allocated when None)."""
        if lse is None and self.return_lse:
            lse = torch.empty(self._lse_size, dtype=torch.float32, device=self.device)
        if self._match(q, kv_cache, out, k_scale, lse) and _current_device() == self._index:
            qp, kp, op = q.data_ptr(), kv_cache.data_ptr(), out.data_ptr()
            ksp = self._bound.one if k_scale is None else k_scale.data_ptr()
            lsep = None if lse is None else lse.data_ptr()
            if not self._meets(op, lsep, qp, kp, ksp):
                self._bound.run(qp, kp, kp, ksp, ksp, op, lsep, _current_stream(self._index))
                return (out, lse) if self.return_lse else out
        return self._run_checked(q, kv_cache, out, k_scale, lse)

    def _run_checked(self, q, kv_cache, out, k_scale, lse):
        """run() with every check spelled out (names what differs from the plan), then the launch."""
        self._check(q, kv_cache, out, k_scale, lse)
        if torch.is_grad_enabled():
            guards.refuse_grad(OP + ".run", q=q, kv_cache=kv_cache, k_scale=k_scale, out=out, lse=lse)
        self._apart(out, lse, q, kv_cache, k_scale)
        bound = self._bound
        if bound is not None and torch._C._cuda_getDevice() == bound.index:
            kp = kv_cache.data_ptr()
            ksp = bound.one if k_scale is None else k_scale.data_ptr()
            bound.run(q.data_ptr(), kp, kp, ksp, ksp, out.data_ptr(), None if lse is None else lse.data_ptr(),
                      torch._C._cuda_getCurrentRawStream(bound.index))
            if self._rebuilds < _MATCH_REBUILDS:  # checked and launched, yet not matched: another dispatch mode
                self._rebuilds += 1
                self._match = self._matcher(q, kv_cache, out, k_scale, lse)
        else:
            c = self._c  # the general path: CPU (interpreter), the JIT fallback, another current device
            k = as_paged(kv_cache)
            self._plan.launch(q, k, k[..., :self.v_head_dim], k_scale, k_scale, c.table, c.req_idx, c.seq_lens, None,
                              out, lse)
        return (out, lse) if self.return_lse else out


# torch's own bindings, called directly (a CPU-only torch has none: its plans never match)
_current_device = getattr(torch._C, "_cuda_getDevice", None)
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
