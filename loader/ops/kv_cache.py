"""The paged KV cache as the attention ops read it (decode, mla_decode, store_kv and their
plans): formats and the dtypes that may hold them, the cache and scale checks, the request
rows (table, lengths, req_idx, sinks) and the value checks of lengths and page ids.
Messages name the op and the argument (rules.py's form)."""
from __future__ import annotations

import torch

from aotc.kernels.decode import spec as S

from . import rules
from .value_checks import skip_value_checks

FLOAT_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
FP8_NAMES = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}
FP8_DTYPES = {v: k for k, v in FP8_NAMES.items()}
STORAGE = {  # dtypes a cache of each format may have (fp8 also as its raw bytes)
    "fp16": (torch.float16,), "bf16": (torch.bfloat16,), "int8": (torch.int8,),
    "int4": (torch.int8, torch.uint8),
    "fp8_e4m3": (torch.float8_e4m3fn, torch.int8, torch.uint8),
    "fp8_e5m2": (torch.float8_e5m2, torch.int8, torch.uint8),
    "int4_zp": (torch.uint8, torch.int8),
    "int4_rht": (torch.uint8, torch.int8),
}
rules.I32_MAX = 2 ** 31 - 1


def as_paged(t):
    """A 3-D token-level cache [slots, heads, d] is page size 1: view it as [slots, 1, heads, d]."""
    return t.unsqueeze(1) if t.dim() == 3 else t


def float_format(dtype) -> str | None:
    """The format a cache of `dtype` holds by its dtype alone: fp16, bf16 or fp8 (None for int8 or
    uint8 bytes, which need the head size or an explicit kv_format)."""
    if dtype in (torch.float16, torch.bfloat16):
        return FLOAT_NAMES[dtype]
    return FP8_NAMES.get(dtype)


def check_storage(name: str, fmt: str, cache) -> str:
    """`fmt`, after checking that `cache`'s dtype may hold it (STORAGE)."""
    if cache.dtype not in STORAGE[fmt]:
        raise TypeError(f"{name}: a {fmt} cache must have dtype {' or '.join(map(str, STORAGE[fmt]))}, "
                        f"got {cache.dtype}")
    return fmt


def resolve_format(kv_format: str, cache: torch.Tensor, head_dim: int, name: str = "k_cache") -> str:
    """The cache format for `kv_format` ("auto" infers it from dtype and last dim); checked."""
    last = cache.shape[-1]
    if kv_format == "auto":
        fmt = float_format(cache.dtype)
        if fmt is None:
            if cache.dtype == torch.uint8 or (cache.dtype == torch.int8 and last * 2 == head_dim):
                fmt = "int4"
            elif cache.dtype == torch.int8:
                fmt = "int8"
            else:
                raise TypeError(f"{name}: cannot infer a cache format from dtype {cache.dtype}; "
                                f"expected fp16, bf16, int8, uint8 (int4) or an fp8 dtype")
    elif kv_format not in S.KV_FORMATS:
        raise ValueError(f"kv_format must be 'auto' or one of {S.KV_FORMATS}, got {kv_format!r}")
    else:
        fmt = check_storage(name, kv_format, cache)
    want = head_dim // 2 if fmt in ("int4",) + S.ZP_FORMATS else head_dim
    if last != want:
        raise ValueError(f"{name}: last dim {last}, expected {want} for a {fmt} cache with head_dim {head_dim}")
    return fmt


def _group_scales(op, scale, name, cache, head_dim, device):
    """Check an int8/int4 per-group scale tensor against its cache; returns the group size."""
    rules.tensor(op, name, scale, (torch.float16, torch.bfloat16, torch.float32), device=device)
    if scale.dim() != cache.dim() or scale.shape[:-1] != cache.shape[:-1]:
        raise ValueError(f"{name}: shape {tuple(scale.shape)} must be the cache's {tuple(cache.shape[:-1])} "
                         f"plus head_dim // group")
    groups = scale.shape[-1]
    group = head_dim // groups if groups and head_dim % groups == 0 else 0
    if not (S.MIN_QUANT_GROUP <= group <= S.MAX_QUANT_GROUP and group & (group - 1) == 0):
        raise ValueError(f"{name}: last dim {groups} gives group size head_dim/{groups}; the group must be a "
                         f"power of two in [{S.MIN_QUANT_GROUP}, {S.MAX_QUANT_GROUP}]")
    rules.unit_last(op, name, scale)
    return group


