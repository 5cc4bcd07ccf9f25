"""vLLM's `unified_attention` (vllm/v1/attention/ops/triton_unified_attention.py, the kernel of its
Triton attention backend) with vLLM 0.33.0's signature, on `aotc.loader.prefix_prefill`.

vLLM's conventions, as its kernel reads them:
  q [tokens, heads, D] (fp16/bf16, or fp8 with q_descale); k, v: the paged caches
    [num_blocks, block_size, kv_heads, D], already holding every token of each sequence (the new
    ones too); out [tokens, heads, D] written in place (fp8 e4m3 = out / output_scale when
    output_scale is given);
  cu_seqlens_q [num_seqs + 1] int32: request b's queries are rows cu_seqlens_q[b]:[b + 1], the last
    of its seqused_k[b] positions; block_table [num_seqs, max_blocks] int32;
  window_size (left, right): keys at distance <= left (left < 0: none); softcap > 0: scores
    softcap * tanh(s / softcap); alibi_slopes [heads] with use_alibi_sqrt; sinks [heads];
  kv_quant_mode (vLLM's KVQuantMode, an IntEnum): NONE, or FP8_PER_TENSOR with k_descale /
    v_descale tensors whose first element is the scale (vLLM's kernel loads element 0; its tests
    pass [num_seqs, kv_heads] filled with one value), q_descale likewise for an fp8 q; or
    INT8_PER_TOKEN_HEAD / FP8_PER_TOKEN_HEAD: int8 / float8_e4m3fn codes, value = code * scale with
    k_scale_cache / v_scale_cache [num_blocks, block_size, kv_heads] fp32, one scale a token and
    head, any strides (vLLM's Triton backend carves them from the cache itself: per (token, head)
    [K codes | K scale | V codes | V scale], so k and v arrive padded by one scale's width, and
    their first head_size channels are the codes; triton_attn.py, _ensure_scale_caches);
    or INT4_PER_TOKEN_HEAD (vllm/v1/attention/ops/int4_per_token_head.py; aotc's reference:
    kernels/common/int4_rht.py): uint8 caches of head_size // 2 nibble pairs (the first bytes of a
    row) of values rotated by a randomized Hadamard transform, the scale caches fp32 words holding
    each (token, head)'s zero point in their 4 low mantissa bits.
Rows: when every request has one query (max_seqlen_q == 1, one row a request) and the output is
q's dtype, the call is aotc's decode (flash-decoding, split over the sequence); else one
prefix_prefill over all rows.
"""
from __future__ import annotations

from enum import IntEnum

import torch

from ._convert import fp32_scale, guard_call, int32_indices


class KVQuantMode(IntEnum):
    """vLLM 0.33.0's KVQuantMode values (vllm/v1/kv_cache_interface.py) that unified_attention reads."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_FP8_NAMES = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}


def _first_scale(t, name: str, device):
    """vLLM's per-tensor scale: the first element, as a one-element float32 view (or copy)."""
    if t is None:
        raise ValueError(f"unified_attention: {name} is required (kv_quant_mode FP8_PER_TENSOR, or an fp8 q)")
    t = fp32_scale(t, f"unified_attention: {name}", device).reshape(-1)[:1]
    return t if t.dtype == torch.float32 else t.float()


def _f32(t):
    return t if t is None or not isinstance(t, torch.Tensor) or t.dtype == torch.float32 else t.float()


_PER_TOKEN_HEAD = {KVQuantMode.INT8_PER_TOKEN_HEAD: (torch.int8, "int8"),
                   KVQuantMode.FP8_PER_TOKEN_HEAD: (torch.float8_e4m3fn, "fp8_e4m3")}


def _unsupported(kv_quant_mode, qq_bias, rswa_window, rswa_prefix_lens, k) -> None:
    """NotImplementedError naming the first option aotc does not implement."""
    mode = int(kv_quant_mode)
    if mode not in (KVQuantMode.NONE, KVQuantMode.FP8_PER_TENSOR, KVQuantMode.INT4_PER_TOKEN_HEAD, *_PER_TOKEN_HEAD):
        raise NotImplementedError(f"unified_attention: kv_quant_mode={mode} is not implemented in aotc")
    if qq_bias is not None:
        raise NotImplementedError("unified_attention: qq_bias is not implemented in aotc")
    if rswa_window is not None and rswa_prefix_lens is not None:
        raise NotImplementedError("unified_attention: rswa_window / rswa_prefix_lens (R-SWA) are not implemented "
                                  "in aotc")
    if isinstance(k, torch.Tensor) and k.dtype in (torch.int8, torch.uint8) and mode in (KVQuantMode.NONE,
                                                                                        KVQuantMode.FP8_PER_TENSOR):
        raise NotImplementedError(f"unified_attention: a {k.dtype} cache with kv_quant_mode NONE is not "
                                  f"implemented in aotc")


