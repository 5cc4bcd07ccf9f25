"""Paged flash-decoding (`decode`): rules (`check_decode`, with the cache checks of kv_cache.py),
plan (`_make_plan`: a split_merge.SplitMerge, cached by the inputs' metadata), launch
(`SplitMerge.launch`). The cache writer that feeds it is `store_kv.py`.

`decode` is declared once as `DECODE` (library.Op): the `torch.ops.aotc.decode` op (mutating `out`
and `lse`), its fake implementation and its plan key follow from that declaration, so
`torch.compile(fullgraph=True)` traces through it. The public function runs the same checks and
code; under compilation it calls the op.
"""
from __future__ import annotations

import math

import torch

from aotc.kernels.decode import spec as S

from ..sm_count import cuda_sm_count
from . import guards, library, rules
from .kv_cache import FLOAT_NAMES, FP8_DTYPES, check_cache, check_page_values, check_rows
from .split_merge import Eager, SplitMerge, split_programs_per_sm

OP = "decode"


class _Decode:
    """A checked decode call."""

    __slots__ = ("q", "kv", "table", "seq_lens", "req_idx", "sinks", "sm_scale", "window", "splits", "out", "lse",
                 "alibi", "alibi_mode", "softcap")

    def __init__(self, q, kv, table, seq_lens, req_idx, sinks, sm_scale, window, splits, out, lse=None, alibi=None,
                 alibi_mode=0, softcap=0.0):
        self.q, self.kv, self.table, self.seq_lens, self.req_idx = q, kv, table, seq_lens, req_idx
        self.sinks, self.sm_scale, self.window, self.splits, self.out, self.lse = \
            sinks, sm_scale, window, splits, out, lse
        self.alibi, self.alibi_mode, self.softcap = alibi, alibi_mode, softcap