def _fp8_scale(op, scale, name, kv_heads, device):
    """fp8 scale: None (1.0), a one-element tensor or one per kv head. Returns (fp32 tensor, head stride)."""
    if scale is None:
        return None, 0
    rules.tensor(op, name, scale, (torch.float16, torch.bfloat16, torch.float32), device=device)
    if scale.numel() == 1:
        return scale, 0
    if scale.dim() != 1 or scale.shape[0] != kv_heads:
        raise ValueError(f"{name}: an fp8 scale is a scalar or [kv_heads={kv_heads}] (or, fp8_e4m3, the cache's "
                         f"shape with last dim 1: one a token), got {tuple(scale.shape)}")
    return scale, scale.stride(0)


def _fp8_token_scales(op, k_scale, v_scale, cache, fmt, device):
    """fp8 with one fp32 scale a token and KV head (vLLM's FP8_PER_TOKEN_HEAD: k_scale_cache
    [blocks, block_size, kv_heads] as [..., 1]): the cache's shape with last dim 1, any strides."""
    if fmt not in S.FP8_PER_TOKEN_FORMATS:
        raise NotImplementedError(f"k_scale: one scale a token for a {fmt} cache is not implemented (fp8 per token: "
                                  f"{S.FP8_PER_TOKEN_FORMATS})")
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        rules.tensor(op, name, t, (torch.float32,), device=device)
        if tuple(t.shape) != tuple(cache.shape[:-1]) + (1,):
            raise ValueError(f"{name}: one fp32 scale a token and head is the cache's shape {tuple(cache.shape[:-1])} "
                             f"plus a last dim of 1, got {tuple(t.shape)}")


def _zp_scales(op, kv, k_scale, v_scale, cache, head_dim, device) -> None:
    """int4_zp (vLLM's INT4_PER_TOKEN_HEAD codes): even strides (read two bytes at a time), one fp32
    scale word a token and head, the cache's shape with last dim 1, any strides; set on kv."""
    if head_dim not in S.PER_TOKEN_HEAD_DIMS:
        raise ValueError(f"q: head_dim {head_dim}: an {kv.fmt} cache is read at head dims {S.PER_TOKEN_HEAD_DIMS}")
    for name, t in (("k_cache", kv.k), ("v_cache", kv.v)):
        if any(st % 2 for n, st in zip(t.shape[:-1], t.stride()[:-1]) if n > 1):
            raise ValueError(f"{name}: an {kv.fmt} cache is read two bytes at a time, so its strides must be even; "
                             f"got {t.stride()}")
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is None:
            raise ValueError(f"an {kv.fmt} cache needs k_scale and v_scale (fp32 scale words)")
        rules.tensor(op, name, t, (torch.float32,), device=device)
        if tuple(t.shape) != tuple(cache.shape[:-1]) + (1,):
            raise ValueError(f"{name}: one fp32 scale word a token and head is the cache's shape "
                             f"{tuple(cache.shape[:-1])} plus a last dim of 1, got {tuple(t.shape)}")
    kv.ks, kv.vs, kv.group, kv.token = as_paged(k_scale), as_paged(v_scale), head_dim, True


class KV:
    """A checked cache: format, [pages, page_size, kv_heads, d] views, scales.

    (Plain classes here and below: a dataclass costs ~1 ms to create at import, which the first
    `decode` in a process pays.)"""

    __slots__ = ("fmt", "k", "v", "ks", "vs", "group", "scale_name", "ks_head_stride", "vs_head_stride", "channel",
                 "token")

    def __init__(self, fmt, k, v, ks, vs, group, scale_name, ks_head_stride=0, vs_head_stride=0, channel=False):
        self.fmt, self.k, self.v = fmt, k, v
        # int: [pages, page_size, kv_heads, groups], or [kv_heads, head_dim] (channel); fp8: scalar/[kv_heads]
        self.ks, self.vs = ks, vs
        self.group, self.scale_name = group, scale_name
        self.ks_head_stride, self.vs_head_stride = ks_head_stride, vs_head_stride
        self.channel = channel
        self.token = False  # fp8 with one scale a token (int8/int4: group == head_dim says it)


