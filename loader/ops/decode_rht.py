"""decode and prefix_prefill over vLLM's INT4_PER_TOKEN_HEAD cache (`kv_format="int4_rht"`): its
stored values are rotated (kernels/common/int4_rht.py: x_rot = x @ R, R = blockdiag(diag(s) H_b),
R R^T = b I), so the query is rotated before the kernels read the codes ("int4_zp") and the output
rotated back after:
  q' = q @ R / 2^e (2^e the power of two nearest below sqrt(b): within sqrt(2) of orthonormal, and
       exact in q's dtype), scores q' . k_rot * sm_scale * 2^e / b = q . k * sm_scale,
  out = out_rot @ R^T / b.
Each is one torch matmul in q's dtype (fp32 accumulation, one rounding, as a float32 product
rounded to q's dtype) by a cached D x D matrix whose entries are +-2^-k, exact in fp16/bf16
(made on the first call for a head size, dtype and device: make that call before capturing a
CUDA graph). The log-sum-exp needs no rotation. Every check runs before the first launch
(decode's own, on q itself), once per call metadata (decode's plan key): later calls like it rely
on the inner decode's plan-hit checks (pointers apart, grad), which run before its kernels and
before out is written, though after q's rotation."""
from __future__ import annotations

import math

import torch

from aotc.kernels.decode import spec as S

from . import rules

ZP = S.ZP_FORMATS[0]
_checked = rules.PlanCache(1024)  # decode plan keys whose calls passed check_decode (value unused)
_rotations: dict = {}  # (head_dim, dtype, device) -> (q's matrix R / 2^e, the output's R^T / b, b / 2^e)


def rotations(head_dim: int, dtype, device):
    key = (head_dim, dtype, str(device))
    r = _rotations.get(key)
    if r is None:
        from aotc.kernels.common.int4_rht import rht_block, rht_matrix

        m, b = rht_matrix(head_dim), rht_block(head_dim)
        e = 2.0 ** ((b.bit_length() - 1) // 2)
        r = ((m / e).to(dtype).to(device), (m.T / b).contiguous().to(dtype).to(device), b / e)
        _rotations[key] = r
    return r


def decode_rht(q, k_cache, v_cache, table, seq_lens, *, req_idx, k_scale, v_scale, sm_scale, window, sinks, out,
               num_splits, return_lse, lse, scale_layout, alibi_slopes, alibi_sqrt, softcap, validate):
    from .decode import DECODE, check_decode, decode

    if scale_layout != "group":
        raise ValueError(f"scale_layout={scale_layout!r}: an int4_rht cache has one scale word a token ('group')")
    if lse is not None and not return_lse:
        raise ValueError("lse is written only with return_lse=True")
    rules.tensor("decode", "q", q, (torch.float16, torch.bfloat16), dim=3)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if return_lse and lse is None:
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    try:
        key = DECODE.key(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, ZP, sm_scale, window, sinks,
                         num_splits, out, lse, "group", alibi_slopes, alibi_sqrt, softcap)
    except (AttributeError, TypeError):  # not tensors, or unhashable extras: the checks say what is wrong
        key = None
    if key is None or key not in _checked:
        check_decode(q, k_cache, v_cache, table, seq_lens, req_idx, k_scale, v_scale, ZP, sm_scale, window, sinks,
                     num_splits, out, lse, "group", alibi_slopes, alibi_sqrt, softcap)
        _checked.put(key, True)
    head_dim = q.shape[-1]
    r_q, r_o, gain = rotations(head_dim, q.dtype, q.device)
    scale = (1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)) / gain
    q_rot = q @ r_q
    res = decode(q_rot, k_cache, v_cache, table, seq_lens, req_idx=req_idx, k_scale=k_scale, v_scale=v_scale,
                 kv_format=ZP, sm_scale=scale, window=window, sinks=sinks, out=out, num_splits=num_splits,
                 return_lse=return_lse, lse=lse, alibi_slopes=alibi_slopes, alibi_sqrt=alibi_sqrt, softcap=softcap,
                 validate=validate)
    out.copy_(out @ r_o)
    return (out, res[1]) if return_lse else out


def prefix_prefill_rht(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, *, kv_layout, k_scale,
                       v_scale, sm_scale, window, sinks, out_scale, skip_decode, out, validate, v_pack, alibi_slopes,
                       alibi_sqrt, softcap, chunk_lookback=-1, mm_prefix_range=None, mm_clamp=False):
    """prefix_prefill's int4_rht: every key read from the cache (k = v = None), rotated as decode_rht;
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
