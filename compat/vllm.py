"""vLLM's Triton attention entry points, with vLLM's signatures, on aotc's kernels.

Decode: `decode_attention_fwd`, vLLM's `triton_decode_attention.decode_attention_fwd` (the
version that takes `lse`, `k_scale` and `v_scale`; vllm/v1/attention/ops/triton_decode_attention.py,
earlier vllm/attention/ops/triton_decode_attention.py). vLLM's conventions, as its kernel reads them:
  q [batch, heads, Lk]; o [batch, heads, Lv]; lse [batch, heads] fp32, natural log
  (stage 2 stores e_max + log(e_sum) of scores already multiplied by sm_scale);
  k_buffer / v_buffer [..., page_size, kv_heads, D]: [tokens, kv_heads, D] with page_size 1, or
  [num_blocks, page_size, kv_heads, D] (vLLM indexes token page * page_size + offset with the
  buffer's stride(-3));
  req_to_token [batch, max_pages]: row b is request b's page table (token ids when page_size is 1);
  b_seq_len [batch]; attn_logits [batch, heads, num_kv_splits, Lv + 1] fp32: vLLM's workspace for
  its split partials; k_scale / v_scale: fp8 dequantization scales (one-element tensors), read
  only for fp8 caches.
Prefill entry points (`context_attention_fwd`, `chunked_prefill_paged_decode`) are added with
the prefix_prefill op's compat work.
"""
from __future__ import annotations

import torch

from ._convert import fp32_scale, int32_indices

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _as_pages(buf, page_size: int, name: str):
    """vLLM's k/v buffer as [pages, page_size, kv_heads, D] (a view)."""
    if not isinstance(buf, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(buf).__name__}")
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
    if buf.dim() == 3:
        if buf.shape[0] % page_size:
            raise ValueError(f"{name}: {buf.shape[0]} token slots are not whole pages of {page_size}")
        return buf.unflatten(0, (buf.shape[0] // page_size, page_size))
    if buf.dim() == 4:
        if buf.shape[1] != page_size:
            raise ValueError(f"{name}: pages of {buf.shape[1]} tokens (dim 1 of {tuple(buf.shape)}), but page_size "
                             f"is {page_size}")
        return buf
    raise ValueError(f"{name}: expected [tokens, kv_heads, D] or [num_blocks, page_size, kv_heads, D], got "
                     f"shape {tuple(buf.shape)}")


def decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits, num_kv_splits,
                         sm_scale, page_size=1, logit_cap=0.0, k_scale=None, v_scale=None, *, validate=True):
    """vLLM's `decode_attention_fwd` on `aotc.loader.decode`: writes o (and lse when not None).

    Converted: req_to_token / b_seq_len int64 -> int32 (a copy each); a uint8 cache (vLLM's fp8
    storage) -> a float8_e4m3fn view; a token-level buffer -> its [pages, page_size, ...] view;
    a Python-number scale -> a one-element fp32 tensor. Scales given with an fp16/bf16 cache are
    not read (as in vLLM).
    Ignored: attn_logits and num_kv_splits (vLLM's workspace and its split count: aotc keeps its
    own workspace and picks its split count from batch, heads and the GPU, never from lengths).
    Differs: a request of length 0 gets o = 0 and lse = -inf (vLLM's kernel divides 0 by 0).
    Not implemented (NotImplementedError): logit_cap != 0 (tanh soft-capping) and MLA (v head dim
    != k head dim). Other limits are decode's (head dims 64/96/128/256, page size a power of two),
    raised as its ValueError. validate (keyword only, not vLLM's): decode's value check of lengths
    and page ids, one device sync per eager call (skipped under CUDA graph capture).
    """
    from aotc import loader

    if logit_cap:
        raise NotImplementedError(f"logit_cap={logit_cap}: logit soft-capping is not implemented in aotc's decode")
    if not isinstance(q, torch.Tensor) or not isinstance(k_buffer, torch.Tensor) or not isinstance(v_buffer,
                                                                                                  torch.Tensor):
        raise TypeError("q, k_buffer and v_buffer must be torch.Tensors")
    if k_buffer.shape[-1] != v_buffer.shape[-1]:
        raise NotImplementedError(f"MLA (k head dim {k_buffer.shape[-1]} != v head dim {v_buffer.shape[-1]}) is not "
                                  f"implemented in aotc's decode")
    if k_buffer.dtype in (torch.int8,) or v_buffer.dtype in (torch.int8,):
        raise NotImplementedError("int8 k_buffer/v_buffer: vLLM's decode_attention_fwd has no int8 cache; use "
                                  "aotc.loader.decode with per-group or per-channel scales")
    kc, vc = _as_pages(k_buffer, page_size, "k_buffer"), _as_pages(v_buffer, page_size, "v_buffer")
    if kc.dtype == torch.uint8:  # vLLM stores fp8 ("fp8", "fp8_e4m3") caches as bytes
        kc, vc = kc.view(torch.float8_e4m3fn), vc.view(torch.float8_e4m3fn)
    if kc.dtype in _FP8:
        ks, vs = fp32_scale(k_scale, "k_scale", q.device), fp32_scale(v_scale, "v_scale", q.device)
    else:
        ks = vs = None
    table = int32_indices(req_to_token, "req_to_token")
    lens = int32_indices(b_seq_len, "b_seq_len")
    if lse is None:
        loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, sm_scale=float(sm_scale), out=o,
                      validate=validate)
    else:
        loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, sm_scale=float(sm_scale), out=o,
                      return_lse=True, lse=lse, validate=validate)