SCALE_LAYOUTS = ("group", "channel")


def _channel_scales(op, scale, name, kv_heads, head_dim, device):
    """Check an int8 per-channel scale: [kv_heads, head_dim] fp32, channels contiguous."""
    rules.tensor(op, name, scale, (torch.float32,), dim=2, device=device)
    if tuple(scale.shape) != (kv_heads, head_dim):
        raise ValueError(f"{name}: per-channel scales are [kv_heads, head_dim] = [{kv_heads}, {head_dim}], got "
                         f"{tuple(scale.shape)}")
    rules.unit_last(op, name, scale)


def check_cache(op, k_cache, v_cache, k_scale, v_scale, kv_format, head_dim, device, scale_layout="group") -> KV:
    rules.tensor(op, "k_cache", k_cache, dim=(3, 4), device=device)
    rules.tensor(op, "v_cache", v_cache, dim=(3, 4), device=device)
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache ({tuple(v_cache.shape)}, {v_cache.dtype}) must match k_cache "
                         f"({tuple(k_cache.shape)}, {k_cache.dtype})")
    fmt = resolve_format(kv_format, k_cache, head_dim)
    rules.unit_last(op, "k_cache", k_cache)
    rules.unit_last(op, "v_cache", v_cache)
    kv = KV(fmt, as_paged(k_cache), as_paged(v_cache), None, None, S.MAX_QUANT_GROUP, "fp32")
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {SCALE_LAYOUTS}, got {scale_layout!r}")
    if scale_layout == "channel" and fmt != "int8":
        raise ValueError(f"scale_layout='channel' (scales [kv_heads, head_dim]) is for int8 caches, not {fmt}")
    if fmt in S.INT_FORMATS:
        for name, t in (("k_cache", kv.k), ("v_cache", kv.v)):
            if any(st % 2 for n, st in zip(t.shape[:-1], t.stride()[:-1]) if n > 1):
                raise ValueError(f"{name}: an {fmt} cache is read two bytes at a time, so its strides must be "
                                 f"even; got {t.stride()}")
        if k_scale is None or v_scale is None:
            raise ValueError(f"a {fmt} cache needs k_scale and v_scale")
        if scale_layout == "channel":
            kv_heads = kv.k.shape[2]
            _channel_scales(op, k_scale, "k_scale", kv_heads, head_dim, device)
            _channel_scales(op, v_scale, "v_scale", kv_heads, head_dim, device)
            kv.ks, kv.vs, kv.channel = k_scale, v_scale, True
            kv.ks_head_stride, kv.vs_head_stride = k_scale.stride(0), v_scale.stride(0)
            return kv
        kv.group = _group_scales(op, k_scale, "k_scale", k_cache, head_dim, device)
        _group_scales(op, v_scale, "v_scale", v_cache, head_dim, device)
        if v_scale.shape != k_scale.shape or v_scale.dtype != k_scale.dtype:
            raise ValueError("v_scale must have k_scale's shape and dtype")
        kv.ks, kv.vs, kv.scale_name = as_paged(k_scale), as_paged(v_scale), FLOAT_NAMES[k_scale.dtype]
    elif fmt in S.ZP_FORMATS:
        _zp_scales(op, kv, k_scale, v_scale, k_cache, head_dim, device)
    elif (fmt in FP8_DTYPES and isinstance(k_scale, torch.Tensor) and k_scale.dim() == k_cache.dim()
          and k_scale.shape[-1] == 1 and k_scale.numel() > 1):
        _fp8_token_scales(op, k_scale, v_scale, k_cache, fmt, device)  # one scale a token and head
        kv.ks, kv.vs, kv.group, kv.token = as_paged(k_scale), as_paged(v_scale), head_dim, True
    elif fmt in FP8_DTYPES:
        kv_heads = kv.k.shape[2]
        kv.ks, kv.ks_head_stride = _fp8_scale(op, k_scale, "k_scale", kv_heads, device)
        kv.vs, kv.vs_head_stride = _fp8_scale(op, v_scale, "v_scale", kv_heads, device)
    elif k_scale is not None or v_scale is not None:
        raise ValueError(f"k_scale/v_scale are for int8, int4 and fp8 caches, not {fmt}")
    return kv


