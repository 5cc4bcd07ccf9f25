"""Float32 torch reference of paged decode attention and of the cache quantization formats.

Written to be read, not to be fast: one request at a time, on the device its inputs are on.
"""
from __future__ import annotations

import math

import torch

INT_QMAX = {"int8": 127, "int4": 7}


def gather_tokens(cache: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """Tokens 0..length-1 of one request: [length, kv_heads, head_dim] from a [pages, page, ...] cache."""
    page_size = cache.shape[1]
    t = torch.arange(length, device=cache.device)
    pages = table_row.long()[t // page_size]
    return cache[pages, t % page_size]


def decode_reference(q, k_cache, v_cache, table, seq_lens, req_idx=None, sm_scale=None,
                     window=None, sinks=None, return_lse=False):
    """Attention of one query token per request over its cached tokens, in float32.

    q [batch, q_heads, head_dim]; k_cache, v_cache [pages, page_size, kv_heads, head_dim] of real
    values (dequantize first); table [rows, max_pages]; seq_lens [batch]; req_idx [batch] or
    None (row b); window: attend to the last `window` tokens; sinks [q_heads]: logits joined to
    the softmax denominator that contribute no value. Returns [batch, q_heads, head_dim] float32;
    a request of length 0 gives zeros. return_lse: also the [batch, q_heads] float32 natural-log
    log-sum-exp of the scaled scores attended plus the sink (-inf where there is neither).
    """
    batch, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    out = torch.zeros(batch, q_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((batch, q_heads), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(batch):
        row = int(req_idx[b]) if req_idx is not None else b
        length = int(seq_lens[b])
        start = max(0, length - window) if window else 0
        # [tokens, q_heads, head_dim]: each query head reads its kv head (h // group).
        k = gather_tokens(k_cache, table[row], length)[start:].float().repeat_interleave(group, dim=1)
        v = gather_tokens(v_cache, table[row], length)[start:].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q[b].float(), k) * scale
        if sinks is not None:
            scores = torch.cat([scores, sinks.float().view(q_heads, 1)], dim=1)
        if scores.shape[1] == 0:
            continue
        lse[b] = torch.logsumexp(scores, dim=1)
        p = torch.softmax(scores, dim=1)[:, : k.shape[0]]
        out[b] = torch.einsum("ht,thd->hd", p, v)
    return (out, lse) if return_lse else out


def quantize_reference(x: torch.Tensor, fmt: str, group: int, scale_dtype: torch.dtype):
    """Per-group absmax quantization of x [..., head_dim] as store_kv writes it.

    Returns (codes, scales): int8 codes [..., head_dim] in [-qmax, qmax] (not yet packed) and
    scales [..., head_dim // group] in scale_dtype. The scale is absmax / qmax, rounded to
    scale_dtype first so that the codes are computed against the scale that is stored.
    """
    qmax = INT_QMAX[fmt]
    x = x.float()
    codes = torch.zeros(x.shape, dtype=torch.int8, device=x.device)
    scales = torch.zeros(*x.shape[:-1], x.shape[-1] // group, dtype=scale_dtype, device=x.device)
    for g in range(x.shape[-1] // group):
        chunk = x[..., g * group:(g + 1) * group]
        scale = (chunk.abs().amax(-1) / qmax).to(scale_dtype)
        scales[..., g] = scale
        s = scale.float().unsqueeze(-1)
        safe = torch.where(s == 0, torch.ones_like(s), s)  # an all-zero group stores zeros
        codes[..., g * group:(g + 1) * group] = torch.round(chunk / safe).clamp(-qmax, qmax).to(torch.int8)
    return codes, scales


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """int4 codes [..., head_dim] in [-7, 7] -> bytes [..., head_dim // 2]: channel 2i in the
    low nibble, 2i+1 in the high nibble, each stored as code + 7."""
    nib = (codes.to(torch.int16) + 7)
    return (nib[..., 0::2] | (nib[..., 1::2] << 4)).to(torch.uint8).view(torch.int8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    b = packed.view(torch.uint8).to(torch.int16)
    return torch.stack([(b & 0xF) - 7, (b >> 4) - 7], dim=-1).flatten(-2)


def dequantize_per_channel(cache: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """An int8 cache [..., kv_heads, head_dim] with one scale a KV head and channel, scale
    [kv_heads, head_dim]: codes * scale[head, channel], float32."""
    return cache.float() * scale.float()


def dequantize(cache: torch.Tensor, fmt: str, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The real values a cache holds, float32, shaped [..., head_dim].

    int8/int4: scale [..., head_dim // group] per group; fp8: scale a scalar or one per kv head
    (the cache's second-to-last dim); fp16/bf16: scale unused.
    """
    if fmt in ("fp16", "bf16"):
        return cache.float()
    if fmt in ("fp8_e4m3", "fp8_e5m2"):
        s = torch.ones((), device=cache.device) if scale is None else scale.float()
        if s.dim() == 1:
            s = s.view(-1, 1)  # per kv head, broadcast over head_dim
        return cache.float() * s
    codes = unpack_int4(cache) if fmt == "int4" else cache.to(torch.int16)
    group = codes.shape[-1] // scale.shape[-1]
    return (codes.float().unflatten(-1, (-1, group)) * scale.float().unsqueeze(-1)).flatten(-2)
