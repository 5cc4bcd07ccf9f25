"""Paged flash-decoding (`decode`); the cache writer that feeds it is `store_kv.py`, which
shares this module's cache checks.

`decode` is also a `torch.library` custom op (`torch.ops.aotc.decode`, mutating `out` and
returning nothing) with a fake implementation, so `torch.compile(fullgraph=True)` traces through
it. The public function runs the same checks and code; under compilation it calls the op.
"""
from __future__ import annotations

import contextlib
import math

import torch

from aotc.kernels.decode import spec as S

from .. import workspace
from . import guards, library
from ..dispatch import prepare, programs_per_sm, register_plan_cache, run_kernel
from ..sm_count import cuda_sm_count
from .value_checks import skip_value_checks

_FLOAT_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_FP8_NAMES = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}
_FP8_DTYPES = {v: k for k, v in _FP8_NAMES.items()}
_STORAGE = {  # dtypes a cache of each format may have (fp8 also as its raw bytes)
    "fp16": (torch.float16,), "bf16": (torch.bfloat16,), "int8": (torch.int8,),
    "int4": (torch.int8, torch.uint8),
    "fp8_e4m3": (torch.float8_e4m3fn, torch.int8, torch.uint8),
    "fp8_e5m2": (torch.float8_e5m2, torch.int8, torch.uint8),
}
_I32_MAX = 2 ** 31 - 1


def _tensor(t, name, dtypes=None, dim=None, device=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name}: dtype {t.dtype}, expected {' or '.join(map(str, dtypes))}")
    if dim is not None and t.dim() not in ((dim,) if isinstance(dim, int) else dim):
        raise ValueError(f"{name}: expected {dim} dims, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (the device of the first argument)")
    return t


def _unit_last(t, name):
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dim must be contiguous (stride 1), got strides {t.stride()}")


def _as_paged(t):
    """A 3-D token-level cache [slots, heads, d] is page size 1: view it as [slots, 1, heads, d]."""
    return t.unsqueeze(1) if t.dim() == 3 else t


def resolve_format(kv_format: str, cache: torch.Tensor, head_dim: int, name: str = "k_cache") -> str:
    """The cache format for `kv_format` ("auto" infers it from dtype and last dim); checked."""
    last = cache.shape[-1]
    if kv_format == "auto":
        if cache.dtype in (torch.float16, torch.bfloat16):
            fmt = _FLOAT_NAMES[cache.dtype]
        elif cache.dtype in _FP8_NAMES:
            fmt = _FP8_NAMES[cache.dtype]
        elif cache.dtype == torch.uint8 or (cache.dtype == torch.int8 and last * 2 == head_dim):
            fmt = "int4"
        elif cache.dtype == torch.int8:
            fmt = "int8"
        else:
            raise TypeError(f"{name}: cannot infer a cache format from dtype {cache.dtype}; "
                            f"expected fp16, bf16, int8, uint8 (int4) or an fp8 dtype")
    elif kv_format not in S.KV_FORMATS:
        raise ValueError(f"kv_format must be 'auto' or one of {S.KV_FORMATS}, got {kv_format!r}")
    else:
        fmt = kv_format
        if cache.dtype not in _STORAGE[fmt]:
            raise TypeError(f"{name}: a {fmt} cache must have dtype {' or '.join(map(str, _STORAGE[fmt]))}, "
                            f"got {cache.dtype}")
    want = head_dim // 2 if fmt == "int4" else head_dim
    if last != want:
        raise ValueError(f"{name}: last dim {last}, expected {want} for a {fmt} cache with head_dim {head_dim}")
    return fmt


def _group_scales(scale, name, cache, head_dim, device):
    """Check an int8/int4 per-group scale tensor against its cache; returns the group size."""
    _tensor(scale, name, (torch.float16, torch.bfloat16, torch.float32), device=device)
    if scale.dim() != cache.dim() or scale.shape[:-1] != cache.shape[:-1]:
        raise ValueError(f"{name}: shape {tuple(scale.shape)} must be the cache's {tuple(cache.shape[:-1])} "
                         f"plus head_dim // group")
    groups = scale.shape[-1]
    group = head_dim // groups if groups and head_dim % groups == 0 else 0
    if not (S.MIN_QUANT_GROUP <= group <= S.MAX_QUANT_GROUP and group & (group - 1) == 0):
        raise ValueError(f"{name}: last dim {groups} gives group size head_dim/{groups}; the group must be a "
                         f"power of two in [{S.MIN_QUANT_GROUP}, {S.MAX_QUANT_GROUP}]")
    _unit_last(scale, name)
    return group


def _fp8_scale(scale, name, kv_heads, device):
    """fp8 scale: None (1.0), a one-element tensor or one per kv head. Returns (fp32 tensor, head stride)."""
    if scale is None:
        return None, 0
    _tensor(scale, name, (torch.float16, torch.bfloat16, torch.float32), device=device)
    if scale.numel() == 1:
        return scale, 0
    if scale.dim() != 1 or scale.shape[0] != kv_heads:
        raise ValueError(f"{name}: an fp8 scale is a scalar or [kv_heads={kv_heads}] (or, fp8_e4m3, the cache's "
                         f"shape with last dim 1: one a token), got {tuple(scale.shape)}")
    return scale, scale.stride(0)


