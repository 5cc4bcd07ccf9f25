"""Paged decode with unequal key and value head sizes: `mla_decode` (one latent cache whose first
`v_head_dim` channels are the value, DeepSeek-style MLA) and the path `decode` takes when its
k_cache and v_cache head sizes differ (`split_heads_decode`). Kernels: kernels/decode/mla_kernel.py (its table: mla_spec.py).

Rules (`check`, with kv_cache.py's row checks), plan (`_make_plan`: a split_merge.SplitMerge,
cached by the inputs' metadata as decode's are), launch (`SplitMerge.launch`, decode's). Declared
once as `MLA_DECODE` (library.Op): the `torch.ops.aotc.mla_decode` op (mutating `out`/`lse`), its
fake and its plan key follow from it, so `torch.compile(fullgraph=True)` traces through it. The
split count follows mla_spec.num_splits (batch, heads, SM count, occupancy), never lengths, so
a captured CUDA graph replays at any length.
"""
from __future__ import annotations

import math

import torch

from aotc.kernels.decode import spec as DS
from aotc.kernels.decode import mla_spec as S

from ..sm_count import cuda_sm_count
from . import guards, library, rules
from .kv_cache import FLOAT_NAMES, FP8_NAMES, as_paged, check_page_values, check_rows, check_storage, float_format
from .split_merge import Eager, SplitMerge, split_programs_per_sm

OP = "mla_decode"


def _format(kv_format: str, cache: torch.Tensor, q_dtype) -> str:
    """The cache format: fp16/bf16 (q's dtype), fp8 (a float8 dtype, or its bytes with an explicit kv_format)."""
    if kv_format == "auto":
        fmt = float_format(cache.dtype)
        if fmt is None:
            raise TypeError(f"k_cache: dtype {cache.dtype}; unequal-head decode reads fp16, bf16 or fp8 caches "
                            f"(int8/uint8 bytes need kv_format='fp8_e4m3' or 'fp8_e5m2')")
    elif kv_format not in S.KV_FORMATS:
        raise ValueError(f"kv_format must be 'auto' or one of {S.KV_FORMATS} for unequal head sizes, got {kv_format!r}")
    else:
        fmt = check_storage("k_cache", kv_format, cache)
    if fmt in ("fp16", "bf16") and cache.dtype != q_dtype:
        raise TypeError(f"k_cache: an {fmt} cache needs an {fmt} query, got q of dtype {q_dtype}")
    return fmt


def _one_scale(scale, name, device):
    if scale is None:
        return
    rules.tensor(OP, name, scale, (torch.float16, torch.bfloat16, torch.float32), device=device)
    if scale.numel() != 1:
        raise ValueError(f"{name}: unequal-head decode takes one fp8 scale (a one-element tensor), got shape "
                         f"{tuple(scale.shape)}")


class _Call:
    """A checked call, in the attribute names kv_cache.check_page_values reads (q, kv.k, table, ...)."""

    __slots__ = ("q", "kv", "k", "v", "table", "seq_lens", "req_idx", "k_scale", "v_scale", "sinks", "fmt",
                 "sm_scale", "window", "splits", "latent", "out", "lse")

    def __init__(self, **values):
        for name, value in values.items():
            setattr(self, name, value)
        self.kv = self  # check_page_values reads d.kv.k


