"""Paged prefix-prefill attention (chunked prefill / prefix caching), declared once as
`PREFIX_PREFILL` (library.Op: the `aotc::prefix_prefill` op). Rules (`_validate`), plan
(`launch_plan`: variant, grid and arguments), launch (`run_kernel`, through the general
`launch.Launch` path). Unvalidated eager calls keep a steady state per input metadata
(`_Eager`: one C call matches every argument, then a prepared launch packs the pointers): the
grid follows tokens and requests, never lengths, so one shape's plan serves every length."""
from __future__ import annotations

import math
import os

import torch

from aotc.kernels.prefix_prefill import spec as _spec

from . import guards, library, rules, steady
from .value_checks import skip_value_checks

OP = "prefix_prefill"
_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_FP8 = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}
_FP8_FORMATS = ("fp8_e4m3", "fp8_e5m2")
_FORMATS = {  # kv_format -> the cache dtypes that may hold it (fp8 also as its raw bytes, as vLLM stores it)
    "fp16": (torch.float16,), "bf16": (torch.bfloat16,),
    "fp8_e4m3": (torch.float8_e4m3fn, torch.uint8, torch.int8),
    "fp8_e5m2": (torch.float8_e5m2, torch.uint8, torch.int8),
    "int8": (torch.int8,), "int4": (torch.int8, torch.uint8),
    "int4_zp": (torch.uint8, torch.int8),  # vLLM's INT4_PER_TOKEN_HEAD codes: the int4 path, scales "token_zp"
}
_CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.uint8)
_SCALE_KINDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # the kernel's scale_kind
_LAYOUTS = ("nhd", "hnd", "vllm")
_GRID_Y_MAX = 65535  # CUDA's limit on a launch grid's second axis
_MIN_GROUP, _MAX_GROUP = _spec.MIN_QUANT_GROUP, _spec.MAX_QUANT_GROUP  # decode's per-group sizes
_dummies: dict[torch.device, torch.Tensor] = {}


