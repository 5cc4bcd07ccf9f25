"""`MLADecodePlan`: one MLA decode step planned once, then run per layer.

As `DecodePlan` (decode_plan.py) for `decode`: the constructor runs every check `mla_decode` runs
(the value checks too, once) on tensors that stand for every layer's, and keeps the plan
(variant, grids, split count, every non-pointer argument); `run(q, kv_cache, out)` compares each
layer tensor's dtype, size, stride and device with the plan's and launches the plan's two
kernels with that layer's pointers (split_merge.Bound, as DecodePlan: the plan's own launches
and workspace, the step's table and lengths packed once). The split count depends on no length, so runs captured in a CUDA graph replay at
any length; the table and lengths must not change shape while the plan is used.
"""
from __future__ import annotations

import torch

from . import mla as M
from . import rules
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
        self._check(q, kv_cache, out, k_scale, lse)
        if self.return_lse and lse is None:
            lse = torch.empty(self._lse_meta.size, dtype=torch.float32, device=self.device)
        bound = self._bound
        if bound is not None and torch._C._cuda_getDevice() == bound.index:
            kp = kv_cache.data_ptr()
            ksp = bound.one if k_scale is None else k_scale.data_ptr()
            bound.run(q.data_ptr(), kp, kp, ksp, ksp, out.data_ptr(), None if lse is None else lse.data_ptr(),
                      torch._C._cuda_getCurrentRawStream(bound.index))
        else:
            c = self._c  # the general path: CPU (interpreter), the JIT fallback, another current device
            k = as_paged(kv_cache)
            self._plan.launch(q, k, k[..., :self.v_head_dim], k_scale, k_scale, c.table, c.req_idx, c.seq_lens, None,
                              out, lse)
        return (out, lse) if self.return_lse else out