class _KV:
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


def _channel_scales(scale, name, kv_heads, head_dim, device):
    """Check an int8 per-channel scale: [kv_heads, head_dim] fp32, channels contiguous."""
    _tensor(scale, name, (torch.float32,), dim=2, device=device)
    if tuple(scale.shape) != (kv_heads, head_dim):
        raise ValueError(f"{name}: per-channel scales are [kv_heads, head_dim] = [{kv_heads}, {head_dim}], got "
                         f"{tuple(scale.shape)}")
    _unit_last(scale, name)


def _fp8_token_scales(k_scale, v_scale, cache, fmt, device):
    """fp8 with one fp32 scale a token and KV head (vLLM's FP8_PER_TOKEN_HEAD: k_scale_cache
    [blocks, block_size, kv_heads] as [..., 1]): the cache's shape with last dim 1, any strides."""
    if fmt not in S.FP8_PER_TOKEN_FORMATS:
        raise NotImplementedError(f"k_scale: one scale a token for a {fmt} cache is not implemented (fp8 per token: "
                                  f"{S.FP8_PER_TOKEN_FORMATS})")
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        _tensor(t, name, (torch.float32,), device=device)
        if tuple(t.shape) != tuple(cache.shape[:-1]) + (1,):
            raise ValueError(f"{name}: one fp32 scale a token and head is the cache's shape {tuple(cache.shape[:-1])} "
                             f"plus a last dim of 1, got {tuple(t.shape)}")


def _check_cache(k_cache, v_cache, k_scale, v_scale, kv_format, head_dim, device, scale_layout="group") -> _KV:
    _tensor(k_cache, "k_cache", dim=(3, 4), device=device)
    _tensor(v_cache, "v_cache", dim=(3, 4), device=device)
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache ({tuple(v_cache.shape)}, {v_cache.dtype}) must match k_cache "
                         f"({tuple(k_cache.shape)}, {k_cache.dtype})")
    fmt = resolve_format(kv_format, k_cache, head_dim)
    _unit_last(k_cache, "k_cache")
    _unit_last(v_cache, "v_cache")
    kv = _KV(fmt, _as_paged(k_cache), _as_paged(v_cache), None, None, S.MAX_QUANT_GROUP, "fp32")
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
            _channel_scales(k_scale, "k_scale", kv_heads, head_dim, device)
            _channel_scales(v_scale, "v_scale", kv_heads, head_dim, device)
            kv.ks, kv.vs, kv.channel = k_scale, v_scale, True
            kv.ks_head_stride, kv.vs_head_stride = k_scale.stride(0), v_scale.stride(0)
            return kv
        kv.group = _group_scales(k_scale, "k_scale", k_cache, head_dim, device)
        _group_scales(v_scale, "v_scale", v_cache, head_dim, device)
        if v_scale.shape != k_scale.shape or v_scale.dtype != k_scale.dtype:
            raise ValueError("v_scale must have k_scale's shape and dtype")
        kv.ks, kv.vs, kv.scale_name = _as_paged(k_scale), _as_paged(v_scale), _FLOAT_NAMES[k_scale.dtype]
    elif (fmt in _FP8_DTYPES and isinstance(k_scale, torch.Tensor) and k_scale.dim() == k_cache.dim()
          and k_scale.shape[-1] == 1 and k_scale.numel() > 1):
        _fp8_token_scales(k_scale, v_scale, k_cache, fmt, device)  # one scale a token and head
        kv.ks, kv.vs, kv.group, kv.token = _as_paged(k_scale), _as_paged(v_scale), head_dim, True
    elif fmt in _FP8_DTYPES:
        kv_heads = kv.k.shape[2]
        kv.ks, kv.ks_head_stride = _fp8_scale(k_scale, "k_scale", kv_heads, device)
        kv.vs, kv.vs_head_stride = _fp8_scale(v_scale, "v_scale", kv_heads, device)
    elif k_scale is not None or v_scale is not None:
        raise ValueError(f"k_scale/v_scale are for int8, int4 and fp8 caches, not {fmt}")
    return kv


def _check_halfword_aligned(k_ptr: int, v_ptr: int, fmt: str, mask: int = 1) -> None:
    # Checked on every call, the plan's too: a plan is keyed by metadata, not by address.
    if (k_ptr | v_ptr) & mask:
        name = "k_cache" if k_ptr & mask else "v_cache"
        if mask == 1:
            raise ValueError(f"{name}: an {fmt} cache is read two bytes at a time; its data must start at an even "
                             f"address (it is a view at an odd byte offset)")
        raise ValueError(f"{name}: this per-token {fmt} cache is read 4 bytes at a time (kv_align 4); its data must "
                         f"start at a multiple of 4 bytes")


class _Decode:
    """A checked decode call."""

    __slots__ = ("q", "kv", "table", "seq_lens", "req_idx", "sinks", "sm_scale", "window", "splits", "lse", "alibi",
                 "alibi_mode", "softcap")

    def __init__(self, q, kv, table, seq_lens, req_idx, sinks, sm_scale, window, splits, lse=None, alibi=None,
                 alibi_mode=0, softcap=0.0):
        self.q, self.kv, self.table, self.seq_lens, self.req_idx = q, kv, table, seq_lens, req_idx
        self.sinks, self.sm_scale, self.window, self.splits, self.lse = sinks, sm_scale, window, splits, lse
        self.alibi, self.alibi_mode, self.softcap = alibi, alibi_mode, softcap


