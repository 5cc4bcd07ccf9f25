"""Float32 torch reference for paged prefix-prefill attention, with the mask spelled out.

Request b has ctx = seq_lens[b] - q_len context tokens in the paged cache (pages listed in
block_table[b]) and q_len new tokens in q/k/v rows query_start_loc[b]:query_start_loc[b+1].
New token i sits at absolute position ctx + i; it sees key position j when j <= ctx + i and,
with a window w > 0, when (ctx + i) - j < w; or, with chunk_lookback L >= 0 as well (chunked local
attention, chunk size C = w // (L + 1)), when (ctx + i) // C - j // C <= L instead. mm_prefix_range
[B, R, 2] (inclusive (start, end) positions, start < end) adds the pairs whose query and key both
lie in one range, future keys included (with mm_clamp only those with (ctx + i) - j < w). Scores s
(natural log, times sm_scale) are capped to softcap * tanh(s / softcap) and then get ALiBi's bias
slope * (j - ctx), or in the sqrt form -slope * sqrt((ctx + i) - j). With k = v = None the new
tokens' keys and values are the cache's positions ctx.. (the cache holds the whole sequence).
Quantized caches (fp8, int8, int4) are dequantized to float32 first (decode's reference formats),
then attended.
"""
from __future__ import annotations

import math

import torch

from aotc.kernels.common.quant_reference import unpack_int4

FP8_E4M3_MAX = 448.0