def check_rows(op, table, seq_lens, req_idx, sinks, batch: int, q_heads: int, dev) -> None:
    """The request-indexing tensors every decode kernel reads: table [rows, max_pages] int32 (unit
    last stride), seq_lens and req_idx [batch] int32 contiguous, sinks [q_heads] fp32."""
    rules.tensor(op, "table", table, (torch.int32,), dim=2, device=dev)
    rules.unit_last(op, "table", table)
    rules.tensor(op, "seq_lens", seq_lens, (torch.int32,), dim=1, device=dev)
    if seq_lens.shape[0] != batch or not seq_lens.is_contiguous():
        raise ValueError(f"seq_lens: expected a contiguous [batch={batch}] tensor, got {tuple(seq_lens.shape)}")
    if req_idx is not None:
        rules.tensor(op, "req_idx", req_idx, (torch.int32,), dim=1, device=dev)
        if req_idx.shape[0] != batch or not req_idx.is_contiguous():
            raise ValueError(f"req_idx: expected a contiguous [batch={batch}] tensor, got {tuple(req_idx.shape)}")
    elif table.shape[0] < batch:
        raise ValueError(f"table: {table.shape[0]} rows for batch {batch} (row b serves request b without req_idx)")
    if sinks is not None:
        rules.tensor(op, "sinks", sinks, (torch.float32,), dim=1, device=dev)
        if sinks.shape[0] != q_heads or not sinks.is_contiguous():
            raise ValueError(f"sinks: expected a contiguous [q_heads={q_heads}] tensor, got {tuple(sinks.shape)}")


def check_page_values(d) -> None:
    """Lengths within the table, req_idx within its rows, used page ids within the cache, of a
    checked call `d` (attributes q, kv.k, table, seq_lens, req_idx, window).

    The values are copied to the host (seq_lens, req_idx, then the table rows in use) and
    checked there: plain device-to-host copies and one sync, no GPU kernel, so even a first call
    in a fresh process loads no extra device code.
    """
    batch = d.q.shape[0]
    if batch == 0 or skip_value_checks(d.q):
        return
    rows_n, max_pages = d.table.shape
    pages_n, page_size = d.kv.k.shape[:2]
    cap = max_pages * page_size
    lens = d.seq_lens.cpu()
    bad = (lens < 0) | (lens > cap)
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        raise ValueError(f"seq_lens[{b}] = {int(lens[b])} is outside [0, {cap}] (table of {max_pages} pages "
                         f"of {page_size} tokens)")
    if d.req_idx is not None:
        rows = d.req_idx.cpu().long()
        bad = (rows < 0) | (rows >= rows_n)
        if bool(bad.any()):
            b = int(bad.nonzero()[0, 0])
            raise ValueError(f"req_idx[{b}] = {int(rows[b])} is outside the table's {rows_n} rows")
    else:
        rows = torch.arange(batch, device="cpu")  # host checks: whatever torch's default device
    lens = lens.long()
    used_cols = int(((lens + page_size - 1) // page_size).max())
    if used_cols == 0:
        return
    # Only the columns any request uses; with req_idx only the rows it names (gathered on the host).
    top = int(rows.max()) + 1
    ids = d.table[:top, :used_cols].cpu()[rows]
    first = (lens - d.window).clamp_min(0) // page_size if d.window else torch.zeros_like(lens)
    col = torch.arange(used_cols, device="cpu")
    used = (col >= first[:, None]) & (col < ((lens + page_size - 1) // page_size)[:, None])
    bad = used & ((ids < 0) | (ids >= pages_n))
    if bool(bad.any()):
        b, c = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"table[{int(rows[b])}, {c}] = {int(ids[b, c])} (used by request {b}) is not a page "
                         f"of the {pages_n}-page cache")

