"""Float32 torch reference of paged decode attention (the quantized formats' reference, which the
families share, is kernels/common/quant_reference.py, re-exported here).

Written to be read, not to be fast: one request at a time, on the device its inputs are on.
"""
from __future__ import annotations

import math

import torch

from aotc.kernels.common.quant_reference import (  # noqa: F401 - re-exported for decode's callers
    INT_QMAX, dequantize, dequantize_per_channel, pack_int4, quantize_reference, unpack_int4,
)

def gather_tokens(cache: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """Tokens 0..length-1 of one request: [length, kv_heads, head_dim] from a [pages, page, ...] cache."""
    page_size = cache.shape[1]
    t = torch.arange(length, device=cache.device)
    pages = table_row.long()[t // page_size]
    return cache[pages, t % page_size]


def decode_reference(q, k_cache, v_cache, table, seq_lens, req_idx=None, sm_scale=None,
                     window=None, sinks=None, return_lse=False, softcap=0.0, alibi_slopes=None, alibi_sqrt=False):
    """Attention of one query token per request over its cached tokens, in float32.

    q [batch, q_heads, d_qk]; k_cache [pages, page_size, kv_heads, d_qk] and v_cache [pages,
    page_size, kv_heads, d_v] of real values (dequantize first; MLA's latent cache: pass
    `k_cache[..., :d_v]` as v_cache); table [rows, max_pages]; seq_lens [batch]; req_idx [batch] or
    None (row b); window: attend to the last `window` tokens; sinks [q_heads]: logits joined to
    the softmax denominator that contribute no value. Returns [batch, q_heads, d_v] float32;
    a request of length 0 gives zeros. return_lse: also the [batch, q_heads] float32 natural-log
    log-sum-exp of the scaled scores attended plus the sink (-inf where there is neither).
    softcap > 0: scores s become softcap * tanh(s / softcap); then alibi_slopes [q_heads] add
    slope * (t - (length - 1)) for token t, or with alibi_sqrt -slope * sqrt(length - 1 - t).
    """
    batch, q_heads, d_qk = q.shape
    kv_heads, d_v = v_cache.shape[2], v_cache.shape[3]
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else sm_scale
    out = torch.zeros(batch, q_heads, d_v, dtype=torch.float32, device=q.device)
    lse = torch.full((batch, q_heads), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(batch):
        row = int(req_idx[b]) if req_idx is not None else b
        length = int(seq_lens[b])
        start = max(0, length - window) if window else 0
        # [tokens, q_heads, d]: each query head reads its kv head (h // group).
        k = gather_tokens(k_cache, table[row], length)[start:].float().repeat_interleave(group, dim=1)
        v = gather_tokens(v_cache, table[row], length)[start:].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q[b].float(), k) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        if alibi_slopes is not None:
            rel = torch.arange(start, length, device=q.device, dtype=torch.float32) - (length - 1)
            bias = -torch.sqrt(-rel) if alibi_sqrt else rel
            scores = scores + alibi_slopes.float().view(q_heads, 1) * bias
        if sinks is not None:
            scores = torch.cat([scores, sinks.float().view(q_heads, 1)], dim=1)
        if scores.shape[1] == 0:
            continue
        lse[b] = torch.logsumexp(scores, dim=1)
        p = torch.softmax(scores, dim=1)[:, : k.shape[0]]
        out[b] = torch.einsum("ht,thd->hd", p, v)
    return (out, lse) if return_lse else out