def _dummy_f32(device: torch.device) -> torch.Tensor:
    """Stands in for an absent fp32 pointer (the kernel never reads it: a flag says so)."""
    t = _dummies.get(device)
    if t is None:
        t = _dummies[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return t


def _scalar_f32(name, t, device):
    rules.tensor(OP, name, t.reshape(-1) if isinstance(t, torch.Tensor) else t, (torch.float32,), 1, device, last_contiguous=True)
    rules.need(OP, t.numel() == 1, name, "a one-element float32 tensor", f"{t.numel()} elements")


class _Cache:
    """What the checks found out about the cache: format, scales, layout family, block size,
    and the kernel's cache strides (elements, or int16 words for int8/int4) and scale strides."""

    __slots__ = ("fmt", "scales", "vllm", "bs", "x", "kc", "vc", "sc", "quant_shift")

    def __init__(self, fmt, scales, vllm, bs, x, kc, vc, sc, quant_shift=0):
        self.fmt, self.scales, self.vllm, self.bs, self.x, self.kc, self.vc, self.sc = \
            fmt, scales, vllm, bs, x, kc, vc, sc
        self.quant_shift = quant_shift


def _format(kv_format, k_cache, q, head_dim, kv_layout) -> str:
    if kv_format != "auto":
        if kv_format not in _FORMATS:
            raise ValueError(f"prefix_prefill: kv_format must be 'auto' or one of {tuple(_FORMATS)}, got {kv_format!r}")
        storage = (q.dtype,) if kv_format in ("fp16", "bf16") else _FORMATS[kv_format]
        if kv_format in ("fp16", "bf16"):
            rules.need(OP, _DTYPES[q.dtype] == kv_format, "kv_format", f"q's dtype ({_DTYPES[q.dtype]}) for a float cache",
                  kv_format)
        if k_cache.dtype not in storage:
            raise TypeError(f"prefix_prefill: k_cache must have dtype in {[str(d) for d in storage]} for a "
                            f"{kv_format} cache, got {k_cache.dtype}")
        return "same" if kv_format in ("fp16", "bf16") else "int4" if kv_format == "int4_zp" else kv_format
    if k_cache.dtype == q.dtype:
        return "same"
    if k_cache.dtype in _FP8:
        return _FP8[k_cache.dtype]
    if k_cache.dtype in (torch.int8, torch.uint8) and kv_layout != "vllm":
        if k_cache.dtype == torch.uint8 or k_cache.shape[-1] * 2 == head_dim:
            return "int4"
        return "int8"
    raise TypeError(f"prefix_prefill: k_cache must have dtype in {[str(d) for d in (q.dtype, *_FP8)]}, or int8/"
                    f"uint8 for an int8/int4 cache (nhd/hnd layouts), got {k_cache.dtype}; fp8 stored as "
                    f"bytes needs kv_format='fp8_e4m3' or 'fp8_e5m2'")


def _check_cache(k_cache, v_cache, kv_format, kv_layout, q, kv_heads, head_dim, k_scale, v_scale,
                 v_pack=0) -> _Cache:
    dev = q.device
    if kv_layout not in _LAYOUTS:
        raise ValueError(f"prefix_prefill: kv_layout must be one of {_LAYOUTS}, got {kv_layout!r}")
    rules.tensor(OP, "k_cache", k_cache, _CACHE_DTYPES, 5 if kv_layout == "vllm" else 4, dev, last_contiguous=True)
    fmt = _format(kv_format, k_cache, q, head_dim, kv_layout)
    rules.tensor(OP, "v_cache", v_cache, (k_cache.dtype,), 4, dev, last_contiguous=True)
    nb = k_cache.shape[0]
    fp8_token = _fp8_token(fmt, k_scale)
    if kv_layout == "vllm":
        rules.need(OP, fmt not in _spec.INT_FORMATS and not fp8_token, "kv_layout",
                   "'nhd' or 'hnd' for an int8/int4 cache or fp8 with per-token scales", kv_layout)
        x = k_cache.shape[4]
        bs = k_cache.shape[3]
        rules.need(OP, x > 0 and x % 8 == 0 and k_cache.shape[2] * x == head_dim, "k_cache",
              f"[num_blocks, {kv_heads}, {head_dim} // x, block_size, x] with x a multiple of 8 dividing "
              f"{head_dim} (vllm layout)", tuple(k_cache.shape))
        rules.need(OP, k_cache.shape[1] == kv_heads, "k_cache", f"[num_blocks, {kv_heads}, D // x, block_size, x] "
              "(vllm layout)", tuple(k_cache.shape))
        rules.need(OP, k_cache.stride(3) == x, "k_cache", f"contiguous in its last two dims (stride {x} for dim 3)",
              f"strides {k_cache.stride()}")
        rules.need(OP, tuple(v_cache.shape) == (nb, kv_heads, head_dim, bs), "v_cache",
              f"[{nb}, {kv_heads}, {head_dim}, {bs}] (vllm layout)", tuple(v_cache.shape))
        # K token stride is x: implied, passed as 0. V's token slot goes as groups of s_t tokens:
        # the whole block (plain V, token stride 1), or vLLM's interleaved groups of v_pack.
        kc = (k_cache.stride(0), 0, k_cache.stride(1), k_cache.stride(2))
        if v_pack:
            rules.need(OP, bs % v_pack == 0, "v_pack", f"a divisor of the block size {bs}", v_pack)
            rules.need(OP, v_cache.stride(3) == 1 and v_cache.stride(2) == bs, "v_cache", f"contiguous within a head (strides "
                  f"(..., {bs}, 1)) for the interleaved layout", f"strides {v_cache.stride()}")
            vc = (v_cache.stride(0), v_pack, v_cache.stride(1), v_pack)
        else:
            vc = (v_cache.stride(0), bs, v_cache.stride(1), v_cache.stride(2))
    else:
        rules.need(OP, not v_pack, "v_pack", "0 (an interleaved V cache is the vllm layout's)", v_pack)
        x = 0
        hnd = kv_layout == "hnd"
        bs = k_cache.shape[2 if hnd else 1]
        last = head_dim // 2 if fmt == "int4" else head_dim
        want = (nb, kv_heads, bs, last) if hnd else (nb, bs, kv_heads, last)
        spelled = f"[num_blocks, {kv_heads}, block_size, {last}]" if hnd else \
            f"[num_blocks, block_size, {kv_heads}, {last}]"
        rules.need(OP, tuple(k_cache.shape) == want, "k_cache", f"{spelled} ({kv_layout} layout, {fmt} cache)",
              tuple(k_cache.shape))
        rules.need(OP, tuple(v_cache.shape) == want, "v_cache", f"shaped like k_cache {want}", tuple(v_cache.shape))
        order = (0, 2, 1) if hnd else (0, 1, 2)  # block, token, head
        kc = tuple(k_cache.stride(i) for i in order) + (0,)
        vc = tuple(v_cache.stride(i) for i in order) + (0,)
        if fmt in _spec.INT_FORMATS or fp8_token:
            # Read as int16 words (two int8 channels, four int4): even byte strides and addresses;
            # fp8 with per-token scales only at kv_align 4 (vLLM's record): strides of 4 bytes.
            unit = 4 if fp8_token else 2
            for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
                rules.need(OP, all(st % unit == 0 for n, st in zip(t.shape[:-1], t.stride()[:-1]) if n > 1),
                           f"{name}'s strides", "multiples of 4 (an fp8 cache with per-token scales is read 4 bytes "
                           "at a time)" if fp8_token else f"even (an {fmt} cache is read two bytes at a time)", t.stride())
            kc = tuple(st // 2 for st in kc)
            vc = tuple(st // 2 for st in vc)
    rules.need(OP, bs > 0, "the cache block size", "positive", bs)
    scales, sc, quant_shift = "none", (0, 0, 0), 0
    if fmt in _spec.INT_FORMATS:
        scales, sc, quant_shift = _check_int_scales(k_scale, v_scale, k_cache, kv_layout, kv_heads, head_dim, dev)
        if kv_format == "int4_zp":
            rules.need(OP, scales == "token" and k_scale.dtype == torch.float32, "k_scale",
                       "one float32 scale word a token and head (the cache's shape with last dim 1) for an int4_zp "
                       "cache", f"{tuple(k_scale.shape)} {k_scale.dtype}")
            rules.need(OP, head_dim in (64, 128), "q.shape[2] (head_dim)", "64 or 128 for an int4_zp cache", head_dim)
            scales = "token_zp"
    elif fp8_token:
        rules.need(OP, fmt == "fp8_e4m3", "kv_format", "fp8_e4m3 for per-token scales (vLLM's FP8_PER_TOKEN_HEAD)",
                   fmt)
        rules.need(OP, 32 < head_dim <= 128, "q.shape[2] (head_dim)",
                   "in [40, 128] for an fp8 cache with per-token scales", head_dim)
        scales, sc, quant_shift = _check_int_scales(k_scale, v_scale, k_cache, kv_layout, kv_heads, head_dim, dev)
        rules.need(OP, scales == "token", "k_scale", f"the cache's shape with last dim 1 (one scale a token and kv "
                   f"head) or one element, for an {fmt} cache", tuple(k_scale.shape))
    else:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if fmt in _FP8_FORMATS:
                if s is None:
                    raise ValueError(f"prefix_prefill: {name} is required for an fp8 cache ({k_cache.dtype})")
                _scalar_f32(name, s, dev)
            elif s is not None:
                raise ValueError(f"prefix_prefill: {name} applies to fp8, int8 and int4 caches only; the cache is "
                                 f"{k_cache.dtype}")
    return _Cache(fmt, scales, kv_layout == "vllm", bs, x, kc, vc, sc, quant_shift)


def _fp8_token(fmt, k_scale) -> bool:
    """An fp8 cache with per-token scales: k_scale 4-D (the cache's shape with last dim 1)."""
    return fmt in _FP8_FORMATS and isinstance(k_scale, torch.Tensor) and k_scale.dim() == 4


def _check_int_scales(k_scale, v_scale, k_cache, kv_layout, kv_heads, head_dim, dev):
    """("token" | "group" | "channel", (block, token, head) strides of the scales, log2 of the group
    size (0 unless "group"))."""
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None:
            raise ValueError(f"prefix_prefill: {name} is required for an int8/int4 cache")
        if not isinstance(s, torch.Tensor):
            raise TypeError(f"prefix_prefill: {name} must be a torch.Tensor, got {type(s).__name__}")
        if s.dtype not in _SCALE_KINDS:
            raise TypeError(f"prefix_prefill: {name} must have dtype in {[str(d) for d in _SCALE_KINDS]}, "
                            f"got {s.dtype}")
        rules.need(OP, s.device == dev, name, f"on {dev} (like q)", s.device)
    rules.need(OP, v_scale.shape == k_scale.shape and v_scale.stride() == k_scale.stride() and v_scale.dtype == k_scale.dtype,
          "v_scale", f"k_scale's shape, strides and dtype {tuple(k_scale.shape)}, {k_scale.stride()}, {k_scale.dtype}",
          f"{tuple(v_scale.shape)}, {v_scale.stride()}, {v_scale.dtype}")
    if k_scale.dim() == 2:
        rules.need(OP, tuple(k_scale.shape) == (kv_heads, head_dim), "k_scale", f"[kv_heads, head_dim] = [{kv_heads}, "
              f"{head_dim}] (per channel) or the cache's shape with last dim 1 (per token)", tuple(k_scale.shape))
        rules.need(OP, k_scale.stride(1) == 1, "k_scale", "contiguous in its last dim", f"strides {k_scale.stride()}")
        return "channel", (0, 0, k_scale.stride(0)), 0
    rules.need(OP, k_scale.dim() == 4 and k_scale.shape[:-1] == k_cache.shape[:-1] and k_scale.shape[-1] > 0, "k_scale",
          f"the cache's shape {tuple(k_cache.shape[:-1])} plus a last dim of head_dim // group (1: one scale a "
          f"token and head), or [{kv_heads}, {head_dim}] (per channel)", tuple(k_scale.shape))
    groups = k_scale.shape[-1]
    group = head_dim // groups if head_dim % groups == 0 else 0
    if groups > 1 and not (_MIN_GROUP <= group <= _MAX_GROUP and group & (group - 1) == 0):
        raise ValueError(f"prefix_prefill: k_scale's last dim {groups} gives groups of head_dim / {groups} "
                         f"channels ({head_dim} / {groups}); a group must be a power of two in [{_MIN_GROUP}, "
                         f"{_MAX_GROUP}] dividing head_dim ({head_dim}), or the whole head (last dim 1)")
    if groups > 1:
        rules.need(OP, k_scale.stride(-1) == 1, "k_scale", "contiguous in its last dim (the groups of a token)",
              f"strides {k_scale.stride()}")
    order = (0, 2, 1) if kv_layout == "hnd" else (0, 1, 2)
    strides = tuple(k_scale.stride(i) for i in order)
    return ("token", strides, 0) if groups == 1 else ("group", strides, group.bit_length() - 1)


def _kv_heads(k, k_cache, kv_layout) -> int:
    """kv heads: k's, or with k None (new keys in the cache) the cache's."""
    if k is not None:
        return k.shape[1]
    if not isinstance(k_cache, torch.Tensor) or k_cache.dim() < 3:
        raise TypeError(f"prefix_prefill: k_cache must be a 4-D (5-D vllm) torch.Tensor, got "
                        f"{type(k_cache).__name__}")
    return k_cache.shape[2] if kv_layout == "nhd" else k_cache.shape[1]


def _check_options(q, k, v, kv_layout, fmt, v_pack, alibi_slopes, alibi_sqrt, softcap, window=None, chunk_lookback=-1,
                   mm_prefix_range=None, mm_clamp=False, batch=0, scales="none"):
    """The score and layout options (spec.OPTION_ARGS): types and shapes, and what int caches lack."""
    if (k is None) != (v is None):
        raise ValueError("prefix_prefill: k and v must both be tensors, or both None (the new tokens' keys and "
                         "values read from the cache)")
    if isinstance(v_pack, bool) or not isinstance(v_pack, int) or v_pack < 0:
        raise ValueError(f"prefix_prefill: v_pack must be an int >= 0 (0: plain V), got {v_pack!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not (0 <= softcap < math.inf):
        raise ValueError(f"prefix_prefill: softcap must be a finite float >= 0 (0: off), got {softcap!r}")
    if alibi_slopes is not None:
        rules.tensor(OP, "alibi_slopes", alibi_slopes, (torch.float32,), 1, q.device, last_contiguous=True)
        rules.need(OP, alibi_slopes.shape[0] == q.shape[1], "alibi_slopes", f"[q_heads] = [{q.shape[1]}]",
              tuple(alibi_slopes.shape))
    elif alibi_sqrt:
        raise ValueError("prefix_prefill: alibi_sqrt=True needs alibi_slopes")
    if isinstance(chunk_lookback, bool) or not isinstance(chunk_lookback, int):
        raise TypeError(f"prefix_prefill: chunk_lookback must be an int (-1: off), got {type(chunk_lookback).__name__}")
    if chunk_lookback >= 0:
        rules.need(OP, isinstance(window, int) and window > chunk_lookback, "window",
                   f"> chunk_lookback = {chunk_lookback} (chunked local attention splits the window into "
                   f"chunk_lookback + 1 chunks of window // (chunk_lookback + 1) keys)", window)
    else:
        rules.need(OP, chunk_lookback == -1, "chunk_lookback", ">= 0, or -1 (off)", chunk_lookback)
    if not isinstance(mm_clamp, bool):
        raise TypeError(f"prefix_prefill: mm_clamp must be a bool, got {type(mm_clamp).__name__}")
    if mm_prefix_range is not None:
        rules.tensor(OP, "mm_prefix_range", mm_prefix_range, (torch.int32,), 3, q.device, last_contiguous=True)
        rules.need(OP, mm_prefix_range.shape[0] == batch and mm_prefix_range.shape[2] == 2
                   and mm_prefix_range.is_contiguous(), "mm_prefix_range",
                   f"a contiguous [batch = {batch}, ranges, 2] tensor of inclusive (start, end) positions",
                   f"{tuple(mm_prefix_range.shape)} strides {mm_prefix_range.stride()}")
        rules.need(OP, mm_prefix_range.shape[1] <= 4096, "mm_prefix_range", "at most 4096 ranges a request",
                   mm_prefix_range.shape[1])
        if k is not None:
            raise NotImplementedError("prefix_prefill: mm_prefix_range with separate new k/v is not implemented "
                                      "(pass k = v = None: the new tokens' keys read from the cache)")
        if alibi_slopes is not None:
            raise NotImplementedError("prefix_prefill: mm_prefix_range together with alibi_slopes is not "
                                      "implemented")
    if _spec.word_tiles(fmt, scales):
        cache = f"an {fmt} cache" + (" with per-token scales" if fmt not in _spec.INT_FORMATS else "")
        for on, name in ((softcap, "softcap"), (alibi_slopes is not None, "alibi_slopes"),
                         (chunk_lookback >= 0, "chunk_lookback"), (mm_prefix_range is not None, "mm_prefix_range")):
            if on:
                raise NotImplementedError(f"prefix_prefill: {name} with {cache} is not implemented (fp16, "
                                          f"bf16 and per-tensor fp8 caches)")


def _validate(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, kv_layout, kv_format, k_scale,
              v_scale, sm_scale, window, sinks, out_scale, out, v_pack=0, alibi_slopes=None, alibi_sqrt=False,
              softcap=0.0, chunk_lookback=-1, mm_prefix_range=None, mm_clamp=False) -> _Cache:
    reads = {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
             "query_start_loc": query_start_loc, "seq_lens": seq_lens, "k_scale": k_scale, "v_scale": v_scale,
             "sinks": sinks, "out_scale": out_scale, "alibi_slopes": alibi_slopes, "mm_prefix_range": mm_prefix_range}
    guards.refuse_grad("prefix_prefill", **reads, out=out)
    rules.tensor(OP, "q", q, tuple(_DTYPES), 3, last_contiguous=True)
    dev = q.device
    tokens, q_heads, head_dim = q.shape
    rules.need(OP, head_dim % 8 == 0 and 8 <= head_dim <= _spec.MAX_HEAD_DIM, "q.shape[2] (head_dim)",
          f"a multiple of 8 in [8, {_spec.MAX_HEAD_DIM}]", head_dim)
    if k is not None:
        rules.tensor(OP, "k", k, (q.dtype,), 3, dev, last_contiguous=True)
        rules.tensor(OP, "v", v, (q.dtype,), 3, dev, last_contiguous=True)
        rules.need(OP, k.shape[0] == tokens and k.shape[2] == head_dim, "k", f"[{tokens}, kv_heads, {head_dim}]",
              tuple(k.shape))
        rules.need(OP, v.shape == k.shape, "v", f"shaped like k {tuple(k.shape)}", tuple(v.shape))
    elif v is not None:
        raise ValueError("prefix_prefill: k and v must both be tensors, or both None (the new tokens' keys and "
                         "values read from the cache)")
    kv_heads = _kv_heads(k, k_cache, kv_layout)
    rules.need(OP, kv_heads > 0 and q_heads % kv_heads == 0, "k.shape[1] (kv_heads)" if k is not None else
          "k_cache's kv_heads", f"a divisor of q_heads={q_heads}", kv_heads)
    cache = _check_cache(k_cache, v_cache, kv_format, kv_layout, q, kv_heads, head_dim, k_scale, v_scale, v_pack)
    rules.tensor(OP, "block_table", block_table, (torch.int32,), 2, dev, last_contiguous=True)
    batch = block_table.shape[0]
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)):
        raise TypeError(f"prefix_prefill: window must be an int or None, got {type(window).__name__}")
    _check_options(q, k, v, kv_layout, cache.fmt, v_pack, alibi_slopes, alibi_sqrt, softcap, window, chunk_lookback,
                   mm_prefix_range, mm_clamp, batch, cache.scales)
    rules.tensor(OP, "query_start_loc", query_start_loc, (torch.int32,), 1, dev, last_contiguous=True)
    rules.need(OP, query_start_loc.shape[0] == batch + 1, "query_start_loc", f"[batch + 1] = [{batch + 1}] (block_table "
          f"has {batch} rows)", tuple(query_start_loc.shape))
    rules.tensor(OP, "seq_lens", seq_lens, (torch.int32,), 1, dev, last_contiguous=True)
    rules.need(OP, seq_lens.shape[0] == batch, "seq_lens", f"[batch] = [{batch}]", tuple(seq_lens.shape))
    if sm_scale is not None:
        guards.real("prefix_prefill", "sm_scale", sm_scale)
    if window is not None:
        rules.need(OP, 0 <= window <= rules.I32_MAX, "window", "in [0, 2**31) (0 or None: no window)", window)
    if sinks is not None:
        rules.tensor(OP, "sinks", sinks, (torch.float32,), 1, dev, last_contiguous=True)
        rules.need(OP, sinks.shape[0] == q_heads, "sinks", f"[q_heads] = [{q_heads}]", tuple(sinks.shape))
    if out_scale is not None:
        _scalar_f32("out_scale", out_scale, dev)
    if out is not None:
        rules.tensor(OP, "out", out, (torch.float8_e4m3fn,) if out_scale is not None else (q.dtype,), 3, dev, last_contiguous=True)
        rules.need(OP, tuple(out.shape) == tuple(q.shape), "out", f"shaped like q {tuple(q.shape)}", tuple(out.shape))
        # A program writes its rows of out while later programs still read earlier rows of k and v.
        guards.check_outputs("prefix_prefill", {"out": out}, reads)
    for name, t in (("q", q), ("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out),
                    ("block_table", block_table)):
        if t is not None:
            rules.need(OP, all(0 <= s <= rules.I32_MAX for s in t.stride()), f"{name}'s strides", "in [0, 2**31)", t.stride())
    rules.need(OP, tokens < rules.I32_MAX // 2, "q.shape[0]", "below 2**30 tokens", tokens)
    return cache


def _check_lengths(tokens, k_cache, block_table, query_start_loc, seq_lens, bs, from_cache=False):
    """Data checks on host copies of the metadata (plain device-to-host copies, one sync, no GPU
    kernel): offsets, lengths within block_table's width, used block ids within the cache (the
    context's blocks, or with from_cache the whole sequence's)."""
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    rules.need(OP, qsl[0] == 0, "query_start_loc[0]", "0", qsl[0])
    q_lens = [b - a for a, b in zip(qsl, qsl[1:])]
    rules.need(OP, min(q_lens, default=0) >= 0, "query_start_loc", "non-decreasing", qsl)
    rules.need(OP, qsl[-1] <= tokens, "query_start_loc[-1]", f"<= q.shape[0] = {tokens}", qsl[-1])
    used = []
    for b, (ql, sl) in enumerate(zip(q_lens, lens)):
        rules.need(OP, sl >= ql, f"seq_lens[{b}]", f">= its {ql} new tokens", sl)
        used.append(-(-(sl if from_cache else sl - ql) // bs))
        rules.need(OP, used[-1] <= block_table.shape[1], f"seq_lens[{b}]", f"{'a sequence' if from_cache else 'a context'} "
              f"of at most {block_table.shape[1]} blocks of {bs} tokens (block_table's width)", sl)
    width = max(used, default=0)
    if width == 0:
        return
    ids = block_table[: len(used), :width].cpu()
    in_use = torch.arange(width, device="cpu")[None, :] < torch.tensor(used, device="cpu")[:, None]
    bad = in_use & ((ids < 0) | (ids >= k_cache.shape[0]))
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        row = ids[b, : used[b]]
        rules.need(OP, False, f"block_table[{b}, :{used[b]}]", f"block ids in [0, {k_cache.shape[0]})",
              (int(row.min()), int(row.max())))


def launch_plan(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out, kv_layout, kv_format,
                k_scale, v_scale, sm_scale, window, sinks, out_scale, skip_decode, v_pack=0, alibi_slopes=None,
                alibi_sqrt=False, softcap=0.0, chunk_lookback=-1, mm_prefix_range=None, mm_clamp=False):
    """(axes, grid, args) of the kernel launch for validated arguments (the bench reuses it); args
    in spec.KERNEL_ARGS order (kernel_ws.py takes the first len(spec.ARGS))."""
    tokens, q_heads, head_dim = q.shape
    kv_heads = _kv_heads(k, k_cache, kv_layout)
    batch = block_table.shape[0]
    c = _check_cache(k_cache, v_cache, kv_format, kv_layout, q, kv_heads, head_dim, k_scale, v_scale, v_pack)
    from_cache = k is None
    if from_cache:  # never read (kv_from_cache): q stands in for the pointers and strides
        k = v = q
    axes = _spec.axes_for(_DTYPES[q.dtype], c.fmt, c.scales, head_dim, "vllm" if c.vllm else "nhd",
                          "mod" if softcap or alibi_slopes is not None or chunk_lookback >= 0
                          or mm_prefix_range is not None else "plain")
    if axes["kv"] in _spec.KV_ALIGN4_FORMATS:  # rows 4-byte aligned, not 16 (vLLM's record): the kv_align 4 binaries
        rows = [st for t in (k_cache, v_cache) for n, st in zip(t.shape[:-1], t.stride()[:-1]) if n > 1]
        if _spec.kv_align(axes, [k_cache.data_ptr(), v_cache.data_ptr(), *rows]) == 4:
            axes["kv_align"] = 4
    words = _spec.word_tiles(axes["kv"], axes["scales"])
    block_m = _spec.tile(axes["block_d"], axes["kv"], axes["scales"])[0]
    # Flattened q-block schedule: request b owns q blocks [qsl[b] // BLOCK_M + b, ...); this bound
    # covers them all without reading query_start_loc on the host (see kernel.py). Float and fp8
    # caches put the heads on the grid's first axis, int caches the q blocks.
    q_blocks = tokens // block_m + batch
    if words:
        grid = (q_blocks, q_heads, 1)
    else:
        rules.need(OP, q_blocks <= _GRID_Y_MAX, "q", f"at most {_GRID_Y_MAX} q blocks in one call: tokens // {block_m} + requests "
              f"(the launch grid's second axis)", f"{tokens} tokens in {batch} requests")
        grid = (q_heads, q_blocks, 1)
    dummy = _dummy_f32(q.device)
    quant = c.fmt != "same"
    args = (
        q, k, v, k_cache.view(torch.uint8), v_cache.view(torch.uint8), out.view(torch.uint8),
        block_table, query_start_loc, seq_lens,
        rules.as_bytes(k_scale if quant else dummy), rules.as_bytes(v_scale if quant else dummy),
        out_scale if out_scale is not None else dummy, sinks if sinks is not None else dummy,
        float(sm_scale), batch, q_heads // kv_heads, c.bs, block_table.stride(0), int(window or 0),
        int(sinks is not None), int(out_scale is not None), int(skip_decode), c.x // 8,
        # int8/int4 scales' dtype, and per group log2(group) above it (quant.int_context).
        (_SCALE_KINDS[k_scale.dtype] | c.quant_shift << 2) if c.scales != "none" else 0, *c.sc,
        head_dim, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0),
        out.stride(1), *c.kc, *c.vc,
        alibi_slopes if alibi_slopes is not None else dummy, float(softcap),
        0 if alibi_slopes is None else 2 if alibi_sqrt else 1, int(from_cache),
        seq_lens if mm_prefix_range is None else mm_prefix_range,  # seq_lens: an unread int32 stand-in
        0 if mm_prefix_range is None else mm_prefix_range.shape[1], int(mm_clamp),
        int(window) // (chunk_lookback + 1) if chunk_lookback >= 0 and window else 0, max(int(chunk_lookback), 0),
    )
    return axes, grid, args


# "0" sends every call to kernel.py (the Triton kernel), e.g. to compare the two.
ENV_WS = "AOTC_PREFIX_PREFILL_WS"
_OUT_FP8 = _spec.PREFIX_PREFILL.arg_index["out_fp8"]
_FROM_CACHE = _spec.PREFIX_PREFILL.arg_index["kv_from_cache"]
_K_CACHE, _V_CACHE = (_spec.PREFIX_PREFILL.arg_index[n] for n in ("K_cache", "V_cache"))
_K_STRIDES = tuple(_spec.PREFIX_PREFILL.arg_index[n] for n in ("stride_kcb", "stride_kct", "stride_kch"))
_V_STRIDES = tuple(_spec.PREFIX_PREFILL.arg_index[n] for n in ("stride_vcb", "stride_vct", "stride_vch"))


def kernel_for(axes, args):
    """The kernel spec a launch of launch_plan's (axes, args) runs: on sm90 a warp-specialized Gluon
    kernel where the spec's rules say so (spec.ws_serves: int8/int4 at 128-wide tiles, ALIGNED
    arguments, separate new k/v; spec.rec_serves: every key in the cache, vLLM's per-token-head
    records with K's rows 8-byte and V's 4-byte aligned, or per-cache fp8 with 16-byte-aligned rows),
    else the Triton kernel. Artifacts built or
    published without the Gluon kernel's binaries (`aotc build --kernel prefix_prefill`, an older
    hub revision) keep the Triton kernel's built binary rather than a JIT fallback of the Gluon one."""
    q = args[0]
    if not q.is_cuda or os.environ.get(ENV_WS, "1") == "0":
        return _spec.PREFIX_PREFILL
    from_cache = len(args) > _FROM_CACHE and bool(args[_FROM_CACHE])
    if not (_spec.rec_variant(axes) if from_cache else _spec.ws_variant(axes)):
        return _spec.PREFIX_PREFILL  # (softcap and ALiBi are kernel.py's: neither variant rule takes them)
    from aotc.kernels.variants import ALIGNED
    from aotc.loader import dispatch

    device = q.get_device()
    gpu = dispatch.device_of(device)
    ws = _spec.PREFIX_PREFILL_WS_REC if from_cache else _spec.PREFIX_PREFILL_WS
    values = [a.data_ptr() if arg.kind == "ptr" else a for arg, a in zip(ws.args, args)]
    aligned = dispatch.check_assumptions(ws, ws.divisible_args(ALIGNED), values) is None  # its only binary's
    fp8_out = bool(args[_OUT_FP8])
    if from_cache:
        # its loads: 8 bytes of K and 4 of V on vLLM's records (strides passed in int16 words), 16 per cache
        unit, k_vec, v_vec = (2, 8, 4) if axes["scales"] == "token" else (1, 16, 16)
        rows = (values[_K_CACHE] % k_vec == 0 and values[_V_CACHE] % v_vec == 0
                and all(values[i] * unit % k_vec == 0 for i in _K_STRIDES)
                and all(values[i] * unit % v_vec == 0 for i in _V_STRIDES))
        serves = _spec.rec_serves(axes, gpu.capability, fp8_out, aligned, True, rows)
    else:
        serves = _spec.ws_serves(axes, gpu.capability, fp8_out, aligned)
    if not (gpu.vendor == "nvidia" and serves):
        return _spec.PREFIX_PREFILL
    if not dispatch.is_built(ws, _spec.ws_axes(axes), device) and dispatch.is_built(_spec.PREFIX_PREFILL, axes,
                                                                                      device):
        return _spec.PREFIX_PREFILL
    return ws


def _prefix_prefill_op(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out, kv_layout, kv_format,
                       k_scale, v_scale, sm_scale, window, sinks, out_scale, skip_decode, validate, v_pack,
                       alibi_slopes, alibi_sqrt, softcap, chunk_lookback=-1, mm_prefix_range=None,
                       mm_clamp=False) -> None:
    from aotc.loader.dispatch import run_kernel

    # called as torch.ops.aotc.prefix_prefill directly, no public checks ran: no gradient dropped either way
    guards.refuse_grad("prefix_prefill", q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale,
                       v_scale=v_scale, sinks=sinks, out_scale=out_scale, alibi_slopes=alibi_slopes,
                       mm_prefix_range=mm_prefix_range, out=out)
    axes, grid, args = launch_plan(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out,
                                   kv_layout, kv_format, k_scale, v_scale, sm_scale, window, sinks, out_scale,
                                   skip_decode, v_pack, alibi_slopes, alibi_sqrt, softcap, chunk_lookback,
                                   mm_prefix_range, mm_clamp)
    if axes["kv"] in _spec.INT_FORMATS and (k_cache.data_ptr() | v_cache.data_ptr()) & 1:
        name = "k_cache" if k_cache.data_ptr() & 1 else "v_cache"
        raise ValueError(f"prefix_prefill: {name} must start at an even address (an {axes['kv']} cache is read two "
                         f"bytes at a time); it is a view at an odd byte offset")
    if _spec.word_tiles(axes["kv"], axes["scales"]) and axes["kv"] not in _spec.INT_FORMATS \
            and (k_cache.data_ptr() | v_cache.data_ptr()) & 3:
        name = "k_cache" if k_cache.data_ptr() & 3 else "v_cache"
        raise ValueError(f"prefix_prefill: {name} must start at a multiple of 4 bytes (an fp8 cache with per-token "
                         f"scales is read 4 bytes at a time)")
    if validate:
        bs = args[16]  # block_size
        _check_lengths(q.shape[0], k_cache, block_table, query_start_loc, seq_lens, bs, k is None)
    if block_table.shape[0] == 0 or q.shape[1] == 0:
        return
    spec = kernel_for(axes, args)
    if spec is not _spec.PREFIX_PREFILL:
        axes = _spec.ws_axes(axes)
    run_kernel(spec, axes, grid, args[:len(spec.args)])


def _prefix_prefill_fake(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out, kv_layout, kv_format,
                         k_scale, v_scale, sm_scale, window, sinks, out_scale, skip_decode, validate, v_pack,
                         alibi_slopes, alibi_sqrt, softcap, chunk_lookback=-1, mm_prefix_range=None,
                       mm_clamp=False) -> None:
    return None  # the public function validated every argument before calling the op


class _Eager(steady.Steady):
    """An unvalidated call's steady state for one input metadata (a steady.Steady): the Triton
    kernel's leading pointers, in its launch's order, go to its prepared launch (the Gluon
    kernel, chosen per call by alignment, keeps the full path); an odd int8/int4 cache address
    takes the full path, which names it."""

    ARGS = ("q", "k", "v", "k_cache", "v_cache", "block_table", "query_start_loc", "seq_lens", "k_scale", "v_scale",
            "sinks", "out_scale", "out")
    __slots__ = ("go", "dummy", "halfword")

    def __init__(self, match, launch, apart, index, dummy, halfword):
        super().__init__(match, apart, _ORDER, index)
        self.go, self.dummy, self.halfword = launch, dummy, halfword

    def pointers(self, q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, k_scale, v_scale, sinks,
                 out_scale, out):
        kcp, vcp = k_cache.data_ptr(), v_cache.data_ptr()
        if (kcp | vcp) & self.halfword:
            return None
        qp, dummy = q.data_ptr(), self.dummy
        return (qp, qp if k is None else k.data_ptr(), qp if v is None else v.data_ptr(), kcp, vcp, out.data_ptr(),
                block_table.data_ptr(), query_start_loc.data_ptr(), seq_lens.data_ptr(),
                dummy if k_scale is None else k_scale.data_ptr(), dummy if v_scale is None else v_scale.data_ptr(),
                dummy if out_scale is None else out_scale.data_ptr(), dummy if sinks is None else sinks.data_ptr())


# The Triton kernel's leading pointers by name (spec.PREFIX_PREFILL's order); absent ones hold stand-ins
_ORDER = ("q", "k", "v", "k_cache", "v_cache", "out", "block_table", "query_start_loc", "seq_lens", "k_scale", "v_scale",
          "out_scale", "sinks")


def _make_eager(match, q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out, kv_layout,
                kv_format, k_scale, v_scale, sm_scale, window, sinks, out_scale, skip_decode, v_pack, alibi_slopes,
                alibi_sqrt, softcap):
    """An _Eager for a call the full path just checked and launched, or None where calls like it keep
    the full path: not CUDA, ALiBi slopes (a pointer among the ints), a tensor that requires grad,
    nothing launched, the Gluon kernel's variant (chosen per call), no built binary."""
    reads = {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
             "query_start_loc": query_start_loc, "seq_lens": seq_lens, "k_scale": k_scale, "v_scale": v_scale,
             "sinks": sinks, "out_scale": out_scale, "alibi_slopes": alibi_slopes}
    if (not _prepares(q) or alibi_slopes is not None or block_table.shape[0] == 0 or q.shape[1] == 0
            or not steady.grad_free((out, *reads.values()))):
        return None
    sm = 1.0 / math.sqrt(q.shape[2]) if sm_scale is None else float(sm_scale)
    axes, grid, kargs = launch_plan(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out, kv_layout,
                                    kv_format, k_scale, v_scale, sm, int(window or 0), sinks, out_scale,
                                    bool(skip_decode), int(v_pack), alibi_slopes, bool(alibi_sqrt), float(softcap))
    spec = _spec.PREFIX_PREFILL
    if kernel_for(axes, kargs) is not spec:
        return None
    dummy = _dummy_f32(q.device)
    launch = prepared_launch(spec, axes, grid, kargs, q.device.index)
    if launch is None:
        return None
    return _Eager(match, launch, guards.Apart(OP, {"out": out}, reads), q.device.index, dummy.data_ptr(),
                  cache_address_mask(axes))


def prepared_launch(spec, axes, grid, kargs, device: int, aligned_only: bool = False):
    """dispatch.prepare of `spec` over launch_plan's (axes, grid, kargs), the pointers among the ints
    (ALiBi slopes, the multimodal ranges or their stand-in) packed as fixed values."""
    from aotc.loader.dispatch import prepare

    scalars = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in kargs[spec.leading_ptrs:len(spec.args)]]
    return prepare(spec, axes, grid, scalars, device, aligned_only=aligned_only)


def cache_address_mask(axes) -> int:
    """The low bits a cache address must have clear for the Triton kernel's binary of `axes`: an
    int8/int4 cache is read two bytes at a time, a kv_align 4 binary's four (else the full path)."""
    return 3 if axes.get("kv_align") == 4 else int(axes["kv"] in _spec.INT_FORMATS)


def _prepares(q) -> bool:
    """Whether calls on q's device launch prepared binaries (CUDA; the tests' recorded launches too)."""
    return q.is_cuda


_recent = rules.Recent()  # unvalidated eager calls' steady states (_Eager)
_refused = rules.Recent(16)  # matchers of calls that keep the full path (no _Eager made for them)
_compiling = torch.compiler.is_compiling


PREFIX_PREFILL = library.Op(
    "prefix_prefill(Tensor q, Tensor? k, Tensor? v, Tensor k_cache, Tensor v_cache, Tensor block_table, "
    "Tensor query_start_loc, Tensor seq_lens, Tensor(a!) out, str kv_layout, str kv_format, "
    "Tensor? k_scale, Tensor? v_scale, float sm_scale, SymInt window, Tensor? sinks, Tensor? out_scale, "
    "bool skip_decode, bool validate, int v_pack, Tensor? alibi_slopes, bool alibi_sqrt, "
    "float softcap, int chunk_lookback=-1, Tensor? mm_prefix_range=None, bool mm_clamp=False) -> ()", impl=_prefix_prefill_op, fake=_prefix_prefill_fake)


def prefix_prefill(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, *, kv_layout="nhd",
                   kv_format="auto", k_scale=None, v_scale=None, sm_scale=None, window=None, sinks=None, out_scale=None,
                   skip_decode=False, out=None, validate=None, v_pack=0, alibi_slopes=None, alibi_sqrt=False,
                   softcap=0.0, chunk_lookback=-1, mm_prefix_range=None, mm_clamp=False) -> torch.Tensor:
    """Attention of new tokens over a paged context plus, causally, themselves.

    Shapes (T new tokens over all requests, B requests, D = head_dim):
      q `[T, q_heads, D]`; k, v `[T, kv_heads, D]`: the new tokens (not read from the cache);
        fp16 or bf16, last dim contiguous; q_heads a multiple of kv_heads. k = v = None: the cache
        already holds the new tokens' keys and values after the context (positions seq_lens[b] -
        q_len ..), and they are read from there.
      k_cache, v_cache: kv_layout "nhd": `[num_blocks, block_size, kv_heads, Dc]` each; "hnd":
        `[num_blocks, kv_heads, block_size, Dc]` (Iluvatar's); "vllm": K `[num_blocks, kv_heads, D // x,
        block_size, x]`, V `[num_blocks, kv_heads, D, block_size]`, x read from K's shape (a multiple of
        8: vLLM uses 16 // element size, and 8 for fp8 stored as uint8). Any block size.
        Formats (kv_format, "auto" infers it from the dtype and Dc):
          fp16/bf16: q's dtype, Dc = D.
          fp8_e4m3/fp8_e5m2: float8 dtypes (or their bytes as uint8/int8 with an explicit kv_format),
            Dc = D, `k_scale`/`v_scale` one-element float32 tensors; value = fp8 * scale. fp8_e4m3
            also with one scale a token and kv head (vLLM's FP8_PER_TOKEN_HEAD): k_scale/v_scale the
            cache's shape with last dim 1 (any strides, as int8's), nhd/hnd layouts, D 40..128,
            caches 4-byte aligned (addresses and strides; vLLM's record [K codes | K scale | V codes |
            V scale] is); value = fp8 * scale rounded once to fp16, as int8 per token.
          int8 (int8, Dc = D) and int4 (int8 with Dc = D / 2, or uint8; channel 2i in a byte's low
            nibble, 2i+1 in its high, each stored as code + 7), nhd/hnd layouts only, the formats
            `decode` reads and `store_kv` writes; value = code * scale with k_scale/v_scale (same
            shape, strides and dtype; float32, float16 or bfloat16) either per group, the cache's
            shape with last dim D // group (group a power of two in [8, 128] dividing D, as decode
            reads them; last dim 1: one scale a token and head), or per channel `[kv_heads, D]`.
            Caches are read two bytes at a time: even strides and an even start address.
            Dequantization happens on the tiles inside the attention loop: nothing is allocated.
          int4_rht: vLLM 0.33's INT4_PER_TOKEN_HEAD cache (uint8, Dc = D // 2, D 64 or 128, nhd/hnd;
            k_scale/v_scale the cache's shape with last dim 1, fp32 words holding the zero point in
            their 4 low mantissa bits; kernels/common/int4_rht.py), with k = v = None (every key from
            the cache): the values are rotated, so q is rotated before the kernel and out after
            (loader/ops/decode_rht.py); every row of out is rotated in place afterwards (rows the
            kernel does not write included). No out_scale, skip_decode, softcap or ALiBi.
            int4_zp: the same codes read without the rotation (the kernel's format).
            With per-token and per-group scales the values are code * scale rounded to fp16 (as
            decode): scales below fp16's normals (~6.1e-5) lose precision gradually, and values
            past 65504 overflow. On sm90 (H100/H200), D 80..128 (multiples of 16, 16-byte
            aligned tensors) runs a warp-specialized kernel (kernel_ws.py) that overlaps the
            dequantization with the tensor cores; with k = v = None, int8 and fp8_e4m3 per token
            (K 8-byte, V 4-byte aligned caches: vLLM's records) and fp8_e4m3 per cache (16-byte-aligned
            rows) run its sibling
            kernel_ws_rec.py (16-byte-aligned q and out); AOTC_PREFIX_PREFILL_WS=0 turns both off.
      block_table `[B, max_blocks]` int32; query_start_loc `[B + 1]` int32 (request b's new tokens are
        rows query_start_loc[b]:query_start_loc[b+1]; rows past query_start_loc[B] are not touched);
        seq_lens `[B]` int32: context + new tokens. New token i of request b sits at position
        seq_lens[b] - q_len + i and sees the context and new tokens <= i.
      D a multiple of 8 in [8, 256] (tiles are padded to 32, 64, 128 or 256 channels).
    Options: sm_scale (default 1/sqrt(D)); window: keys at distance < window only (None or 0: all);
      sinks `[q_heads]` float32 logits joined to each row's softmax normalizer; out_scale: a
      one-element float32 tensor, and the output is float8_e4m3fn = clamp(out / out_scale, +-448);
      skip_decode: requests with exactly one new token are skipped (their rows are not written);
      softcap > 0: natural-log scores s become softcap * tanh(s / softcap); alibi_slopes `[q_heads]`
      float32: then s += slope * (key position - context length), or with alibi_sqrt
      s -= slope * sqrt(query position - key position) (vLLM's two ALiBi forms; float and fp8
      caches); v_pack (vllm layout): vLLM's interleaved V cache, tokens in groups of v_pack
      (`[num_blocks, kv_heads, block_size // v_pack, D, v_pack]` in V's 4-D shape);
      chunk_lookback L >= 0 (needs a window w > L): chunked local attention, chunks of C = w // (L + 1)
      positions: a query at p sees, causally, keys k with p // C - k // C <= L (vLLM's convention);
      mm_prefix_range `[B, ranges, 2]` int32, inclusive (start, end) positions a request (start >= end:
      unused): a query inside a range also sees every key of it, later ones included; mm_clamp: only
      those with p - k < w. Both run in the kernel's "mod" binaries, on fp16, bf16 and fp8 caches,
      mm_prefix_range with k = v = None and no alibi_slopes (NotImplementedError otherwise);
      out: the result tensor (like q, or float8_e4m3fn with out_scale); allocated when None.
      validate: copy the lengths and the used block-table entries to the host and check them
      (query_start_loc non-decreasing from 0, contexts within block_table's width, block ids
      within the cache): one device sync. Default: on, except under CUDA-graph capture and
      torch.compile; pass False in a hot eager loop whose metadata is known good.
    Returns out `[T, q_heads, D]`.
    Raises TypeError for a wrong type or dtype and ValueError for a wrong shape, stride, device,
    option or (when validated) length, naming the argument, before anything is launched.
    `out` may not share memory with any input nor be an expand()ed (stride-0) view (ValueError
    naming it); an input that requires grad while grad mode is on raises NotImplementedError (aotc
    is inference-only). Float and fp8 caches take at
    most 65535 q blocks a call (T // BLOCK_M + B, BLOCK_M 128: about 8M tokens); more raise
    ValueError naming q. NaN and inf in the inputs are
    not checked: NaN in, NaN out (a non-finite q row, or k/v row it attends to, gives that row
    non-finite values; other rows are unaffected).
    """
    if kv_format == "int4_rht":
        from .decode_rht import prefix_prefill_rht

        return prefix_prefill_rht(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens,
                                  kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale, sm_scale=sm_scale, window=window,
                                  sinks=sinks, out_scale=out_scale, skip_decode=skip_decode, out=out, validate=validate,
                                  v_pack=v_pack, alibi_slopes=alibi_slopes, alibi_sqrt=alibi_sqrt, softcap=softcap,
                                  chunk_lookback=chunk_lookback, mm_prefix_range=mm_prefix_range, mm_clamp=mm_clamp)
    return call(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, kv_layout, kv_format, k_scale,
                v_scale, sm_scale, window, sinks, out_scale, skip_decode, out, validate, v_pack, alibi_slopes,
                alibi_sqrt, softcap, chunk_lookback, mm_prefix_range, mm_clamp, checked=False)


def call(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, kv_layout, kv_format, k_scale, v_scale,
         sm_scale, window, sinks, out_scale, skip_decode, out, validate, v_pack, alibi_slopes, alibi_sqrt, softcap,
         chunk_lookback, mm_prefix_range, mm_clamp, *, checked: bool) -> torch.Tensor:
    """prefix_prefill for a kv_format other than int4_rht; checked: the arguments passed _validate
    already (int4_rht's, on q before its rotation), so only the steady-state match runs before the op."""
    matched = False
    if validate is False and not _compiling() and mm_prefix_range is None and chunk_lookback == -1:
        for e in _recent.entries:  # one C call matches every argument; pointers read once
            if e.match(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, kv_layout, kv_format, k_scale,
                       v_scale, sm_scale, window, sinks, out_scale, skip_decode, out, v_pack, alibi_slopes,
                       alibi_sqrt, softcap):
                if e.run(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, k_scale, v_scale, sinks,
                         out_scale, out):
                    return out
                matched = True  # the full path decides this call (and names any error)
                break
    if not checked:
        _validate(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, kv_layout, kv_format, k_scale,
                  v_scale, sm_scale, window, sinks, out_scale, out, v_pack, alibi_slopes, alibi_sqrt, softcap,
                  chunk_lookback, mm_prefix_range, mm_clamp)
    out_given = out
    if out is None:
        out = torch.empty(q.shape, dtype=torch.float8_e4m3fn if out_scale is not None else q.dtype,
                          device=q.device)
    if validate is None:
        validate = not skip_value_checks(query_start_loc)
    sm = 1.0 / math.sqrt(q.shape[2]) if sm_scale is None else float(sm_scale)
    # Through the dispatcher (fake tensors get the Meta implementation); a prefill kernel runs for
    # milliseconds, so its few microseconds do not matter here as they do for decode.
    PREFIX_PREFILL(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out, kv_layout, kv_format,
                   k_scale, v_scale, sm, int(window or 0), sinks, out_scale, bool(skip_decode), bool(validate),
                   int(v_pack), alibi_slopes, bool(alibi_sqrt), float(softcap), int(chunk_lookback), mm_prefix_range,
                   bool(mm_clamp))
    plain_masks = mm_prefix_range is None and chunk_lookback == -1  # the steady state passes neither
    if validate is False and plain_masks and not matched and out_given is out and not _compiling():  # the next such call: steady state
        args = (q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, kv_layout, kv_format, k_scale,
                v_scale, sm_scale, window, sinks, out_scale, skip_decode, out, v_pack, alibi_slopes, alibi_sqrt, softcap)
        if not any(r(*args) for r in _refused.entries):
            match = rules.call_matcher(*args)
            e = _make_eager(match, q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out, kv_layout,
                            kv_format, k_scale, v_scale, sm_scale, window, sinks, out_scale, skip_decode, v_pack,
                            alibi_slopes, alibi_sqrt, softcap) if match(*args) else None
            if e is not None:
                _recent.add(e)
            else:  # calls like this keep the full path: not tried again
                _refused.add(match)
    return out