def check(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale, window, sinks,
          num_splits, latent, out, lse=None) -> _Call:
    """Every check that needs no tensor values (safe under tracing and graph capture); v_cache is
    the latent cache's first d_v channels when `latent`."""
    rules.tensor(OP, "q", q, (torch.float16, torch.bfloat16), dim=3)
    dev = q.device
    batch, q_heads, d_qk = q.shape
    if batch > DS.MAX_BATCH:
        raise ValueError(f"q: batch {batch} is over {DS.MAX_BATCH} (the split grid's second dimension)")
    rules.unit_last(OP, "q", q)
    k_name = "kv_cache" if latent else "k_cache"
    rules.tensor(OP, k_name, k_cache, dim=(3, 4), device=dev)
    rules.tensor(OP, "v_cache", v_cache, dim=(3, 4), device=dev)
    k, v = as_paged(k_cache), as_paged(v_cache)
    if k.shape[-1] != d_qk:
        raise ValueError(f"{k_name}: head size {k.shape[-1]} (last dim of {tuple(k_cache.shape)}) must be q's "
                         f"{d_qk}")
    d_v = v.shape[-1]
    if not latent and (v.shape[:3] != k.shape[:3] or v.dtype != k.dtype):
        raise ValueError(f"v_cache ({tuple(v_cache.shape)}, {v_cache.dtype}) must match k_cache "
                         f"({tuple(k_cache.shape)}, {k_cache.dtype}) in every dim but the last")
    fmt = _format(kv_format, k, q.dtype)
    S.split_axes(FLOAT_NAMES[q.dtype], fmt, d_qk, d_v, "latent" if latent else "separate")  # head sizes
    rules.unit_last(OP, k_name, k)
    rules.unit_last(OP, "v_cache", v)
    kv_heads, page_size = k.shape[2], k.shape[1]
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
    if page_size < 1 or page_size & (page_size - 1) or page_size > S.MAX_PAGE_SIZE:
        raise ValueError(f"{k_name}: page size {page_size} (dim 1 of {tuple(k_cache.shape)}) must be a power of two "
                         f"in [1, {S.MAX_PAGE_SIZE}]")
    if fmt in FP8_NAMES.values():
        _one_scale(k_scale, "k_scale", dev)
        _one_scale(v_scale, "v_scale", dev)
    elif k_scale is not None or v_scale is not None:
        raise ValueError(f"k_scale/v_scale are for fp8 caches, not {fmt}")
    check_rows(OP, table, seq_lens, req_idx, sinks, batch, q_heads, dev)
    rules.tensor(OP, "out", out, (q.dtype,), dim=3, device=dev)
    if tuple(out.shape) != (batch, q_heads, d_v):
        raise ValueError(f"out: shape {tuple(out.shape)}, expected [batch, q_heads, v_head_dim] = "
                         f"{(batch, q_heads, d_v)}")
    rules.unit_last(OP, "out", out)
    if lse is not None:
        rules.tensor(OP, "lse", lse, (torch.float32,), dim=2, device=dev)
        if lse.shape != q.shape[:2]:
            raise ValueError(f"lse: shape {tuple(lse.shape)}, expected [batch, q_heads] = {tuple(q.shape[:2])}")
        rules.unit_last(OP, "lse", lse)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(d_qk)
    elif not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be a finite float, got {sm_scale!r}")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"window must be None or an int >= 1, got {window!r}")
    if num_splits is not None and not (isinstance(num_splits, int) and 1 <= num_splits <= DS.MAX_SPLITS):
        raise ValueError(f"num_splits must be None or an int in [1, {DS.MAX_SPLITS}], got {num_splits!r}")
    if page_size * table.shape[1] > rules.I32_MAX:
        raise ValueError(f"table: {table.shape[1]} pages of {page_size} tokens exceed int32 token indices")
    for name, t in (("q", q), (k_name, k), ("v_cache", v), ("table", table), ("out", out), ("lse", lse)):
        if t is not None and max(t.stride(), default=0) > rules.I32_MAX:
            raise ValueError(f"{name}: strides {t.stride()} exceed int32")
    guards.check_outputs(OP, {"out": out, "lse": lse}, {"q": q, k_name: k_cache, "v_cache": v_cache, "table": table,
                                                        "seq_lens": seq_lens, "req_idx": req_idx, "k_scale": k_scale,
                                                        "v_scale": v_scale, "sinks": sinks})
    return _Call(q=q, k=k, v=v, table=table, seq_lens=seq_lens, req_idx=req_idx, k_scale=k_scale, v_scale=v_scale,
                 sinks=sinks, fmt=fmt, sm_scale=float(sm_scale), window=window or 0, splits=num_splits, latent=latent,
                 out=out, lse=lse)


def _arch(q) -> int:
    if not q.is_cuda:
        return 0
    major, minor = torch.cuda.get_device_capability(q.device)
    return 10 * major + minor


def _sm_count(device) -> int:
    return cuda_sm_count(device) if device.type == "cuda" else 2  # interpreter runs: few programs