def _check_score_mod(alibi_slopes, alibi_sqrt, softcap, q_heads, kv, head_dim, dev) -> tuple[int, float]:
    """(alibi_mode, softcap) for the split kernel: 0 off, 1 linear, 2 sqrt; NotImplementedError for
    caches without a "mod" binary (int8/int4 per group or channel, int4 per token)."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not 0 <= softcap < math.inf:
        raise ValueError(f"softcap must be a finite float >= 0 (0: off), got {softcap!r}")
    if alibi_slopes is not None:
        rules.tensor(OP, "alibi_slopes", alibi_slopes, (torch.float32,), dim=1, device=dev)
        if alibi_slopes.shape[0] != q_heads or not alibi_slopes.is_contiguous():
            raise ValueError(f"alibi_slopes: expected a contiguous [q_heads={q_heads}] tensor, got "
                             f"{tuple(alibi_slopes.shape)}")
    elif alibi_sqrt:
        raise ValueError("alibi_sqrt=True needs alibi_slopes")
    mode = 0 if alibi_slopes is None else 2 if alibi_sqrt else 1
    if (mode or softcap) and kv.fmt in S.ZP_FORMATS:
        raise NotImplementedError(f"softcap / alibi_slopes with an {kv.fmt} cache are not implemented")
    if (mode or softcap) and kv.fmt in S.INT_FORMATS and not (kv.fmt == "int8" and kv.group == head_dim
                                                                 and not kv.channel):
        raise NotImplementedError(f"softcap / alibi_slopes with an {kv.fmt} cache is implemented for int8 with one "
                                  f"scale a token only")
    return mode, float(softcap)


def check_decode(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale,
                 window, sinks, num_splits, out, lse=None, scale_layout="group", alibi_slopes=None, alibi_sqrt=False,
                 softcap=0.0) -> _Decode:
    """Every check that needs no tensor values (safe under tracing and graph capture)."""
    guards.refuse_grad(OP, q=q, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale,
                       sinks=sinks, out=out, lse=lse, alibi_slopes=alibi_slopes)
    rules.tensor(OP, "q", q, (torch.float16, torch.bfloat16), dim=3)
    dev = q.device
    batch, q_heads, head_dim = q.shape
    if head_dim not in S.HEAD_DIMS:
        raise ValueError(f"q: head_dim {head_dim} is not supported; expected one of {S.HEAD_DIMS}")
    if batch > S.MAX_BATCH:
        raise ValueError(f"q: batch {batch} is over {S.MAX_BATCH} (the split grid's second dimension)")
    rules.unit_last(OP, "q", q)
    kv = check_cache(OP, k_cache, v_cache, k_scale, v_scale, kv_format, head_dim, dev, scale_layout)
    if kv.fmt in ("fp16", "bf16") and kv.fmt != FLOAT_NAMES[q.dtype]:
        raise TypeError(f"k_cache: an {kv.fmt} cache needs an {kv.fmt} query, got q of dtype {q.dtype}")
    kv_heads = kv.k.shape[2]
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
    check_rows(OP, table, seq_lens, req_idx, sinks, batch, q_heads, dev)
    alibi_mode, softcap = _check_score_mod(alibi_slopes, alibi_sqrt, softcap, q_heads, kv, head_dim, dev)
    if out is not None:
        rules.tensor(OP, "out", out, (q.dtype,), dim=3, device=dev)
        if out.shape != q.shape:
            raise ValueError(f"out: shape {tuple(out.shape)}, expected q's {tuple(q.shape)}")
        rules.unit_last(OP, "out", out)
    if lse is not None:
        rules.tensor(OP, "lse", lse, (torch.float32,), dim=2, device=dev)
        if lse.shape != q.shape[:2]:
            raise ValueError(f"lse: shape {tuple(lse.shape)}, expected [batch, q_heads] = {tuple(q.shape[:2])}")
        rules.unit_last(OP, "lse", lse)
    sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else guards.real("decode", "sm_scale", sm_scale)
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"window must be None or an int >= 1, got {window!r}")
    if num_splits is not None:
        guards.integer("decode", "num_splits", num_splits, 1, S.MAX_SPLITS)
    page_size, max_pages = kv.k.shape[1], table.shape[1]
    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"k_cache: page size {page_size} (dim 1 of {tuple(k_cache.shape)}) is not a power of two; "
                         f"decode reads pages of 1, 2, 4, ... 2^k tokens")
    if page_size * max_pages > rules.I32_MAX:
        raise ValueError(f"table: {max_pages} pages of {page_size} tokens exceed int32 token indices")
    for name, t in (("q", q), ("k_cache", kv.k), ("v_cache", kv.v), ("table", table), ("out", out),
                    ("k_scale", kv.ks), ("v_scale", kv.vs), ("lse", lse)):
        if t is not None and max(t.stride(), default=0) > rules.I32_MAX:
            raise ValueError(f"{name}: strides {t.stride()} exceed int32")
    guards.check_outputs("decode", {"out": out, "lse": lse}, _inputs(q, k_cache, v_cache, table, seq_lens, req_idx,
                                                                     k_scale, v_scale, sinks, alibi_slopes))
    return _Decode(q, kv, table, seq_lens, req_idx, sinks, float(sm_scale), window or 0, num_splits, out, lse,
                   alibi_slopes, alibi_mode, softcap)


def _inputs(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, sinks, alibi_slopes=None) -> dict:
    """What decode reads, by name, in the order a plan's `apart` takes it after out and lse."""
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "table": table, "seq_lens": seq_lens, "req_idx": req_idx,
            "k_scale": k_scale, "v_scale": v_scale, "sinks": sinks, "alibi_slopes": alibi_slopes}


def _sm_count(device) -> int:
    if device.type != "cuda":
        return 2  # interpreter runs: few programs, since each runs serially in Python
    return cuda_sm_count(device)