def _check_scale_caches(mode_name, k, k_scale_cache, v_scale_cache) -> None:
    """ValueError unless both scale caches are tensors shaped [num_blocks, block_size, kv_heads] as k."""
    for n, t in (("k_scale_cache", k_scale_cache), ("v_scale_cache", v_scale_cache)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"unified_attention: kv_quant_mode {mode_name} needs {n} (a [num_blocks, block_size, "
                             f"kv_heads] float32 tensor), got {type(t).__name__}")
        if t.dim() != 3 or tuple(t.shape) != tuple(k.shape[:3]):
            raise ValueError(f"unified_attention: {n} must be [num_blocks, block_size, kv_heads] = "
                             f"{list(k.shape[:3])}, got {tuple(t.shape)}")


def _per_token_head(mode, q, k, v, k_scale_cache, v_scale_cache):
    """(k codes, v codes, k scales, v scales [.., 1], kv_format) for a per-token-head mode: the
    codes are the caches' first head_size channels (vLLM pads them by one inline scale)."""
    dtype, fmt = _PER_TOKEN_HEAD[mode]
    name = KVQuantMode(mode).name
    for n, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dtype != dtype:
            raise TypeError(f"unified_attention: kv_quant_mode {name} needs {dtype} caches, got {n} "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
        if t.dim() != 4 or t.shape[-1] < q.shape[-1]:
            raise ValueError(f"unified_attention: {n} must be [num_blocks, block_size, kv_heads, >= head_size "
                             f"{q.shape[-1]}], got {tuple(t.shape)}")
    _check_scale_caches(name, k, k_scale_cache, v_scale_cache)
    d = q.shape[-1]
    return k[..., :d], v[..., :d], k_scale_cache.unsqueeze(-1), v_scale_cache.unsqueeze(-1), fmt


def _int4_per_token_head(q, k, v, k_scale_cache, v_scale_cache):
    """(k codes, v codes, k scale words, v scale words [.., 1], "int4_rht") for INT4_PER_TOKEN_HEAD:
    uint8 (or int8) caches whose first head_size // 2 bytes a (token, head) are the nibbles, and
    [num_blocks, block_size, kv_heads] fp32 scale words (zero point in the low mantissa bits)."""
    d = q.shape[-1]
    for n, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.uint8, torch.int8):
            raise TypeError(f"unified_attention: kv_quant_mode INT4_PER_TOKEN_HEAD needs torch.uint8 caches (two "
                            f"nibbles a byte), got {n} {getattr(t, 'dtype', type(t).__name__)}")
        if t.dim() != 4 or t.shape[-1] < d // 2:
            raise ValueError(f"unified_attention: {n} must be [num_blocks, block_size, kv_heads, >= head_size // 2 = "
                             f"{d // 2}], got {tuple(t.shape)}")
    _check_scale_caches("INT4_PER_TOKEN_HEAD", k, k_scale_cache, v_scale_cache)
    return k[..., :d // 2], v[..., :d // 2], k_scale_cache.unsqueeze(-1), v_scale_cache.unsqueeze(-1), "int4_rht"


def _decode_rows(q, out, cu_seqlens_q, max_seqlen_q, seqused_k, k, output_scale, mode) -> bool:
    """Whether the call is decode rows only: one query a request (max_seqlen_q == 1 and as many rows
    as requests), q's dtype out, a page size and head size decode reads (a power of two; 64, 96,
    128, 256, and 64 or 128 with per-token-head scales)."""
    from aotc.kernels.decode import spec as S

    bs = k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else 0
    d = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() == 3 else 0
    dims = S.PER_TOKEN_HEAD_DIMS if mode in (*_PER_TOKEN_HEAD, KVQuantMode.INT4_PER_TOKEN_HEAD) else S.HEAD_DIMS
    return (isinstance(max_seqlen_q, int) and max_seqlen_q == 1 and output_scale is None and d in dims
            and isinstance(q, torch.Tensor) and isinstance(seqused_k, torch.Tensor)
            and isinstance(cu_seqlens_q, torch.Tensor) and q.dim() == 3
            and q.shape[0] == seqused_k.shape[0] == cu_seqlens_q.shape[0] - 1
            and isinstance(out, torch.Tensor) and out.dtype == q.dtype and bs > 0 and bs & (bs - 1) == 0)


def _bidirectional(causal, cu_seqlens_q, seqused_k, left, mm_prefix_range, alibi_slopes, mode):
    """causal=False, or a per-sequence causal tensor: the non-causal sequences' new tokens as one
    inclusive bidirectional range each, [num_seqs, 1, 2] int32 (prefix_prefill's mm_prefix_range;
    the causal mask already shows every query its context), built on the device (graph safe); a
    causal sequence gets an unused range (start > end). None for a causal call."""
    per_seq = isinstance(causal, torch.Tensor)
    if not per_seq and causal:
        return None
    name = "causal as a per-sequence tensor" if per_seq else "causal=False"
    if left >= 0:  # vLLM's non-causal window reaches both ways; prefix_prefill's ranges are not clamped so
        raise NotImplementedError(f"unified_attention: {name} with a sliding window is not implemented in aotc")
    if mm_prefix_range is not None or alibi_slopes is not None:
        raise NotImplementedError(f"unified_attention: {name} with mm_prefix_range or alibi_slopes is not "
                                  f"implemented in aotc")
    if mode != KVQuantMode.NONE and mode != KVQuantMode.FP8_PER_TENSOR:
        raise NotImplementedError(f"unified_attention: {name} with kv_quant_mode={KVQuantMode(mode).name} is not "
                                  f"implemented in aotc")
    if not isinstance(cu_seqlens_q, torch.Tensor) or not isinstance(seqused_k, torch.Tensor):
        raise TypeError("unified_attention: cu_seqlens_q and seqused_k must be tensors")
    n = seqused_k.shape[0]
    lens = seqused_k.to(torch.int32)
    ends = lens - 1
    starts = lens - (cu_seqlens_q[1:n + 1] - cu_seqlens_q[:n]).to(torch.int32)
    if per_seq:
        if causal.shape != (n,) or causal.device != seqused_k.device or causal.is_floating_point():
            raise ValueError(f"unified_attention: causal as a tensor must be [num_seqs] ({n}) bool or int on "
                             f"{seqused_k.device}, got {tuple(causal.shape)} {causal.dtype} on {causal.device}")
        starts = torch.where(causal != 0, ends + 1, starts)
    return torch.stack((starts, ends), dim=-1).view(n, 1, 2)


def unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale, causal,
                      window_size, block_table, softcap, q_descale, k_descale, v_descale, seq_threshold_3D=None,
                      num_par_softmax_segments=None, softmax_segm_output=None, softmax_segm_max=None,
                      softmax_segm_expsum=None, alibi_slopes=None, output_scale=None, qq_bias=None, sinks=None,
                      mm_prefix_range=None, rswa_prefix_lens=None, rswa_window=None, use_alibi_sqrt=False,
                      kv_quant_mode=KVQuantMode.NONE, k_scale_cache=None, v_scale_cache=None, chunk_lookback=-1,
                      use_td=False, mm_prefix_clamp_sliding_window=False, *, validate=None) -> None:
    """vLLM's `unified_attention` on one `aotc.loader.prefix_prefill` call (every row, decode rows
    too, keys and values read from the cache: prefix_prefill's k = v = None): writes out.

    Supported: causal and non-causal attention (causal=False, or per sequence as a tensor: the
    non-causal sequences' new tokens as one bidirectional range, prefix_prefill's mm_prefix_range;
    not with a window, mm_prefix_range, ALiBi or per-token-head caches) over varlen queries, window_size, chunk_lookback (chunked local
    attention), mm_prefix_range (bidirectional ranges, mm_prefix_clamp_sliding_window), softcap,
    sinks, alibi_slopes (with use_alibi_sqrt), output_scale (fp8 output), kv_quant_mode NONE,
    FP8_PER_TENSOR, INT8_PER_TOKEN_HEAD and FP8_PER_TOKEN_HEAD; INT4_PER_TOKEN_HEAD at head sizes
    64 and 128 (decode's and prefix_prefill's kv_format "int4_rht": q and the output rotated in
    decode's split kernel, around prefix_prefill's; no softcap/ALiBi, no output_scale). Decode rows only (see the module
    docstring): one aotc decode call (per-token-head modes: at head sizes 64 and 128).
    Prefill rows on INT8_PER_TOKEN_HEAD / FP8_PER_TOKEN_HEAD caches: prefix_prefill's kv_align 4
    binaries on vLLM's record at head sizes 40..128 (FP8 there only; INT8 elsewhere on its GENERIC
    ones), on sm90 at head sizes 80..128 (multiples of 16) its Gluon kernel for keys read from the
    cache (kernel_ws_rec.py; FP8_PER_TENSOR there too); with softcap or ALiBi they raise
    NotImplementedError.
    Converted: an fp8 q becomes q * q_descale in out's dtype (bfloat16 for an fp8 out): one copy
    of q; vLLM multiplies the scales into its fp8 scores instead. Ignored: max_seqlen_q,
    max_seqlen_k, seq_threshold_3D and the softmax segment buffers (vLLM's split-K workspace:
    aotc's grid depends on no length), use_td (an Intel load path), mm_prefix_clamp_sliding_window
    without mm_prefix_range. Calls with chunk_lookback or mm_prefix_range go to prefix_prefill,
    decode rows too. Cost (estimated): in a mixed batch a one-token request takes a 128-row
    query tile, as in chunked_prefill_paged_decode. Not implemented (NotImplementedError, see
    _unsupported): kv_quant_mode INT4_PER_TOKEN_HEAD with softcap/ALiBi or output_scale,
    causal=False or per-sequence with a window, mm_prefix_range, ALiBi or per-token-head caches,
    qq_bias, rswa_*; per-token-head int8/int4 caches with
    chunk_lookback or mm_prefix_range (prefix_prefill's). Other limits are
    prefix_prefill's (head size a multiple of 8 up to 256), raised as its ValueError/TypeError.
    validate (keyword only, not vLLM's): the value checks of lengths, offsets and page ids (and of
    int64 indices fitting int32): one device sync and host work a call (BENCHMARKS.md, "Prefix
    prefill through vLLM's `unified_attention`": NONE, aotc's default checks). None (the
    default): on in eager calls, off under CUDA-graph capture and torch.compile, as the loader's
    ops; an engine's hot loop whose metadata its scheduler built passes False (vLLM's kernel reads
    them unchecked).
    """
    from aotc.loader.ops.decode import decode
    from aotc.loader.ops.prefix_prefill import prefix_prefill

    guard_call("unified_attention", {"out": out}, {
        "q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "seqused_k": seqused_k, "block_table": block_table,
        "q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale, "alibi_slopes": alibi_slopes,
        "output_scale": output_scale, "sinks": sinks, "k_scale_cache": k_scale_cache, "v_scale_cache": v_scale_cache})
    left = int(window_size[0])  # the right side matters only without causal masking
    _unsupported(kv_quant_mode, qq_bias, rswa_window, rswa_prefix_lens, k)
    # chunked local attention needs a window (vLLM drops chunk_lookback without one)
    lookback = int(chunk_lookback) if chunk_lookback is not None and left >= 0 and chunk_lookback > -1 else -1
    if mm_prefix_range is not None and (not isinstance(mm_prefix_range, torch.Tensor) or mm_prefix_range.dim() != 3):
        raise ValueError(f"unified_attention: mm_prefix_range must be [num_seqs, ranges, 2], got "
                         f"{tuple(getattr(mm_prefix_range, 'shape', ())) or type(mm_prefix_range).__name__}")
    fmt = "auto"
    k_scale = v_scale = None
    mode = int(kv_quant_mode)
    ranges = _bidirectional(causal, cu_seqlens_q, seqused_k, left, mm_prefix_range, alibi_slopes, mode)
    if ranges is not None:
        mm_prefix_range = ranges
    if mode == KVQuantMode.INT4_PER_TOKEN_HEAD:
        if output_scale is not None:
            raise NotImplementedError("unified_attention: kv_quant_mode=INT4_PER_TOKEN_HEAD with output_scale (fp8 "
                                      "output) is not implemented in aotc")
        if softcap or alibi_slopes is not None:
            raise NotImplementedError("unified_attention: kv_quant_mode=INT4_PER_TOKEN_HEAD with softcap or "
                                      "alibi_slopes is not implemented in aotc")
        k, v, k_scale, v_scale, fmt = _int4_per_token_head(q, k, v, k_scale_cache, v_scale_cache)
    elif mode in _PER_TOKEN_HEAD:
        k, v, k_scale, v_scale, fmt = _per_token_head(mode, q, k, v, k_scale_cache, v_scale_cache)
    elif k_scale_cache is not None or v_scale_cache is not None:
        raise ValueError("unified_attention: k_scale_cache / v_scale_cache are read with kv_quant_mode "
                         "INT8_PER_TOKEN_HEAD, FP8_PER_TOKEN_HEAD or INT4_PER_TOKEN_HEAD only")
    if mode == KVQuantMode.FP8_PER_TENSOR:
        if k.dtype not in _FP8:
            raise TypeError(f"unified_attention: kv_quant_mode FP8_PER_TENSOR needs float8 caches, got {k.dtype}")
        fmt = _FP8_NAMES[k.dtype]
        k_scale, v_scale = _first_scale(k_descale, "k_descale", q.device), _first_scale(v_descale, "v_descale",
                                                                                           q.device)
    elif isinstance(k, torch.Tensor) and k.dtype in _FP8 and mode not in _PER_TOKEN_HEAD \
            and mode != KVQuantMode.INT4_PER_TOKEN_HEAD:
        raise ValueError(f"unified_attention: a {k.dtype} cache needs kv_quant_mode FP8_PER_TENSOR")
    if isinstance(q, torch.Tensor) and q.dtype in _FP8:
        dtype = out.dtype if out.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        q_scale = _first_scale(q_descale, "q_descale", q.device) if q_descale is not None else 1.0
        q = (q.float() * q_scale).to(dtype)
    softcap = float(softcap or 0.0)
    window = left + 1 if left >= 0 else None
    masks = lookback >= 0 or mm_prefix_range is not None  # prefix_prefill's alone
    if not masks and _decode_rows(q, out, cu_seqlens_q, max_seqlen_q, seqused_k, k, output_scale, mode):
        decode(q, k, v, int32_indices(block_table, "block_table", validate),
               int32_indices(seqused_k, "seqused_k", validate),
               k_scale=k_scale, v_scale=v_scale, kv_format=fmt, sm_scale=float(softmax_scale), window=window,
               sinks=_f32(sinks), out=out, alibi_slopes=_f32(alibi_slopes),
               alibi_sqrt=bool(use_alibi_sqrt) and alibi_slopes is not None, softcap=softcap, validate=validate)
        return
    if mode in _PER_TOKEN_HEAD and (softcap or alibi_slopes is not None):
        raise NotImplementedError(f"unified_attention: kv_quant_mode={KVQuantMode(mode).name} with softcap or "
                                  f"alibi_slopes and prefill rows is not implemented in aotc (decode rows are)")
    prefix_prefill(q, None, None, k, v, int32_indices(block_table, "block_table", validate),
                   int32_indices(cu_seqlens_q, "cu_seqlens_q", validate), int32_indices(seqused_k, "seqused_k", validate),
                   kv_layout="nhd", kv_format=fmt, k_scale=k_scale, v_scale=v_scale, sm_scale=float(softmax_scale),
                   window=window, sinks=_f32(sinks),
                   out_scale=_f32(fp32_scale(output_scale, "output_scale", q.device)), out=out,
                   alibi_slopes=_f32(alibi_slopes), alibi_sqrt=bool(use_alibi_sqrt) and alibi_slopes is not None,
                   softcap=softcap, chunk_lookback=lookback,
                   mm_prefix_range=None if mm_prefix_range is None else int32_indices(mm_prefix_range, "mm_prefix_range",
                                                                                       validate),
                   mm_clamp=bool(mm_prefix_clamp_sliding_window) and mm_prefix_range is not None, validate=validate)
