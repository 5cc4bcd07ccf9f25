"""`PrefixPrefillPlan`: one prefix_prefill step planned once, then run per layer.

Every attention layer of a prefill step reads the same block table, query offsets and lengths.
The constructor runs every check `prefix_prefill` runs (the lengths and used block ids too, once,
one device sync) on tensors that stand for every layer's (values not read), picks the kernel
(on sm90 a warp-specialized Gluon kernel where `prefix_prefill.kernel_for` says so, else the
Triton kernel) and prepares its launch into a private parameter buffer (every option and the
step's ALiBi slopes or multimodal ranges packed once). `run(q, k, v, k_cache, v_cache, out,
k_scale, v_scale)` is the plan.Plan sequence: one C call compares the layer's tensors with the
plan's, each pointer read once for the address residues of the chosen binary, the overlap test
(out against every other argument and the step's tensors) and the packing, one driver call.
A layer whose caches start at an address the plan's binary does not take (an odd int8 cache, a
Gluon kernel's alignment) takes the eager op, which names a bad one. The grid follows tokens and
requests, never lengths: runs capture into a CUDA graph that replays at any lengths.
"""
from __future__ import annotations

import math

import torch

from aotc.kernels.prefix_prefill import spec as _spec

from . import prefix_prefill as PP
from .plan import Plan

OP = "PrefixPrefillPlan"


