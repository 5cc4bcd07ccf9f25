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
    pass [num_seqs, kv_heads] filled with one value), q_descale likewise for an fp8 q.
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


def _unsupported(kv_quant_mode, causal, qq_bias, mm_prefix_range, rswa_window, rswa_prefix_lens, chunk_lookback,
                 window_left, k, k_scale_cache, v_scale_cache) -> None:
    """NotImplementedError naming the first option aotc does not implement."""
    mode = int(kv_quant_mode)
    if mode in (KVQuantMode.INT8_PER_TOKEN_HEAD, KVQuantMode.FP8_PER_TOKEN_HEAD, KVQuantMode.INT4_PER_TOKEN_HEAD):
        raise NotImplementedError(f"unified_attention: kv_quant_mode={KVQuantMode(mode).name} (k_scale_cache / "
                                  f"v_scale_cache per token and head) is not implemented in aotc")
    if mode not in (KVQuantMode.NONE, KVQuantMode.FP8_PER_TENSOR):
        raise NotImplementedError(f"unified_attention: kv_quant_mode={mode} is not implemented in aotc")
    if k_scale_cache is not None or v_scale_cache is not None:
        raise NotImplementedError("unified_attention: k_scale_cache / v_scale_cache (per-token-head scales) are "
                                  "not implemented in aotc")
    if isinstance(causal, torch.Tensor):
        raise NotImplementedError("unified_attention: causal as a per-sequence tensor is not implemented in aotc")
    if not causal:
        raise NotImplementedError("unified_attention: causal=False is not implemented in aotc")
    if qq_bias is not None:
        raise NotImplementedError("unified_attention: qq_bias is not implemented in aotc")
    if mm_prefix_range is not None:
        raise NotImplementedError("unified_attention: mm_prefix_range (bidirectional multimodal ranges) is not "
                                  "implemented in aotc")
    if rswa_window is not None and rswa_prefix_lens is not None:
        raise NotImplementedError("unified_attention: rswa_window / rswa_prefix_lens (R-SWA) are not implemented "
                                  "in aotc")
    if chunk_lookback is not None and chunk_lookback > -1 and window_left >= 0:
        raise NotImplementedError("unified_attention: chunk_lookback (chunked local attention) is not implemented "
                                  "in aotc")
    if isinstance(k, torch.Tensor) and k.dtype in (torch.int8, torch.uint8) and mode == KVQuantMode.NONE:
        raise NotImplementedError(f"unified_attention: a {k.dtype} cache with kv_quant_mode NONE is not "
                                  f"implemented in aotc")


def unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale, causal,
                      window_size, block_table, softcap, q_descale, k_descale, v_descale, seq_threshold_3D=None,
                      num_par_softmax_segments=None, softmax_segm_output=None, softmax_segm_max=None,
                      softmax_segm_expsum=None, alibi_slopes=None, output_scale=None, qq_bias=None, sinks=None,
                      mm_prefix_range=None, rswa_prefix_lens=None, rswa_window=None, use_alibi_sqrt=False,
                      kv_quant_mode=KVQuantMode.NONE, k_scale_cache=None, v_scale_cache=None, chunk_lookback=-1,
                      use_td=False, mm_prefix_clamp_sliding_window=False) -> None:
    """vLLM's `unified_attention` on one `aotc.loader.prefix_prefill` call (every row, decode rows
    too, keys and values read from the cache: prefix_prefill's k = v = None): writes out.

    Supported: causal attention over varlen queries, window_size, softcap, sinks, alibi_slopes
    (with use_alibi_sqrt), output_scale (fp8 output), kv_quant_mode NONE and FP8_PER_TENSOR.
    Converted: an fp8 q becomes q * q_descale in out's dtype (bfloat16 for an fp8 out): one copy
    of q; vLLM multiplies the scales into its fp8 scores instead. Ignored: max_seqlen_q,
    max_seqlen_k, seq_threshold_3D and the softmax segment buffers (vLLM's split-K workspace:
    aotc's grid depends on no length), use_td (an Intel load path), mm_prefix_clamp_sliding_window
    without mm_prefix_range. Cost (estimated): a one-token request takes a 128-row query tile, as
    in chunked_prefill_paged_decode. Not implemented (NotImplementedError, see _unsupported):
    kv_quant_mode INT8/FP8/INT4_PER_TOKEN_HEAD and k_scale_cache / v_scale_cache, causal=False or
    per-sequence, qq_bias, mm_prefix_range, rswa_*, chunk_lookback. Other limits are
    prefix_prefill's (head size a multiple of 8 up to 256), raised as its ValueError/TypeError.
    """
    from aotc.loader.ops.prefix_prefill import prefix_prefill

    guard_call("unified_attention", {"out": out}, {
        "q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "seqused_k": seqused_k, "block_table": block_table,
        "q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale, "alibi_slopes": alibi_slopes,
        "output_scale": output_scale, "sinks": sinks})
    left = int(window_size[0])  # the right side matters only without causal masking
    _unsupported(kv_quant_mode, causal, qq_bias, mm_prefix_range, rswa_window, rswa_prefix_lens, chunk_lookback,
                 left, k, k_scale_cache, v_scale_cache)
    fmt = "auto"
    k_scale = v_scale = None
    if int(kv_quant_mode) == KVQuantMode.FP8_PER_TENSOR:
        if k.dtype not in _FP8:
            raise TypeError(f"unified_attention: kv_quant_mode FP8_PER_TENSOR needs float8 caches, got {k.dtype}")
        fmt = _FP8_NAMES[k.dtype]
        k_scale, v_scale = _first_scale(k_descale, "k_descale", q.device), _first_scale(v_descale, "v_descale",
                                                                                           q.device)
    elif isinstance(k, torch.Tensor) and k.dtype in _FP8:
        raise ValueError(f"unified_attention: a {k.dtype} cache needs kv_quant_mode FP8_PER_TENSOR")
    if isinstance(q, torch.Tensor) and q.dtype in _FP8:
        dtype = out.dtype if out.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        q_scale = _first_scale(q_descale, "q_descale", q.device) if q_descale is not None else 1.0
        q = (q.float() * q_scale).to(dtype)
    softcap = float(softcap or 0.0)
    prefix_prefill(q, None, None, k, v, int32_indices(block_table, "block_table"),
                   int32_indices(cu_seqlens_q, "cu_seqlens_q"), int32_indices(seqused_k, "seqused_k"),
                   kv_layout="nhd", kv_format=fmt, k_scale=k_scale, v_scale=v_scale, sm_scale=float(softmax_scale),
                   window=left + 1 if left >= 0 else None, sinks=_f32(sinks),
                   out_scale=_f32(fp32_scale(output_scale, "output_scale", q.device)), out=out,
                   alibi_slopes=_f32(alibi_slopes), alibi_sqrt=bool(use_alibi_sqrt) and alibi_slopes is not None,
                   softcap=softcap)