def _make_plan(d: _Decode, out: torch.Tensor) -> SplitMerge:
    q, kv, table = d.q, d.kv, d.table
    batch, q_heads, head_dim = q.shape
    kv_heads = kv.k.shape[2]
    group = q_heads // kv_heads
    if kv.channel:
        ks_strides, vs_strides = (0, 0, kv.ks_head_stride), (0, 0, kv.vs_head_stride)
    elif kv.fmt in S.INT_FORMATS or kv.token:
        ks_strides, vs_strides = kv.ks.stride()[:3], kv.vs.stride()[:3]
    elif kv.fmt in FP8_DTYPES:
        ks_strides, vs_strides = (0, 0, kv.ks_head_stride), (0, 0, kv.vs_head_stride)
    else:
        ks_strides = vs_strides = (0, 0, 0)
    rot, sm_scale = None, d.sm_scale
    if kv.fmt == "int4_rht":  # the split kernel rotates q and its partials (decode_rht.signs)
        from .decode_rht import signs

        rot, gain = signs(head_dim, q.device)
        sm_scale = d.sm_scale / gain
    split_ints = [sm_scale, d.window, int(d.req_idx is not None), kv.k.shape[1].bit_length() - 1, table.shape[1],
                  table.stride(0), q_heads, group, kv.group.bit_length() - 1, q.stride(0), q.stride(1), *kv.k.stride()[:3],
                  *kv.v.stride()[:3], *ks_strides, *vs_strides, d.softcap, d.alibi_mode]
    score = "mod" if d.softcap or d.alibi_mode else "plain"
    if kv.channel:
        split_axes = S.split_axes(FLOAT_NAMES[q.dtype], kv.fmt, kv.scale_name, head_dim, channel=True)
    else:
        per_token = (kv.fmt in S.INT_FORMATS and kv.group == head_dim) or kv.token
        split_axes = S.split_axes(FLOAT_NAMES[q.dtype], kv.fmt, kv.scale_name, head_dim, per_token,
                                  0 if per_token else kv.group, score=score,
                                  kv_align=_kv_align(kv, per_token, score, head_dim))
    tiles = S.split_tiles(kv.fmt, head_dim, split_axes["scales"])
    split_axes["tile"] = S.choose_tile(tiles, batch * kv_heads * S.head_blocks(group), _sm_count(q.device))
    fp8 = kv.fmt in FP8_DTYPES
    byte_view = fp8 or kv.fmt in ("int4",) + S.ZP_FORMATS
    splits = d.splits
    if not splits:
        per_sm = split_programs_per_sm(S.SPLIT, split_axes, fp8, byte_view, q, kv.k, kv.v, kv.ks, kv.vs, table,
                                       d.req_idx, d.seq_lens, split_ints)
        splits = S.num_splits(batch, kv_heads, group, _sm_count(q.device), per_sm)
    n_o, n_lse = S.workspace_elements(batch, q_heads, splits, head_dim)
    lse = d.lse
    merge_ints = [int(d.sinks is not None), int(lse is not None), q_heads, splits, out.stride(0), out.stride(1),
                  lse.stride(0) if lse is not None else 0]
    merge_axes = S.merge_axes(FLOAT_NAMES[out.dtype], head_dim, splits)
    return SplitMerge((S.SPLIT, split_axes, S.split_grid(batch, kv_heads, group, splits), split_ints),
                      (S.MERGE, merge_axes, S.merge_grid(batch, q_heads, merge_axes),
                       merge_ints), n_o, n_lse, q.device, kv.fmt, fp8, byte_view,
                      {4: 3, 8: 7}.get(split_axes.get("kv_align"), int(kv.fmt in S.INT_FORMATS + S.ZP_FORMATS)),
                      rot)


def _kv_align(kv, per_token: bool, score: str, head_dim: int) -> int:
    """8 for vLLM's per-token-head record exactly (int8 or fp8 e4m3, fp32 scales inline after each
    head's codes: _vllm_record), 4 for other per-token caches whose rows start 4-byte aligned only,
    and for their "mod" calls; else 16."""
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
    return 8 if _vllm_record(kv.k, kv.v, strides) else 4


