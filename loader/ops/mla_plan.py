"""`MLADecodePlan`: one MLA decode step planned once, then run per layer.

As `DecodePlan` (decode_plan.py) for `decode`: the constructor runs every check `mla_decode` runs
(the value checks too, once) on tensors that stand for every layer's, and keeps the plan
(variant, grids, split count, every non-pointer argument); `run(q, kv_cache, out)` compares each
layer tensor's dtype, size, stride and device with the plan's and launches the plan's two
kernels with that layer's pointers (mla.py's launch: the prepared binaries and the stream's
workspace). The split count depends on no length, so runs captured in a CUDA graph replay at
any length; the table and lengths must not change shape while the plan is used.
"""
from __future__ import annotations

import torch

from . import mla as M
from .decode import _tensor
from .decode_plan import _describe, _Meta


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
        _tensor(q, "q", (torch.float16, torch.bfloat16), dim=3)
        _tensor(kv_cache, "kv_cache", dim=(3, 4))
        if isinstance(v_head_dim, bool) or not isinstance(v_head_dim, int):
            raise TypeError(f"v_head_dim must be an int, got {type(v_head_dim).__name__}")
        if not 0 < v_head_dim <= kv_cache.shape[-1]:
            raise ValueError(f"v_head_dim {v_head_dim} must be in [1, {kv_cache.shape[-1]}] (the cache's head size)")
        if out is None:
            out = torch.empty((*q.shape[:2], v_head_dim), dtype=q.dtype, device=q.device)
        if return_lse and lse is None:
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        elif lse is not None and not return_lse:
            raise ValueError("lse is written only with return_lse=True")
        if k_scale is not None and isinstance(k_scale, torch.Tensor) and k_scale.dtype != torch.float32:
            raise TypeError(f"k_scale: an MLADecodePlan takes its fp8 scale in fp32 (got {k_scale.dtype}); convert once")
        c = M.check(q, kv_cache, kv_cache[..., :v_head_dim], table, seq_lens, req_idx, k_scale, k_scale, kv_format,
                    sm_scale, None, None, num_splits, out, lse, True)
        if validate:
            M._check_decode_values(c)
        self._plan = M._make_plan(c, out)
        self._c = c  # holds table, seq_lens and req_idx alive
        self.v_head_dim = v_head_dim
        self.return_lse = bool(return_lse)
        self.device = q.device
        self._meta = [_Meta(t) for t in (q, kv_cache, out)]
        self._scale_meta = _Meta(k_scale) if k_scale is not None else None
        self._lse_meta = _Meta(lse) if lse is not None else None

    def _check(self, q, kv_cache, out, k_scale, lse) -> None:
        for name, m, t in zip(("q", "kv_cache", "out"), self._meta, (q, kv_cache, out)):
            if not isinstance(t, torch.Tensor) or not m.matches(t):
                err = TypeError if not isinstance(t, torch.Tensor) or t.dtype is not m.dtype else ValueError
                raise err(f"{name}: {_describe(t)}; this MLADecodePlan was made for {m.describe()} on {self.device}")
        if self._scale_meta is None:
            if k_scale is not None:
                raise ValueError("k_scale: this MLADecodePlan was made without a scale")
        elif not isinstance(k_scale, torch.Tensor) or not self._scale_meta.matches(k_scale):
            raise ValueError(f"k_scale: {_describe(k_scale)}; this MLADecodePlan was made for "
                             f"{self._scale_meta.describe()}")
        if lse is not None:
            if self._lse_meta is None:
                raise ValueError("lse: this MLADecodePlan was made without return_lse=True")
            if not self._lse_meta.matches(lse):
                raise ValueError(f"lse: {_describe(lse)}; this MLADecodePlan was made for {self._lse_meta.describe()}")

    def run(self, q, kv_cache, out, k_scale=None, lse=None):
        """One layer: `mla_decode(q, kv_cache, <plan's table and lengths>, out=out, ...)`. Returns
        out, or (out, lse) for a return_lse plan (lse allocated when None)."""
        self._check(q, kv_cache, out, k_scale, lse)
        if self.return_lse and lse is None:
            lse = torch.empty(self._lse_meta.size, dtype=torch.float32, device=self.device)
        c = self._c
        k = M._as_paged(kv_cache)
        M._launch(self._plan, c, q, k, k[..., :self.v_head_dim], k_scale, k_scale, c.table, c.req_idx, c.seq_lens,
                  None, out, lse)
        return (out, lse) if self.return_lse else out