def check_rows(table, seq_lens, req_idx, sinks, batch: int, q_heads: int, dev) -> None:
    """The request-indexing tensors every decode kernel reads: table [rows, max_pages] int32 (unit
    last stride), seq_lens and req_idx [batch] int32 contiguous, sinks [q_heads] fp32."""
    _tensor(table, "table", (torch.int32,), dim=2, device=dev)
    _unit_last(table, "table")
    _tensor(seq_lens, "seq_lens", (torch.int32,), dim=1, device=dev)
    if seq_lens.shape[0] != batch or not seq_lens.is_contiguous():
        raise ValueError(f"seq_lens: expected a contiguous [batch={batch}] tensor, got {tuple(seq_lens.shape)}")
    if req_idx is not None:
        _tensor(req_idx, "req_idx", (torch.int32,), dim=1, device=dev)
        if req_idx.shape[0] != batch or not req_idx.is_contiguous():
            raise ValueError(f"req_idx: expected a contiguous [batch={batch}] tensor, got {tuple(req_idx.shape)}")
    elif table.shape[0] < batch:
        raise ValueError(f"table: {table.shape[0]} rows for batch {batch} (row b serves request b without req_idx)")
    if sinks is not None:
        _tensor(sinks, "sinks", (torch.float32,), dim=1, device=dev)
        if sinks.shape[0] != q_heads or not sinks.is_contiguous():
            raise ValueError(f"sinks: expected a contiguous [q_heads={q_heads}] tensor, got {tuple(sinks.shape)}")


def _check_score_mod(alibi_slopes, alibi_sqrt, softcap, q_heads, kv, head_dim, dev) -> tuple[int, float]:
    """(alibi_mode, softcap) for the split kernel: 0 off, 1 linear, 2 sqrt; NotImplementedError for
    caches without a "mod" binary (int8/int4 per group or channel, int4 per token)."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not 0 <= softcap < math.inf:
        raise ValueError(f"softcap must be a finite float >= 0 (0: off), got {softcap!r}")
    if alibi_slopes is not None:
        _tensor(alibi_slopes, "alibi_slopes", (torch.float32,), dim=1, device=dev)
        if alibi_slopes.shape[0] != q_heads or not alibi_slopes.is_contiguous():
            raise ValueError(f"alibi_slopes: expected a contiguous [q_heads={q_heads}] tensor, got "
                             f"{tuple(alibi_slopes.shape)}")
    elif alibi_sqrt:
        raise ValueError("alibi_sqrt=True needs alibi_slopes")
    mode = 0 if alibi_slopes is None else 2 if alibi_sqrt else 1
    if (mode or softcap) and kv.fmt in S.INT_FORMATS and not (kv.fmt == "int8" and kv.group == head_dim
                                                                 and not kv.channel):
        raise NotImplementedError(f"softcap / alibi_slopes with an {kv.fmt} cache is implemented for int8 with one "
                                  f"scale a token only")
    return mode, float(softcap)


def _check_decode(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale,
                  window, sinks, num_splits, out, lse=None, scale_layout="group", alibi_slopes=None, alibi_sqrt=False,
                  softcap=0.0) -> _Decode:
    """Every check that needs no tensor values (safe under tracing and graph capture)."""
    guards.refuse_grad("decode", q=q, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale,
                       sinks=sinks, out=out, lse=lse, alibi_slopes=alibi_slopes)
    _tensor(q, "q", (torch.float16, torch.bfloat16), dim=3)
    dev = q.device
    batch, q_heads, head_dim = q.shape
    if head_dim not in S.HEAD_DIMS:
        raise ValueError(f"q: head_dim {head_dim} is not supported; expected one of {S.HEAD_DIMS}")
    if batch > S.MAX_BATCH:
        raise ValueError(f"q: batch {batch} is over {S.MAX_BATCH} (the split grid's second dimension)")
    _unit_last(q, "q")
    kv = _check_cache(k_cache, v_cache, k_scale, v_scale, kv_format, head_dim, dev, scale_layout)
    if kv.fmt in ("fp16", "bf16") and kv.fmt != _FLOAT_NAMES[q.dtype]:
        raise TypeError(f"k_cache: an {kv.fmt} cache needs an {kv.fmt} query, got q of dtype {q.dtype}")
    kv_heads = kv.k.shape[2]
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
    check_rows(table, seq_lens, req_idx, sinks, batch, q_heads, dev)
    alibi_mode, softcap = _check_score_mod(alibi_slopes, alibi_sqrt, softcap, q_heads, kv, head_dim, dev)
    if out is not None:
        _tensor(out, "out", (q.dtype,), dim=3, device=dev)
        if out.shape != q.shape:
            raise ValueError(f"out: shape {tuple(out.shape)}, expected q's {tuple(q.shape)}")
        _unit_last(out, "out")
    if lse is not None:
        _tensor(lse, "lse", (torch.float32,), dim=2, device=dev)
        if lse.shape != q.shape[:2]:
            raise ValueError(f"lse: shape {tuple(lse.shape)}, expected [batch, q_heads] = {tuple(q.shape[:2])}")
        _unit_last(lse, "lse")
    sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else guards.real("decode", "sm_scale", sm_scale)
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"window must be None or an int >= 1, got {window!r}")
    if num_splits is not None:
        guards.integer("decode", "num_splits", num_splits, 1, S.MAX_SPLITS)
    page_size, max_pages = kv.k.shape[1], table.shape[1]
    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"k_cache: page size {page_size} (dim 1 of {tuple(k_cache.shape)}) is not a power of two; "
                         f"decode reads pages of 1, 2, 4, ... 2^k tokens")
    if page_size * max_pages > _I32_MAX:
        raise ValueError(f"table: {max_pages} pages of {page_size} tokens exceed int32 token indices")
    for name, t in (("q", q), ("k_cache", kv.k), ("v_cache", kv.v), ("table", table), ("out", out),
                    ("k_scale", kv.ks), ("v_scale", kv.vs), ("lse", lse)):
        if t is not None and max(t.stride(), default=0) > _I32_MAX:
            raise ValueError(f"{name}: strides {t.stride()} exceed int32")
    guards.check_outputs("decode", {"out": out, "lse": lse}, _inputs(q, k_cache, v_cache, table, seq_lens, req_idx,
                                                                     k_scale, v_scale, sinks, alibi_slopes))
    return _Decode(q, kv, table, seq_lens, req_idx, sinks, float(sm_scale), window or 0, num_splits, lse,
                   alibi_slopes, alibi_mode, softcap)


def _inputs(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, sinks, alibi_slopes=None) -> dict:
    """What decode reads, by name, in the order `_Plan.apart` takes it after out and lse."""
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "table": table, "seq_lens": seq_lens, "req_idx": req_idx,
            "k_scale": k_scale, "v_scale": v_scale, "sinks": sinks, "alibi_slopes": alibi_slopes}


def _check_decode_values(d: _Decode) -> None:
    """Lengths within the table, req_idx within its rows, used page ids within the cache.

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
        rows = torch.arange(batch, device="cpu")  # host checks: whatever the default device
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