def _make_plan(c: _Call, out) -> SplitMerge:
    q, k, v, table = c.q, c.k, c.v, c.table
    batch, q_heads, d_qk = q.shape
    kv_heads, d_v = k.shape[2], v.shape[-1]
    group = q_heads // kv_heads
    arch = _arch(q)
    tile = S.choose_tile(group, arch, "latent" if c.latent else "separate")
    fp8 = c.fmt in FP8_NAMES.values()
    split_axes = S.split_axes(FLOAT_NAMES[q.dtype], c.fmt, d_qk, d_v, "latent" if c.latent else "separate", tile)
    split_ints = [c.sm_scale, c.window, int(c.req_idx is not None), k.shape[1].bit_length() - 1, table.shape[1],
                  table.stride(0), q_heads, group, q.stride(0), q.stride(1), *k.stride()[:3], *v.stride()[:3]]
    splits = c.splits
    if not splits:
        per_sm = split_programs_per_sm(S.SPLIT, split_axes, fp8, fp8, q, k, v, c.k_scale, c.v_scale, table,
                                       c.req_idx, c.seq_lens, split_ints)
        splits = S.num_splits(batch, kv_heads, group, tile, _sm_count(q.device), per_sm,
                              S.max_splits(split_axes, arch))
    n_o, n_lse = DS.workspace_elements(batch, q_heads, splits, d_v)
    lse = c.lse
    merge_ints = [int(c.sinks is not None), int(lse is not None), q_heads, splits, out.stride(0), out.stride(1),
                  lse.stride(0) if lse is not None else 0]
    merge_axes = S.merge_axes(FLOAT_NAMES[out.dtype], d_v, splits)
    return SplitMerge((S.SPLIT, split_axes, S.split_grid(batch, kv_heads, group, tile, splits), split_ints),
                      (S.merge_spec(d_v), merge_axes, DS.merge_grid(batch, q_heads, merge_axes), merge_ints),
                      n_o, n_lse, q.device, c.fmt, fp8, fp8, False)


def _run_checked(c: _Call) -> None:
    _make_plan(c, c.out).launch(c.q, c.k, c.v, c.k_scale, c.v_scale, c.table, c.req_idx, c.seq_lens, c.sinks, c.out,
                                c.lse)


MLA_DECODE = library.Op(
    "mla_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor table, Tensor seq_lens, Tensor? req_idx, "
    "Tensor? k_scale, Tensor? v_scale, str kv_format, float? sm_scale, SymInt? window, Tensor? sinks, "
    "SymInt? num_splits, bool latent, Tensor(a!) out, Tensor(b!)? lse=None) -> ()", check=check, run=_run_checked)
_plans = rules.PlanCache()
# mla_decode's unvalidated steady states (split_merge.Eager), tried before anything else.
_recent = rules.Recent()
_compiling = torch.compiler.is_compiling


def cached_plan(key, c: _Call) -> SplitMerge:
    """The plan of `key` (made from the checked call `c` when it is new)."""
    plan = _plans.get(key) if key is not None else None
    return plan if plan is not None else _plans.put(key, _make_plan(c, c.out))


def _run(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale, window, sinks,
         num_splits, latent, out, lse, validate) -> SplitMerge:
    try:
        key = MLA_DECODE.key(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale,
                             window, sinks, num_splits, latent, out, lse)
        plan = _plans.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable extras: the checks say what is wrong
        key = plan = None
    if plan is None or validate:
        c = check(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale, window,
                  sinks, num_splits, latent, out, lse)
        if validate:
            check_page_values(c)
        if plan is None:
            plan = cached_plan(key, c)
    plan.launch(q, k_cache, v_cache, k_scale, v_scale, table, req_idx, seq_lens, sinks, out, lse)
    return plan


def check_latent(op: str, kv_cache, v_head_dim) -> None:
    """A latent cache [..., D] (3-D or 4-D) whose first `v_head_dim` channels are the value."""
    guards.integer(op, "v_head_dim", v_head_dim)
    rules.tensor(op, "kv_cache", kv_cache, dim=(3, 4))
    if not 0 < v_head_dim <= kv_cache.shape[-1]:
        rules.fail(op, "v_head_dim", f"in [1, {kv_cache.shape[-1]}] (the cache's head size)", v_head_dim)


def split_heads_decode(q, k_cache, v_cache, table, seq_lens, *, req_idx=None, k_scale=None, v_scale=None,
                       kv_format="auto", sm_scale=None, window=None, sinks=None, out=None, num_splits=None,
                       return_lse=False, lse=None, latent=False, validate=True):
    """decode over K and V caches of different head sizes (`decode` routes such calls here); with
    latent=True, v_cache is a view of k_cache's first d_v channels and the kernel reads only
    k_cache (the value comes from the key tile it loaded). Arguments as `decode`'s, except: q
    [B, H, D_QK]; k_cache [..., D_QK], v_cache [..., D_V] (multiples of 16, D_QK <= 576, D_V <=
    512); out [B, H, D_V]; fp16/bf16/fp8 caches only, k_scale / v_scale one element each (fp8);
    page size a power of two <= 128."""
    if lse is not None and not return_lse:
        raise ValueError("lse is written only with return_lse=True")
    if isinstance(q, torch.Tensor) and q.dim() == 3 and isinstance(v_cache, torch.Tensor):
        if return_lse and lse is None:
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        if out is None:
            out = torch.empty((*q.shape[:2], v_cache.shape[-1]), dtype=q.dtype, device=q.device)
    if torch.compiler.is_compiling():  # the op's fake implementation runs the checks
        MLA_DECODE(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale, window,
                   sinks, num_splits, latent, out, lse)
    else:
        _run(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale, window, sinks,
             num_splits, latent, out, lse, validate)
    return (out, lse) if return_lse else out