class PrefixPrefillPlan(Plan):
    """`prefix_prefill` for one step, planned once and run per layer.

        plan = loader.PrefixPrefillPlan(block_table, query_start_loc, seq_lens, q=q0, k=k0, v=v0,
                                        k_cache=kc0, v_cache=vc0)
        for layer in range(n):
            plan.run(q[layer], k[layer], v[layer], k_cache[layer], v_cache[layer], out[layer])

    block_table, query_start_loc, seq_lens: the step's (as `prefix_prefill` takes them); their
    values must not change while the plan is used except between CUDA-graph replays (then
    unvalidated). q, k, v (both None: the new tokens' keys read from the cache), k_cache, v_cache,
    k_scale, v_scale, out: tensors with the metadata every layer's will have (values not read);
    out defaults to a contiguous tensor of q's shape (float8_e4m3fn with out_scale). Every other
    option as `prefix_prefill`, fixed for the plan (sinks, out_scale, alibi_slopes and
    mm_prefix_range kept by it); validate checks the lengths and used block ids once, here.
    kv_format "int4_rht" has no plan (its q and out are rotated around the kernel). Errors as
    `prefix_prefill`'s, raised here; `run` raises ValueError/TypeError naming the argument whose
    dtype, shape, strides or device differ from the plan's, or an out that overlaps another one.
    """

    NAME = OP
    ARGS = ("q", "k", "v", "k_cache", "v_cache", "out", "k_scale", "v_scale")
    OUTPUTS = ("out",)

    def __init__(self, block_table, query_start_loc, seq_lens, *, q, k_cache, v_cache, k=None, v=None, k_scale=None,
                 v_scale=None, out=None, kv_layout="nhd", kv_format="auto", sm_scale=None, window=None, sinks=None,
                 out_scale=None, skip_decode=False, v_pack=0, alibi_slopes=None, alibi_sqrt=False, softcap=0.0,
                 chunk_lookback=-1, mm_prefix_range=None, mm_clamp=False, validate=True):
        if kv_format == "int4_rht":
            raise ValueError(f"{OP}: kv_format 'int4_rht' has no plan (q and out are rotated around the kernel); "
                             f"call prefix_prefill")
        cache = PP._validate(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, kv_layout, kv_format,
                             k_scale, v_scale, sm_scale, window, sinks, out_scale, out, v_pack, alibi_slopes,
                             alibi_sqrt, softcap, chunk_lookback, mm_prefix_range, mm_clamp)
        if out is None:
            out = torch.empty(q.shape, dtype=torch.float8_e4m3fn if out_scale is not None else q.dtype,
                              device=q.device)
        if validate:
            PP._check_lengths(q.shape[0], k_cache, block_table, query_start_loc, seq_lens, cache.bs, k is None)
        self.options = dict(kv_layout=kv_layout, kv_format=kv_format, sm_scale=sm_scale, window=window, sinks=sinks,
                            out_scale=out_scale, skip_decode=skip_decode, v_pack=v_pack, alibi_slopes=alibi_slopes,
                            alibi_sqrt=alibi_sqrt, softcap=softcap, chunk_lookback=chunk_lookback,
                            mm_prefix_range=mm_prefix_range, mm_clamp=mm_clamp)
        self.step = (block_table, query_start_loc, seq_lens)
        sm = 1.0 / math.sqrt(q.shape[2]) if sm_scale is None else float(sm_scale)
        axes, grid, kargs = PP.launch_plan(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out,
                                           kv_layout, kv_format, k_scale, v_scale, sm, int(window or 0), sinks,
                                           out_scale, bool(skip_decode), int(v_pack), alibi_slopes, bool(alibi_sqrt),
                                           float(softcap), int(chunk_lookback), mm_prefix_range, bool(mm_clamp))
        launch = self._prepare(q, axes, grid, kargs)
        if launch is not None:
            self.go = launch.launch
        dummy = PP._dummy_f32(q.device).data_ptr()  # absent scales, sinks, out_scale: never read (flags say so)
        self._fixed = (block_table.data_ptr(), query_start_loc.data_ptr(), seq_lens.data_ptr(), dummy,
                       dummy if out_scale is None else out_scale.data_ptr(), dummy if sinks is None else sinks.data_ptr())
        self.setup((q, k, v, k_cache, v_cache, out, k_scale, v_scale), {
            "block_table": block_table, "query_start_loc": query_start_loc, "seq_lens": seq_lens, "sinks": sinks,
            "out_scale": out_scale, "alibi_slopes": alibi_slopes, "mm_prefix_range": mm_prefix_range},
            _ORDER, launch is not None, q.device)

    def _prepare(self, q, axes, grid, kargs):
        """The chosen kernel's Launch (None: the general path), and the cache address residues and
        alignment a run's pointers must meet for it."""
        spec = PP.kernel_for(axes, kargs)
        gluon = spec is not _spec.PREFIX_PREFILL
        self._k_mask = self._v_mask = PP.cache_address_mask(axes)
        self._aligned_only = gluon  # a Gluon kernel's one binary is ALIGNED: misaligned pointers take the general path
        if spec is _spec.PREFIX_PREFILL_WS_REC:  # its rows' loads (prefix_prefill.kernel_for)
            k_vec, v_vec = (8, 4) if axes["scales"] == "token" else (16, 16)
            self._k_mask, self._v_mask = self._k_mask | (k_vec - 1), self._v_mask | (v_vec - 1)
        if gluon:
            axes = _spec.ws_axes(axes)
        self._launch = None
        if not PP._prepares(q):
            return None
        self._launch = PP.prepared_launch(spec, axes, grid, kargs, q.device.index, aligned_only=gluon)
        return self._launch

    def run(self, q, k, v, k_cache, v_cache, out, k_scale=None, v_scale=None):
        """One layer: `prefix_prefill(q, k, v, k_cache, v_cache, <plan's block_table, query_start_loc,
        seq_lens>, out=out, k_scale=k_scale, v_scale=v_scale, ...)`. Returns out."""
        if not (self.match(q, k, v, k_cache, v_cache, out, k_scale, v_scale)
                and self.steady_run(q, k, v, k_cache, v_cache, out, k_scale, v_scale)):
            self.run_checked((q, k, v, k_cache, v_cache, out, k_scale, v_scale))
        return out

    def pointers(self, q, k, v, k_cache, v_cache, out, k_scale, v_scale):
        """The kernel's 13 leading pointers (spec.PREFIX_PREFILL's order), or None where the caches'
        addresses (or, for a Gluon kernel, any pointer's alignment) are not the binary's."""
        kcp, vcp = k_cache.data_ptr(), v_cache.data_ptr()
        if kcp & self._k_mask or vcp & self._v_mask:
            return None
        qp = q.data_ptr()
        bt, qsl, sl, dummy, osp, snp = self._fixed
        p = (qp, qp if k is None else k.data_ptr(), qp if v is None else v.data_ptr(), kcp, vcp, out.data_ptr(), bt,
             qsl, sl, dummy if k_scale is None else k_scale.data_ptr(), dummy if v_scale is None else v_scale.data_ptr(),
             osp, snp)
        if self._aligned_only and self._launch.misaligned(p):
            return None
        return p

    def general(self, q, k, v, k_cache, v_cache, out, k_scale, v_scale) -> None:
        """The eager op (CPU, the JIT fallback, another current device, addresses the prepared binary does not take)."""
        PP.prefix_prefill(q, k, v, k_cache, v_cache, *self.step, k_scale=k_scale, v_scale=v_scale, out=out,
                          validate=False, **self.options)


# What each of the kernel's leading pointers holds (spec.PREFIX_PREFILL's order); the step's own
# (block_table, query_start_loc, seq_lens, out_scale, sinks) are compared as the plan's fixed tensors
_ORDER = ("q", "k", "v", "k_cache", "v_cache", "out", None, None, None, "k_scale", "v_scale", None, None)