def _sm_count(device) -> int:
    if device.type != "cuda":
        return 2  # interpreter runs: few programs, since each runs serially in Python
    return cuda_sm_count(device)


_ones: dict[torch.device, torch.Tensor] = {}


def _one(device) -> torch.Tensor:
    if device not in _ones:
        _ones[device] = torch.ones(1, dtype=torch.float32, device=device)
    return _ones[device]


class _Plan:
    """Everything a decode launch needs that follows from the inputs' metadata alone.

    split_ints / merge_ints: the kernels' non-pointer arguments, in order. byte_view: fp8/int4
    caches are read as int8 bytes. halfword: int8/int4 caches, which the kernel reads as int16
    words, so their addresses must be even (checked every call). fast_split / fast_merge: for CUDA plans whose binaries are
    built, both launches with their non-pointer arguments packed (dispatch.Prepared); None takes
    run_kernel's general path (CPU, JIT fallback, another device)."""

    __slots__ = ("split_axes", "split_grid", "merge_axes", "merge_grid", "n_o", "n_lse", "split_ints", "merge_ints",
                 "byte_view", "fp8", "halfword", "fmt", "device", "fast_split", "fast_merge", "apart", "word_mask")

    def __init__(self, split_axes, split_grid, merge_axes, merge_grid, n_o, n_lse, split_ints, merge_ints, byte_view,
                 fp8, fmt, device):
        self.split_axes, self.split_grid, self.merge_axes, self.merge_grid = split_axes, split_grid, merge_axes, merge_grid
        self.n_o, self.n_lse, self.split_ints, self.merge_ints = n_o, n_lse, split_ints, merge_ints
        self.byte_view, self.fp8, self.fmt, self.device = byte_view, fp8, fmt, device
        self.halfword = fmt in S.INT_FORMATS  # int8/int4 caches are read as int16 words
        # the address bits a cache must have clear: kv_align 4 binaries read 4-byte vectors
        self.word_mask = 3 if int(split_axes.get("kv_align", 16)) == 4 else 1 if self.halfword else 0
        self.fast_split = self.fast_merge = None
        self.apart = None  # guards.Apart: out and lse apart from the inputs, by this call's pointers