def mla_decode(q, kv_cache, table, seq_lens, *, v_head_dim=512, sm_scale=None, k_scale=None, kv_format="auto",
               out=None, return_lse=False, lse=None, num_splits=None, req_idx=None, validate=True):
    """Multi-head latent attention decode (DeepSeek V2/V3 style) over a paged latent cache.

    Shapes (B batch, H query heads sharing the one latent head, D the latent head size, 576 for
    DeepSeek: 512 value channels + 64 rotary):
      q        [B, H, D] fp16 or bf16 (the absorbed query: latent part then rotary part), last
               dim contiguous.
      kv_cache [pages, page_size, kv_heads, D] (kv_heads 1 for MLA; H % kv_heads == 0) or
               token-level [slots, kv_heads, D]; page_size a power of two <= 128; any strides with
               the last dim contiguous. fp16/bf16 (q's dtype) or fp8 (float8_e4m3fn/e5m2, or its
               bytes with kv_format="fp8_e4m3"/"fp8_e5m2").
      v_head_dim  the value is channels [0, v_head_dim) of the cache (a multiple of 16, <= 512,
               <= D); each tile of the cache is read once for both products.
      table    [rows, max_pages] int32 page ids; seq_lens [B] int32; req_idx [B] int32 rows or None.
      sm_scale default 1/sqrt(D). k_scale: fp8's scale (one element, value = fp8 * scale) or None.
      out      [B, H, v_head_dim] in q's dtype, allocated when None.
      return_lse  also return lse [B, H] fp32, the natural-log log-sum-exp of the scaled scores
               (-inf for a request of length 0, whose out is zeros); lse: where to write it.
      num_splits  sequence splits a request (default: from batch, heads, the SM count and the
               binary's occupancy; never from lengths). validate: read lengths and used page ids
               back to check them (one device sync; skipped under torch.compile and graph capture).
    Returns out, or (out, lse). Errors (before any launch): TypeError for a wrong type or dtype,
    ValueError naming the argument for a wrong shape, head size, v_head_dim, page size or value.
    """
    matched = False
    if not validate and not _compiling():
        for e in _recent.entries:  # one C call matches every argument; pointers read once
            if e.match(q, kv_cache, table, seq_lens, v_head_dim, sm_scale, k_scale, kv_format, out, return_lse, lse,
                       num_splits, req_idx):
                if e.run(q, kv_cache, kv_cache, table, seq_lens, req_idx, k_scale, k_scale, None, out, lse, None):
                    return (out, lse) if return_lse else out
                matched = True  # the full path decides this call (and names any error)
                break
    check_latent(OP, kv_cache, v_head_dim)
    v_cache = kv_cache[..., :v_head_dim]
    if _compiling():
        return split_heads_decode(q, kv_cache, v_cache, table, seq_lens, req_idx=req_idx, k_scale=k_scale,
                                  v_scale=k_scale, kv_format=kv_format, sm_scale=sm_scale, out=out,
                                  num_splits=num_splits, return_lse=return_lse, lse=lse, latent=True, validate=validate)
    out_given, lse_given = out, lse
    if lse is not None and not return_lse:
        raise ValueError("lse is written only with return_lse=True")
    if isinstance(q, torch.Tensor) and q.dim() == 3:
        if return_lse and lse is None:
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        if out is None:
            out = torch.empty((*q.shape[:2], v_head_dim), dtype=q.dtype, device=q.device)
    plan = _run(q, kv_cache, v_cache, table, seq_lens, req_idx, k_scale, k_scale, kv_format, sm_scale, None, None,
                num_splits, True, out, lse, validate)
    if not (validate or matched) and out_given is out and lse_given is lse:  # the next such call: the steady state
        e = Eager.make(plan, (q, kv_cache, table, seq_lens, v_head_dim, sm_scale, k_scale, kv_format, out, return_lse,
                              lse, num_splits, req_idx),
                       (q, kv_cache, table, seq_lens, req_idx, k_scale, out, lse), (k_scale,), {"out": out, "lse": lse},
                       {"q": q, "kv_cache": kv_cache, "v_cache": kv_cache, "table": table, "seq_lens": seq_lens,
                        "req_idx": req_idx, "k_scale": k_scale, "v_scale": k_scale, "sinks": None, "alibi": None})
        if e is not None:
            _recent.add(e)
    return (out, lse) if return_lse else out