def _vllm_record(k, v, strides) -> bool:
    """Whether k/v look like vLLM's per-token-head record [K codes | K scale | V codes | V scale]:
    K 8-byte aligned, V 4 bytes past an 8-byte boundary, strides multiples of 8 and V's strides
    K's (views of one buffer). The kv_align 8 binaries read K 8 bytes at a time and V 4 at a time,
    both at K's row offsets; later calls of the plan are held to the same address residues
    (SplitMerge.check_halfword), and to the same strides by the plan's key."""
    try:
        kp, vp = k.data_ptr(), v.data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (fake, meta): the 4-byte binaries
        return False
    same = k.shape == v.shape and all(a == b for n, a, b in zip(k.shape, k.stride(), v.stride()) if n > 1)
    return same and not any(st % 8 for st in strides) and kp % 8 == 0 and vp % 8 == 4 and v.device.type != "meta"


def _run_decode(d: _Decode) -> None:
    _make_plan(d, d.out).launch(d.q, d.kv.k, d.kv.v, d.kv.ks, d.kv.vs, d.table, d.req_idx, d.seq_lens, d.sinks, d.out,
                                d.lse, d.alibi)


DECODE = library.Op(
    "decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor table, Tensor seq_lens, Tensor? req_idx, "
    "Tensor? k_scale, Tensor? v_scale, str kv_format, float? sm_scale, SymInt? window, Tensor? sinks, "
    "SymInt? num_splits, Tensor(a!) out, Tensor(b!)? lse=None, str scale_layout=\"group\", "
    "Tensor? alibi_slopes=None, bool alibi_sqrt=False, float softcap=0.0) -> ()",
    check=check_decode, run=_run_decode)
# Plans by the inputs' metadata (DECODE.key); `DecodePlan` (decode_plan.py) builds on the same plans.
_plans = rules.PlanCache()
# Unvalidated eager calls' steady states (split_merge.Eager), tried before the plan key is built.
_recent = rules.Recent()
_compiling = torch.compiler.is_compiling


def cached_plan(key, d: _Decode, out) -> SplitMerge:
    """The plan of `key` (made from the checked call `d` when it is new)."""
    plan = _plans.get(key) if key is not None else None
    if plan is None:
        plan = _make_plan(d, out)
        plan.apart = guards.Apart("decode", {"out": out, "lse": d.lse}, _inputs(
            d.q, d.kv.k, d.kv.v, d.table, d.seq_lens, d.req_idx, d.kv.ks, d.kv.vs, d.sinks, d.alibi))
        _plans.put(key, plan)
    return plan