def _make_plan(d: _Decode, out: torch.Tensor) -> _Plan:
    q, kv, table = d.q, d.kv, d.table
    batch, q_heads, head_dim = q.shape
    kv_heads = kv.k.shape[2]
    group = q_heads // kv_heads
    if kv.channel:
        ks_strides, vs_strides = (0, 0, kv.ks_head_stride), (0, 0, kv.vs_head_stride)
    elif kv.fmt in S.INT_FORMATS or kv.token:
        ks_strides, vs_strides = kv.ks.stride()[:3], kv.vs.stride()[:3]
    elif kv.fmt in _FP8_DTYPES:
        ks_strides, vs_strides = (0, 0, kv.ks_head_stride), (0, 0, kv.vs_head_stride)
    else:
        ks_strides = vs_strides = (0, 0, 0)
    split_ints = [d.sm_scale, d.window, int(d.req_idx is not None), kv.k.shape[1].bit_length() - 1, table.shape[1],
                  table.stride(0), q_heads, group, kv.group.bit_length() - 1, q.stride(0), q.stride(1), *kv.k.stride()[:3],
                  *kv.v.stride()[:3], *ks_strides, *vs_strides, d.softcap, d.alibi_mode]
    score = "mod" if d.softcap or d.alibi_mode else "plain"
    if kv.channel:
        split_axes = S.split_axes(_FLOAT_NAMES[q.dtype], kv.fmt, kv.scale_name, head_dim, channel=True)
    else:
        per_token = (kv.fmt in S.INT_FORMATS and kv.group == head_dim) or kv.token
        split_axes = S.split_axes(_FLOAT_NAMES[q.dtype], kv.fmt, kv.scale_name, head_dim, per_token,
                                  0 if per_token else kv.group, score=score,
                                  kv_align=_kv_align(kv, per_token, score, head_dim))
    tiles = S.split_tiles(kv.fmt, head_dim, split_axes["scales"])
    split_axes["tile"] = S.choose_tile(tiles, batch * kv_heads * S.head_blocks(group), _sm_count(q.device))
    fp8 = kv.fmt in _FP8_DTYPES
    byte_view = fp8 or kv.fmt == "int4"
    splits = d.splits
    if not splits:
        per_sm = None
        if q.is_cuda and batch:
            ws = workspace.get(q.device, 16)  # stands in for the workspace: only its alignment matters
            per_sm = programs_per_sm(S.SPLIT, split_axes, _split_args(
                fp8, byte_view, q, kv.k, kv.v, kv.ks, kv.vs, table, d.req_idx, d.seq_lens, ws, ws, split_ints),
                q.device.index)
        splits = S.num_splits(batch, kv_heads, group, _sm_count(q.device), per_sm)
    n_o, n_lse = S.workspace_elements(batch, q_heads, splits, head_dim)
    lse = d.lse
    merge_ints = [int(d.sinks is not None), int(lse is not None), q_heads, splits, out.stride(0), out.stride(1),
                  lse.stride(0) if lse is not None else 0]
    plan = _Plan(split_axes, S.split_grid(batch, kv_heads, group, splits),
                 S.merge_axes(_FLOAT_NAMES[out.dtype], head_dim, splits), S.merge_grid(batch, q_heads),
                 n_o, n_lse, split_ints, merge_ints, byte_view, fp8, kv.fmt, q.device)
    if q.is_cuda and all(plan.split_grid) and all(plan.merge_grid):
        split = prepare(S.SPLIT, plan.split_axes, plan.split_grid, split_ints, q.device.index)
        merge = prepare(S.MERGE, plan.merge_axes, plan.merge_grid, merge_ints, q.device.index)
        if split is not None and merge is not None:
            plan.fast_split, plan.fast_merge = split, merge
    return plan


def _kv_align(kv, per_token: bool, score: str, head_dim: int) -> int:
    """4 for vLLM's per-token-head caches (int8 or fp8 e4m3, fp32 scales), whose rows start 4-byte
    aligned only (scales inline after each head's codes), and for their "mod" calls; else 16."""
    if not per_token or kv.fmt not in ("int8",) + S.FP8_PER_TOKEN_FORMATS:
        return 16
    strides = [st for t in (kv.k, kv.v) for n, st in zip(t.shape[:-1], t.stride()[:-1]) if n > 1]
    if kv.fmt == "int8" and score == "plain" and all(st % 16 == 0 for st in strides):
        return 16  # aotc's own layout: the 16-byte binaries
    if kv.scale_name != "fp32":
        raise NotImplementedError(f"k_scale: a per-token {kv.fmt} cache with {kv.scale_name} scales, unaligned rows "
                                  f"or softcap/ALiBi is implemented with fp32 scales only")
    if head_dim not in S.PER_TOKEN_HEAD_DIMS or any(st % 4 for st in strides):
        raise ValueError(f"k_cache/v_cache: strides {kv.k.stride()} / {kv.v.stride()}: a per-token {kv.fmt} cache "
                         f"read with softcap/ALiBi, fp8 codes or rows off 16 bytes needs 4-byte multiples")
    return 4


def _fp8_scales(k_scale, v_scale, device):
    return ((k_scale if k_scale is not None else _one(device)).float(),
            (v_scale if v_scale is not None else _one(device)).float())


def _launch_prepared(plan: _Plan, q, k_cache, v_cache, k_scale, v_scale, table, req_idx, seq_lens, sinks, out,
                     lse, stream, alibi=None) -> None:
    """The steady-state launch: pointers only; grids and every other argument are in the plan."""
    keep, part_o, part_lse = workspace.pair_pointers(plan.device, stream, plan.n_o, plan.n_lse)
    if plan.fp8:
        keep = _fp8_scales(k_scale, v_scale, plan.device)
        ks, vs = keep[0].data_ptr(), keep[1].data_ptr()
    elif k_scale is None:
        ks = vs = part_lse  # never read: fp16/bf16 caches have no scales
    else:
        ks, vs = k_scale.data_ptr(), v_scale.data_ptr()
    lens = seq_lens.data_ptr()
    kp, vp = k_cache.data_ptr(), v_cache.data_ptr()
    if plan.word_mask:
        _check_halfword_aligned(kp, vp, plan.fmt, plan.word_mask)
    with workspace.stream_lock(plan.device.index, stream):  # no other call's split between ours and our merge
        plan.fast_split((q.data_ptr(), kp, vp, ks, vs, table.data_ptr(),
                         lens if req_idx is None else req_idx.data_ptr(), lens, part_o, part_lse,
                         part_lse if alibi is None else alibi.data_ptr()), stream)
        plan.fast_merge((part_o, part_lse, part_lse if sinks is None else sinks.data_ptr(), out.data_ptr(),
                         part_lse if lse is None else lse.data_ptr()), stream)
    del keep


