"""vLLM's INT4_PER_TOKEN_HEAD cache (`kv_format="int4_rht"`): its stored values are rotated
(kernels/common/int4_rht.py: x_rot = x @ R, R = blockdiag(diag(s) H_b), R R^T = b I), so the query
is rotated before the codes are read ("int4_zp") and the output rotated back after:
  q' = q @ R / 2^e (2^e the power of two nearest below sqrt(b): within sqrt(2) of orthonormal, and
       exact in q's dtype), scores q' . k_rot * sm_scale * 2^e / b = q . k * sm_scale,
  out = out_rot @ R^T / b.
decode: the split kernel does both (its RHT constexpr), reading the signs s that `signs` caches.
prefix_prefill: one torch matmul each, in q's dtype (fp32 accumulation, one rounding, as a float32
product rounded to q's dtype) by a cached D x D matrix whose entries are +-2^-k, exact in
fp16/bf16. Either is made on the first call for a head size (and dtype) and device: make that call
before capturing a CUDA graph. The log-sum-exp needs no rotation."""
from __future__ import annotations

import math

import torch

ZP = "int4_zp"  # prefix_prefill reads the codes as they are stored
_rotations: dict = {}  # (head_dim, dtype, device) -> (q's matrix R / 2^e, the output's R^T / b, b / 2^e)
_signs: dict = {}  # (head_dim, device) -> ([2, head_dim] fp32: s / 2^e, s / b; b / 2^e)


def _gain(b: int) -> tuple[float, float]:
    """(2^e, b / 2^e): 2^e the power of two nearest below sqrt(b)."""
    e = 2.0 ** ((b.bit_length() - 1) // 2)
    return e, b / e


def signs(head_dim: int, device):
    """The decode split kernel's rotation (one block: head dims 64 and 128, where b = head_dim):
    ([2, head_dim] fp32, the query's signs / 2^e and the output's signs / b, exact; the score gain
    b / 2^e that sm_scale is divided by)."""
    key = (head_dim, str(device))
    r = _signs.get(key)
    if r is None:
        from aotc.kernels.common.int4_rht import rht_block, rht_signs

        b = rht_block(head_dim)
        if b != head_dim:
            raise ValueError(f"q: head_dim {head_dim}: the fused rotation is one Hadamard block (a power of two)")
        e, gain = _gain(b)
        s = rht_signs(b)
        r = _signs[key] = (torch.stack([s / e, s / b]).to(device), gain)
    return r


def rotations(head_dim: int, dtype, device):
    key = (head_dim, dtype, str(device))
    r = _rotations.get(key)
    if r is None:
        from aotc.kernels.common.int4_rht import rht_block, rht_matrix

        m, b = rht_matrix(head_dim), rht_block(head_dim)
        e, gain = _gain(b)
        r = ((m / e).to(dtype).to(device), (m.T / b).contiguous().to(dtype).to(device), gain)
        _rotations[key] = r
    return r


def prefix_prefill_rht(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, *, kv_layout, k_scale,
                       v_scale, sm_scale, window, sinks, out_scale, skip_decode, out, validate, v_pack, alibi_slopes,
                       alibi_sqrt, softcap, chunk_lookback=-1, mm_prefix_range=None, mm_clamp=False):
    """prefix_prefill's int4_rht: every key read from the cache (k = v = None), q and out rotated by matmuls;
    the int4_zp call's checks name what that format lacks."""
    from .prefix_prefill import _validate, call

    if k is not None or v is not None:
        raise NotImplementedError("prefix_prefill: kv_format='int4_rht' with the new tokens' k/v passed apart is not "
                                  "implemented (pass k = v = None: their keys and values read from the cache)")
    for on, name in ((out_scale is not None, "out_scale (fp8 output)"), (skip_decode, "skip_decode")):
        if on:
            raise NotImplementedError(f"prefix_prefill: {name} with kv_format='int4_rht' is not implemented")
    _validate(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, kv_layout, ZP, k_scale, v_scale,
              sm_scale, window, sinks, out_scale, out, v_pack, alibi_slopes, alibi_sqrt, softcap, chunk_lookback,
              mm_prefix_range, mm_clamp)
    head_dim = q.shape[-1]
    r_q, r_o, gain = rotations(head_dim, q.dtype, q.device)
    scale = (1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)) / gain
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    # the checks above were the call's: q's rotation changes none of what they read (shape, dtype, strides)
    call(q @ r_q, None, None, k_cache, v_cache, block_table, query_start_loc, seq_lens, kv_layout, ZP, k_scale, v_scale,
         scale, window, sinks, out_scale, skip_decode, out, validate, v_pack, alibi_slopes, alibi_sqrt, softcap,
         chunk_lookback, mm_prefix_range, mm_clamp, checked=True)
    out.copy_(out @ r_o)
    return out