def _split_heads(q, k_cache, v_cache) -> bool:
    """Calls the MLA family serves (loader/ops/mla.py): key and value head sizes that differ, or an
    equal head size decode's kernel lacks (a multiple of 16 up to 512) over an fp16/bf16/fp8 cache."""
    try:
        d_k, d_v = k_cache.shape[-1], v_cache.shape[-1]
    except (AttributeError, IndexError, TypeError):
        return False
    if d_k == d_v and d_k in S.HEAD_DIMS:  # decode's own kernel: the common case, decided first
        return False
    if not all(isinstance(t, torch.Tensor) for t in (q, k_cache, v_cache)) or k_cache.dim() not in (3, 4):
        return False
    if d_k != d_v:
        return True
    return (d_k not in S.HEAD_DIMS and q.dim() == 3 and q.shape[-1] == d_k
            and k_cache.dtype in (torch.float16, torch.bfloat16, *FP8_DTYPES.values()))


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
      kv_format  "auto" (from dtype and last dim), "fp16", "bf16", "int8", "int4", "fp8_e4m3", "fp8_e5m2",
               "int4_rht" or "int4_zp" (never inferred).
               "int4_rht": vLLM 0.33's INT4_PER_TOKEN_HEAD cache (kernels/common/int4_rht.py) at D 64
               or 128: Dc = D // 2 uint8/int8 (unsigned nibbles, channel 2i low), k_scale/v_scale the
               cache's shape with last dim 1, fp32 scale words (zero point in the 4 low mantissa
               bits; vLLM's k_scale_cache[..., None]), any strides; the stored values are rotated
               and the split kernel rotates q and its partial outputs (decode_rht.signs).
               "int4_zp": the same codes read without the rotation (the kernel's format).
      sm_scale float, default 1/sqrt(D). window int: attend to the last `window` tokens only.
      sinks    [H] fp32 logits joined to each head's softmax denominator (no value).
      softcap  > 0: natural-log scores s become softcap * tanh(s / softcap); then alibi_slopes [H]
               fp32 (contiguous) add slope * (key position - (seq_len - 1)), or with alibi_sqrt
               -slope * sqrt(seq_len - 1 - key position) (vLLM's two ALiBi forms). fp16/bf16/fp8
               caches and int8 with one scale a token; others raise NotImplementedError.
      out      [B, H, D] in q's dtype, written and returned; allocated when None.
      num_splits  sequence splits per request (default from batch, heads, the SM count and how many
               programs of the kernel's binary fit an SM, <= 64; never from lengths); explicit: 1 to
               512 (the workspace grows with it: batch x H x splits x (D + 1) fp32).
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
    matched = False
    if not validate and not _compiling():
        for e in _recent.entries:  # one C call matches every argument; pointers read once
            if e.match(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale, window,
                       sinks, num_splits, out, lse, scale_layout, alibi_slopes, alibi_sqrt, softcap, return_lse):
                if e.run(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, sinks, out, lse,
                         alibi_slopes):
                    return (out, lse) if return_lse else out
                matched = True  # the full path decides this call (and names any error)
                break
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
    out_given, lse_given = out, lse
    if return_lse and lse is None and isinstance(q, torch.Tensor) and q.dim() == 3:
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    if torch.compiler.is_compiling():  # the op's fake implementation runs the checks
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        DECODE(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format,
               sm_scale, window, sinks, num_splits, out, lse, scale_layout, alibi_slopes, alibi_sqrt, softcap)
        return (out, lse) if return_lse else out
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if isinstance(q, torch.Tensor) else None
    try:
        key = DECODE.key(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale, window,
                         sinks, num_splits, out, lse, scale_layout, alibi_slopes, alibi_sqrt, softcap)
        plan = _plans.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable extras: the checks say what is wrong
        key = plan = None
    if plan is None or validate:
        d = check_decode(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale,
                         window, sinks, num_splits, out, lse, scale_layout, alibi_slopes, alibi_sqrt, softcap)
        if validate:
            check_page_values(d)
        if plan is None:
            plan = cached_plan(key, d, out)
    else:  # a plan hit: sizes and strides were checked when it was made; grad and pointers are this call's
        if torch.is_grad_enabled():
            guards.refuse_grad(OP, q=q, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale,
                               sinks=sinks, out=out, lse=lse, alibi_slopes=alibi_slopes)
        plan.apart(out, lse, q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, sinks, alibi_slopes)
    plan.launch(q, k_cache, v_cache, k_scale, v_scale, table, req_idx, seq_lens, sinks, out, lse, alibi_slopes)
    if not (validate or matched) and lse_given is lse and out_given is out:  # the next such call: the steady state
        e = Eager.make(plan, (q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, kv_format, sm_scale,
                              window, sinks, num_splits, out, lse, scale_layout, alibi_slopes, alibi_sqrt, softcap,
                              return_lse),
                       (q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, sinks, out, lse, alibi_slopes),
                       (k_scale, v_scale), {"out": out, "lse": lse},
                       _inputs(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, sinks, alibi_slopes))
        if e is not None:
            _recent.add(e)
    return (out, lse) if return_lse else out