def _split_args(fp8, byte_view, q, k_cache, v_cache, k_scale, v_scale, table, req_idx, seq_lens, part_o, part_lse,
                split_ints, alibi=None) -> list:
    """The split kernel's arguments as run_kernel takes them (tensors, then the plan's ints)."""
    if fp8:
        ks, vs = _fp8_scales(k_scale, v_scale, q.device)
    elif k_scale is None:
        ks = vs = part_lse  # never read: fp16/bf16 caches have no scales
    else:
        ks, vs = k_scale, v_scale
    if byte_view and k_cache.dtype != torch.int8:
        k_cache, v_cache = k_cache.view(torch.int8), v_cache.view(torch.int8)  # raw bytes, widened in the kernel
    return [q, k_cache, v_cache, ks, vs, table, req_idx if req_idx is not None else seq_lens, seq_lens,
            part_o, part_lse, alibi if alibi is not None else part_lse, *split_ints]


def _launch(plan: _Plan, q, k_cache, v_cache, k_scale, v_scale, table, req_idx, seq_lens, sinks, out,
            lse=None, alibi=None) -> None:
    if plan.fast_split is not None:
        index = plan.device.index
        if torch._C._cuda_getDevice() == index:
            _launch_prepared(plan, q, k_cache, v_cache, k_scale, v_scale, table, req_idx, seq_lens, sinks, out,
                             lse, torch._C._cuda_getCurrentRawStream(index), alibi)
            return
    if plan.word_mask:
        _check_halfword_aligned(k_cache.data_ptr(), v_cache.data_ptr(), plan.fmt, plan.word_mask)
    if not all(plan.split_grid) or not all(plan.merge_grid):
        return
    part_o, part_lse = workspace.pair(q.device, plan.n_o, plan.n_lse)
    if q.is_cuda:
        index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        together = workspace.stream_lock(index, torch._C._cuda_getCurrentRawStream(index))
    else:
        together = contextlib.nullcontext()  # CPU: a fresh workspace a call
    with together:
        run_kernel(S.SPLIT, plan.split_axes, plan.split_grid,
                   _split_args(plan.fp8, plan.byte_view, q, k_cache, v_cache, k_scale, v_scale, table, req_idx,
                               seq_lens, part_o, part_lse, plan.split_ints, alibi))
        run_kernel(S.MERGE, plan.merge_axes, plan.merge_grid,
                   [part_o, part_lse, sinks if sinks is not None else part_lse, out,
                    lse if lse is not None else part_lse, *plan.merge_ints])


def _run_decode(d: _Decode, out: torch.Tensor) -> None:
    _launch(_make_plan(d, out), d.q, d.kv.k, d.kv.v, d.kv.ks, d.kv.vs, d.table, d.req_idx, d.seq_lens, d.sinks, out,
            d.lse, d.alibi)


def _meta(t):
    # size() and get_device() are the cheapest reads of shape and device (-1 on the CPU).
    return None if t is None else (t.size(), t.stride(), t.dtype, t.get_device())


# Plans by the inputs' metadata: a call whose tensors have the shapes, strides, dtypes and
# devices of a call already checked skips the checks and the argument derivation. Bounded, so
# a stream of ever-new shapes cannot grow it without limit; emptied by `set_artifacts`.
# `DecodePlan` (decode_plan.py) builds on the same plans.
_plans: dict = register_plan_cache({})
_MAX_PLANS = 4096


def plan_key(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale, window, sinks,
             num_splits, out, lse, scale_layout="group", alibi_slopes=None, alibi_sqrt=False, softcap=0.0):
    """The metadata a plan depends on; raises AttributeError/TypeError for non-tensors."""
    return (q.size(), q.stride(), q.dtype, q.get_device(), k_cache.size(), k_cache.stride(), k_cache.dtype,
            k_cache.get_device(), v_cache.size(), v_cache.stride(), v_cache.dtype, v_cache.get_device(),
            table.size(), table.stride(), table.dtype, table.get_device(), seq_lens.size(), seq_lens.stride(),
            seq_lens.dtype, seq_lens.get_device(), out.size(), out.stride(), out.dtype, out.get_device(),
            _meta(req_idx), _meta(k_scale), _meta(v_scale), _meta(sinks), _meta(lse), kv_format, sm_scale, window,
            num_splits, scale_layout, type(sm_scale), type(window), type(num_splits),  # True == 1, and hashes alike
            _meta(alibi_slopes), alibi_sqrt, softcap, type(alibi_sqrt), type(softcap))


def cached_plan(key, d: _Decode, out) -> _Plan:
    """The plan of `key` (made from the checked call `d` when it is new)."""
    plan = _plans.get(key) if key is not None else None
    if plan is None:
        plan = _make_plan(d, out)
        plan.apart = guards.Apart("decode", {"out": out, "lse": d.lse}, _inputs(
            d.q, d.kv.k, d.kv.v, d.table, d.seq_lens, d.req_idx, d.kv.ks, d.kv.vs, d.sinks, d.alibi))
        if key is not None:
            if len(_plans) >= _MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
    return plan


