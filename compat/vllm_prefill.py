"""vLLM's `context_attention_fwd` (vllm/attention/ops/prefix_prefill.py) on aotc's prefix_prefill.

For the lead to merge into compat/vllm.py. vLLM's conventions, as its
tests/kernels/attention/test_prefix_prefill.py and its Triton op use them:
  q, k, v `[tokens, heads, D]` (the new tokens), o `[tokens, heads, D]` written in place (float8_e4m3fn
    when fp8_out_scale is given, else q's dtype);
  k_cache `[num_blocks, kv_heads, D // x, block_size, x]` (x read from the shape: vLLM packs 8, also
    for one-byte fp8 caches stored as uint8), v_cache `[num_blocks, kv_heads, D, block_size]`;
  b_loc `[batch, max_blocks]` block table; b_start_loc `[batch + 1]` offsets of each request's new
    tokens; b_seq_len `[batch]` context + new tokens (int32, or int64 converted here);
  kv_cache_dtype "auto" (the cache has q's dtype) or "fp8" / "fp8_e4m3" / "fp8_e5m2" (float8 or its
    uint8 bytes), with k_scale / v_scale one-element float32 tensors: value = fp8 * scale;
  sliding_window: keys at distance < window (None or <= 0: none); sm_scale default 1/sqrt(D);
  skip_decode: requests with one new token are left unwritten; fp8_out_scale: o = clamp(out / scale)
    in e4m3 (vLLM multiplies by its inverse); sinks `[heads]` logits joined to the softmax normalizer.
  max_seq_len and max_input_len are accepted and unused: the grid never depends on lengths.
Converted here only what must be: int64 index tensors to int32, scales to float32 when they are not.
alibi_slopes and float32 inputs raise NotImplementedError (aotc computes neither).
"""
from __future__ import annotations

import torch

from aotc.loader.ops.prefix_prefill import prefix_prefill

_FORMATS = {"auto": "auto", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def _i32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 else t.to(torch.int32)


def _f32(t, device):
    if t is None:
        return None
    t = torch.tensor([float(t)], device=device) if not isinstance(t, torch.Tensor) else t
    return t if t.dtype == torch.float32 else t.float()


def context_attention_fwd(q, k, v, o, kv_cache_dtype, k_cache, v_cache, b_loc, b_start_loc, b_seq_len, max_seq_len,
                          max_input_len, k_scale, v_scale, alibi_slopes=None, sliding_window=None, sm_scale=None,
                          skip_decode=False, fp8_out_scale=None, sinks=None) -> None:
    """vLLM's signature and tensor conventions (see the module docstring); writes o, returns None."""
    if alibi_slopes is not None:
        raise NotImplementedError("context_attention_fwd: alibi_slopes is not supported by aotc's prefix_prefill")
    if isinstance(q, torch.Tensor) and q.dtype == torch.float32:
        raise NotImplementedError("context_attention_fwd: float32 q/k/v are not supported (fp16 or bf16)")
    if kv_cache_dtype not in _FORMATS:
        raise ValueError(f"context_attention_fwd: kv_cache_dtype must be one of {tuple(_FORMATS)}, got "
                         f"{kv_cache_dtype!r}")
    fmt = _FORMATS[kv_cache_dtype]
    if fmt == "auto" and isinstance(k_cache, torch.Tensor) and k_cache.dtype == torch.uint8:
        raise ValueError("context_attention_fwd: kv_cache_dtype='auto' with a uint8 cache; pass the fp8 format")
    fp8 = fmt != "auto"
    dev = q.device
    window = int(sliding_window) if sliding_window is not None and sliding_window > 0 else None
    prefix_prefill(q, k, v, k_cache, v_cache, _i32(b_loc), _i32(b_start_loc), _i32(b_seq_len), kv_layout="vllm",
                   kv_format=fmt, k_scale=_f32(k_scale, dev) if fp8 else None,
                   v_scale=_f32(v_scale, dev) if fp8 else None, sm_scale=sm_scale, window=window,
                   sinks=_f32(sinks, dev), out_scale=_f32(fp8_out_scale, dev),
                   skip_decode=bool(skip_decode), out=o)