def gather_cache(cache: torch.Tensor, pages: torch.Tensor, length: int, layout: str, which: str,
                 scale: torch.Tensor | None, v_pack: int = 0) -> torch.Tensor:
    """The first `length` tokens of one request from a paged cache, as float32 [length, heads, D].
    v_pack: vLLM's interleaved V, [n, heads, block_size // v_pack, D, v_pack] in V's 4-D shape."""
    blocks = cache[pages.long()].float()
    if layout == "nhd":  # [n, block_size, heads, D]
        tokens = blocks
    elif which == "k":  # [n, heads, D // x, block_size, x] -> [n, block_size, heads, D // x, x]
        tokens = blocks.permute(0, 3, 1, 2, 4).flatten(3)
    elif v_pack:  # [n, heads, bs // P, D, P] -> [n, bs // P, P, heads, D] -> [n, block_size, heads, D]
        n, h, d, bs = blocks.shape
        tokens = blocks.reshape(n, h, bs // v_pack, d, v_pack).permute(0, 2, 4, 1, 3).reshape(n, bs, h, d)
    else:  # [n, heads, D, block_size] -> [n, block_size, heads, D]
        tokens = blocks.permute(0, 3, 1, 2)
    tokens = tokens.reshape(-1, tokens.shape[2], tokens.shape[3])[:length]
    return tokens * scale.float().item() if scale is not None else tokens


def block_size_of(k_cache: torch.Tensor, layout: str) -> int:
    return k_cache.shape[1] if layout == "nhd" else k_cache.shape[3]


def dequantize_int_cache(cache: torch.Tensor, fmt: str, scale: torch.Tensor) -> torch.Tensor:
    """float32 values of an int8/int4 nhd cache [blocks, block_size, heads, Dc]: codes * scale, with
    scale [blocks, block_size, heads, D // group] (one a token, head and group of channels; last
    dim 1: one a token and head) or [heads, D] (one a channel)."""
    codes = unpack_int4(cache) if fmt == "int4" else cache.to(torch.int16)
    scale = scale.float()
    if scale.dim() == codes.dim():  # per group: each scale over its group's channels
        scale = scale.repeat_interleave(codes.shape[-1] // scale.shape[-1], dim=-1)
    return codes.float() * scale  # [heads, D] broadcasts


def _dequantized(k_cache, v_cache, kv_layout, kv_format, k_scale, v_scale, head_dim):
    """(k_cache, v_cache, layout, k_scale, v_scale) with hnd made nhd, fp8 bytes viewed as fp8 and
    int8/int4 and fp8 with per-token scales (the cache's shape, last dim 1) made float32 (their
    scales then None)."""
    if kv_layout == "hnd":
        k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        if k_scale is not None and k_scale.dim() == 4:
            k_scale, v_scale = k_scale.transpose(1, 2), v_scale.transpose(1, 2)
        kv_layout = "nhd"
    fp8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
    if kv_format in fp8 and k_cache.dtype in (torch.uint8, torch.int8):
        k_cache, v_cache = k_cache.view(fp8[kv_format]), v_cache.view(fp8[kv_format])
    if kv_format == "auto" and k_cache.dtype in (torch.int8, torch.uint8):
        kv_format = "int4" if k_cache.dtype == torch.uint8 or 2 * k_cache.shape[-1] == head_dim else "int8"
    if k_cache.dtype in fp8.values() and k_scale is not None and k_scale.dim() == 4:  # fp8 with per-token scales
        k_cache, v_cache = k_cache.float() * k_scale.float(), v_cache.float() * v_scale.float()
        k_scale = v_scale = None
    if kv_format in ("int8", "int4"):
        k_cache = dequantize_int_cache(k_cache, kv_format, k_scale)
        v_cache = dequantize_int_cache(v_cache, kv_format, v_scale)
        k_scale = v_scale = None
    return k_cache, v_cache, kv_layout, k_scale, v_scale


def prefix_prefill_ref(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, *,
                       kv_layout="nhd", kv_format="auto", k_scale=None, v_scale=None, sm_scale=None, window=None,
                       sinks=None, softcap=0.0, alibi_slopes=None, alibi_sqrt=False, v_pack=0, chunk_lookback=-1,
                       mm_prefix_range=None, mm_clamp=False) -> torch.Tensor:
    """float32 [num_tokens, q_heads, D]; rows that belong to no request are 0. kv_format "auto"
    infers the format as the op does (an int8 cache of last dim D / 2, or uint8, is int4)."""
    k_cache, v_cache, kv_layout, k_scale, v_scale = _dequantized(k_cache, v_cache, kv_layout, kv_format, k_scale,
                                                                 v_scale, q.shape[-1])
    num_tokens, q_heads, head_dim = q.shape
    from_cache = k is None
    kv_heads = k_cache.shape[2 if kv_layout == "nhd" else 1] if from_cache else k.shape[1]
    group = q_heads // kv_heads
    sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    bs = block_size_of(k_cache, kv_layout)
    out = torch.zeros(num_tokens, q_heads, head_dim, dtype=torch.float32, device=q.device)
    qsl = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        q0, q1 = qsl[b], qsl[b + 1]
        q_len = q1 - q0
        if q_len == 0:
            continue
        ctx = seq_len - q_len
        if from_cache:
            pages = block_table[b, : (seq_len + bs - 1) // bs]
            keys = gather_cache(k_cache, pages, seq_len, kv_layout, "k", k_scale)
            vals = gather_cache(v_cache, pages, seq_len, kv_layout, "v", v_scale, v_pack)
        else:
            pages = block_table[b, : (ctx + bs - 1) // bs]
            keys = torch.cat([gather_cache(k_cache, pages, ctx, kv_layout, "k", k_scale), k[q0:q1].float()])
            vals = torch.cat([gather_cache(v_cache, pages, ctx, kv_layout, "v", v_scale, v_pack), v[q0:q1].float()])
        keys = keys.repeat_interleave(group, dim=1)  # [seq, q_heads, D]
        vals = vals.repeat_interleave(group, dim=1)

        q_pos = torch.arange(ctx, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        allowed = k_pos <= q_pos
        if window and chunk_lookback >= 0:
            chunk = window // (chunk_lookback + 1)
            allowed &= (q_pos // chunk - k_pos // chunk) <= chunk_lookback
        elif window:
            allowed &= (q_pos - k_pos) < window
        if mm_prefix_range is not None:
            for start, end in mm_prefix_range[b].tolist():
                if start < end:
                    both = ((q_pos >= start) & (q_pos <= end)) & ((k_pos >= start) & (k_pos <= end))
                    allowed |= both & ((q_pos - k_pos) < window) if mm_clamp and window else both

        scores = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), keys) * sm_scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        if alibi_slopes is not None:
            slopes = alibi_slopes.float()[:, None, None]
            if alibi_sqrt:
                scores = scores - slopes * (q_pos - k_pos).clamp_min(0).float().sqrt()
            else:
                scores = scores + slopes * (k_pos - ctx).float()
        scores = scores.masked_fill(~allowed, float("-inf"))
        if sinks is not None:  # a logit in the normalizer with no value (gpt-oss)
            sink_col = sinks.float()[:, None, None].expand(q_heads, q_len, 1)
            probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        probs = torch.nan_to_num(probs, nan=0.0)  # a row that sees nothing gives zeros
        out[q0:q1] = torch.einsum("hqk,khd->qhd", probs, vals)
    return out


def quantize_fp8_ref(x: torch.Tensor, out_scale: torch.Tensor) -> torch.Tensor:
    """What fp8 output means: clamp(x / out_scale, -448, 448) in float8_e4m3fn."""
    return (x.float() / out_scale.float().item()).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)