def _decode_op(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale, window, sinks,
               num_splits, out, lse=None, scale_layout="group", alibi_slopes=None, alibi_sqrt=False,
               softcap=0.0) -> None:
    d = _check_decode(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale,
                      window, sinks, num_splits, out, lse, scale_layout, alibi_slopes, alibi_sqrt, softcap)
    _run_decode(d, out)


def _decode_fake(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale, window,
                 sinks, num_splits, out, lse=None, scale_layout="group", alibi_slopes=None, alibi_sqrt=False,
                 softcap=0.0) -> None:
    _check_decode(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale, window,
                  sinks, num_splits, out, lse, scale_layout, alibi_slopes, alibi_sqrt, softcap)


library.define("decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor table, Tensor seq_lens, Tensor? req_idx, "
               "Tensor? k_scale, Tensor? v_scale, str kv_format, float? sm_scale, SymInt? window, Tensor? sinks, "
               "SymInt? num_splits, Tensor(a!) out, Tensor(b!)? lse=None, str scale_layout=\"group\", "
               "Tensor? alibi_slopes=None, bool alibi_sqrt=False, float softcap=0.0) -> ()", _decode_op, _decode_fake)


def _split_heads(q, k_cache, v_cache) -> bool:
    """Calls the MLA family serves (loader/ops/mla.py): key and value head sizes that differ, or an
    equal head size decode's kernel lacks (a multiple of 16 up to 512) over an fp16/bf16/fp8 cache."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k_cache, v_cache)) or k_cache.dim() not in (3, 4):
        return False
    d_k, d_v = k_cache.shape[-1], v_cache.shape[-1]
    if d_k != d_v:
        return True
    return (d_k not in S.HEAD_DIMS and q.dim() == 3 and q.shape[-1] == d_k
            and k_cache.dtype in (torch.float16, torch.bfloat16, *_FP8_DTYPES.values()))


def _is_prefix_view(k_cache, v_cache) -> bool:
    """v_cache is k_cache's first channels (MLA's latent cache passed twice): read it once. (Not
    under torch.compile, where fake tensors have no address: V is then read on its own.)"""
    if torch.compiler.is_compiling():
        return False
    return (v_cache.data_ptr() == k_cache.data_ptr() and v_cache.dtype == k_cache.dtype
            and v_cache.shape[:-1] == k_cache.shape[:-1] and v_cache.stride() == k_cache.stride()
            and v_cache.shape[-1] < k_cache.shape[-1])


def decode(q, k_cache, v_cache, table, seq_lens, *, req_idx=None, k_scale=None, v_scale=None, kv_format="auto",
           sm_scale=None, window=None, sinks=None, out=None, num_splits=None, return_lse=False, lse=None,
           scale_layout="group", alibi_slopes=None, alibi_sqrt=False, softcap=0.0, validate=True):
    """Attention of one new query token per request over its paged KV cache (flash-decoding).

    Shapes (B batch, H query heads, Hk kv heads with H % Hk == 0, D head_dim in 64/96/128/256):
      q        [B, H, D] fp16 or bf16, last dim contiguous; B <= 65535 (the split grid's second
               dimension), else ValueError.
      k_cache, v_cache  [pages, page_size, Hk, Dc] or token-level [slots, Hk, Dc] (page size 1);
               page_size a power of two.
               Dc = D for fp16/bf16 (same dtype as q), int8 and fp8 (float8_e4m3fn/e5m2, or their
               bytes as int8/uint8 with an explicit kv_format); Dc = D // 2 for int4 (int8 or uint8:
               channel 2i in the low nibble, 2i+1 in the high, each stored as value + 7).
               int8/int4 caches are read two bytes at a time: even strides and an even start
               address, else ValueError. Any strides with the last dim contiguous: a head-major
               cache [pages, Hk, page_size, Dc] is passed as its .transpose(1, 2) view.
      table    [rows, max_pages] int32 page ids: token t of request b is at page
               table[row, t // page_size], offset t % page_size, with row = req_idx[b] or b.
      seq_lens [B] int32 tokens per request, 0 <= len <= max_pages * page_size (0 gives zeros).
      req_idx  [B] int32 rows of `table`, or None.
      k_scale, v_scale  int8/int4: the cache's shape with last dim D // group (group a power of two
               in [8, 128]), fp16/bf16/fp32, value = code * scale. fp8: None (1.0), a one-element
               tensor, or [Hk]; or, for fp8_e4m3, one fp32 scale a token and KV head: the cache's
               shape with last dim 1, any strides (vLLM's FP8_PER_TOKEN_HEAD k_scale_cache[..., None]).
               None for fp16/bf16. int8/fp8 per-token caches whose rows start 4-byte aligned but not
               16 (vLLM's inline scales) read 4-byte vectors: strides and start a multiple of 4.
      scale_layout  "group" (the above) or "channel": int8 only, k_scale and v_scale [Hk, D] fp32
               (one scale a KV head and channel, constant over tokens, channels contiguous), value
               = code * scale[head, channel]. Said explicitly, so no scale shape is read two ways.
      kv_format  "auto" (from dtype and last dim), "fp16", "bf16", "int8", "int4", "fp8_e4m3", "fp8_e5m2".
      sm_scale float, default 1/sqrt(D). window int: attend to the last `window` tokens only.
      sinks    [H] fp32 logits joined to each head's softmax denominator (no value).
      softcap  > 0: natural-log scores s become softcap * tanh(s / softcap); then alibi_slopes [H]
               fp32 (contiguous) add slope * (key position - (seq_len - 1)), or with alibi_sqrt
               -slope * sqrt(seq_len - 1 - key position) (vLLM's two ALiBi forms). fp16/bf16/fp8
               caches and int8 with one scale a token; others raise NotImplementedError.
      out      [B, H, D] in q's dtype, written and returned; allocated when None.
      num_splits  sequence splits per request (default from batch, heads, the SM count and how many
               programs of the kernel's binary fit an SM, <= 64; never from lengths).
      return_lse  also return lse: [B, H] fp32, the natural-log log-sum-exp of the scaled scores
               (sm_scale * q.k) over the tokens attended (the window's when one is set) plus the
               sink's logit when sinks are given: the log of the softmax denominator `out` was
               divided by, so (out, lse) merges with another attention state as cascade/merge
               attention does. -inf for a request of length 0 without sinks.
      lse      [B, H] fp32 (last dim contiguous) to write it into; only with return_lse=True.
      validate  read lengths, req_idx and used page ids back to check them (one device sync;
               skipped under torch.compile and CUDA graph capture). The kernel clamps lengths to
               the table either way; out-of-range page ids are undefined behaviour.

    Unequal head sizes: k_cache [..., D_QK] and v_cache [..., D_V] (multiples of 16, D_QK <= 576
      and D_V <= 512, q [B, H, D_QK], out [B, H, D_V]; fp16/bf16/fp8 caches, fp8 scales one
      element each; page size <= 128), and an equal head size outside 64/96/128/256 up to 512,
      run on the MLA family (`aotc.loader.ops.mla`); a v_cache that is a view of k_cache's first
      D_V channels (an MLA latent cache) is read once.

    Returns out, or (out, lse) with return_lse=True.
    Errors: TypeError for a wrong type or dtype (a bool is not a number: num_splits=True,
    sm_scale=True), ValueError for a wrong shape, device, stride (each naming the argument) or
    value, and for an out or lse that is an expand()ed view or shares memory with another
    argument (checked by address on every call, plans too); NotImplementedError when grad mode is
    on and a tensor requires grad (aotc is inference-only). All raised before any launch. NaN and inf in the inputs
    are not checked: NaN in, NaN out (a non-finite q row, or a k/v row it attends to, gives that
    head NaN in out and lse; other heads are unaffected).
    """
    if _split_heads(q, k_cache, v_cache):
        if alibi_slopes is not None or softcap:
            raise NotImplementedError("softcap / alibi_slopes with unequal head sizes (the MLA family) are not "
                                      "implemented")
        if scale_layout != "group":
            raise NotImplementedError(f"scale_layout={scale_layout!r}: unequal head sizes take fp16/bf16/fp8 caches")
        from .mla import split_heads_decode

        return split_heads_decode(q, k_cache, v_cache, table, seq_lens, req_idx=req_idx, k_scale=k_scale,
                                  v_scale=v_scale, kv_format=kv_format, sm_scale=sm_scale, window=window, sinks=sinks,
                                  out=out, num_splits=num_splits, return_lse=return_lse, lse=lse,
                                  latent=_is_prefix_view(k_cache, v_cache), validate=validate)
    if lse is not None and not return_lse:
        raise ValueError("lse is written only with return_lse=True")
    if return_lse and lse is None and isinstance(q, torch.Tensor) and q.dim() == 3:
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    if torch.compiler.is_compiling():  # the op's fake implementation runs the checks
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        torch.ops.aotc.decode(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format,
                              sm_scale, window, sinks, num_splits, out, lse, scale_layout, alibi_slopes, alibi_sqrt,
                              softcap)
        return (out, lse) if return_lse else out
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if isinstance(q, torch.Tensor) else None
    try:
        key = plan_key(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale, window,
                       sinks, num_splits, out, lse, scale_layout, alibi_slopes, alibi_sqrt, softcap)
        plan = _plans.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable extras: the checks say what is wrong
        key = plan = None
    if plan is None or validate:
        d = _check_decode(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale,
                          window, sinks, num_splits, out, lse, scale_layout, alibi_slopes, alibi_sqrt, softcap)
        if validate:
            _check_decode_values(d)
        if plan is None:
            plan = cached_plan(key, d, out)
    else:  # a plan hit: sizes and strides were checked when it was made; grad and pointers are this call's
        if torch.is_grad_enabled():
            guards.refuse_grad("decode", q=q, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale,
                               sinks=sinks, out=out, lse=lse, alibi_slopes=alibi_slopes)
        plan.apart(out, lse, q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, sinks, alibi_slopes)
    _launch(plan, q, k_cache, v_cache, k_scale, v_scale, table, req_idx, seq_lens, sinks, out, lse, alibi_slopes)
    return (out, lse) if return_lse else out
