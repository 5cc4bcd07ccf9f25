"""LightLLM's quantized-KV attention on aotc: its flash-decoding entry point, with LightLLM's
signature, on aotc's decode, and its int8kv prefill (dequantize then attend, two calls in the
layer) as one call on aotc's prefix_prefill (context_attention_fwd_ppl_int8kv, below).

`token_decode_attention_flash_decoding(q, infer_state, cache_k, cache_k_scale, cache_v,
cache_v_scale, out=None, alloc_tensor_func=torch.empty)`: the signature of LightLLM's int8kv /
int4kv decode entry points (lightllm/models/llama/triton_kernel/ppl_int8kv_flash_decoding.py and
ppl_int4kv_flash_decoding.py, which take q_head_num and head_dim after infer_state in the older
releases; this takes the newer form, without them, and reads both from q).
LightLLM's cache, as its memory managers allocate it (lightllm/common/ppl_int4kv_mem_manager.py,
int8kv_mem_manager.py): one buffer a layer, [tokens, 2 * kv_heads, D // 2] int8 for int4 ([tokens,
2 * kv_heads, D] for int8), K the heads [:kv_heads] and V the rest, with scales [tokens,
2 * kv_heads, D // group] in the model dtype viewed the same way. Its int4 quantizer
(`destindex_copy_int4kv(KV, DestLoc, KV_buffer, KV_scale_buffer, quant_group_size)` with the
Triton kernel `_fwd_kernel_destindex_copy_quantize_int4_kv`; read in LightLLM's source through
the code index, which gave no file path for this newer form: the older
lightllm/models/llama/triton_kernel/ppl_int4kv_copy_kv.py stored two's-complement nibbles with
group 8 through a closed kernel, a format aotc does not read) stores channel 2i in the low nibble
and 2i + 1 in the high one, each as code + 7, code = trunc(x / scale) clamped to [-7, 7], scale =
group absmax / 7: aotc's int4 format. int8 (`destindex_copy_quantize_kv`,
lightllm/models/llama/triton_kernel/ppl_quant_copy_kv.py): code = trunc(x / scale), scale =
group absmax / 127. infer_state carries batch_size, b_req_idx, b_seq_len and
req_manager.req_to_token_indexs ([max_requests, max_tokens] token slots: page size 1).
"""
from __future__ import annotations

import torch

from ._convert import guard_call, int32_indices


def token_decode_attention_flash_decoding(q, infer_state, cache_k, cache_k_scale, cache_v, cache_v_scale, out=None,
                                          alloc_tensor_func=torch.empty, *, validate=True):
    """LightLLM's int4/int8-KV decode on `aotc.loader.decode`; returns out ([B, H, D], q's dtype).

    The format follows from the cache's last dim: D // 2 bytes a head is int4, D is int8 (D is
    q's last dim). Converted: int64 b_req_idx / b_seq_len / req_to_token_indexs -> int32 (a copy
    each). Ignored: infer_state's max_len_in_batch / max_kv_seq_len (the grid never depends on
    lengths). sm_scale is 1/sqrt(D), as LightLLM's. Limits are decode's (head dims 64/96/128/256,
    groups a power of two in [8, 128]), raised as its ValueError; validate (keyword only, not
    LightLLM's) as decode's.
    """
    from aotc import loader

    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q: expected [batch, q_heads, head_dim], got {getattr(q, 'shape', type(q).__name__)}")
    if not isinstance(cache_k, torch.Tensor):
        raise TypeError(f"cache_k must be a torch.Tensor, got {type(cache_k).__name__}")
    head_dim = q.shape[2]
    if cache_k.shape[-1] * 2 == head_dim:
        fmt = "int4"
    elif cache_k.shape[-1] == head_dim:
        fmt = "int8"
    else:
        raise ValueError(f"cache_k: last dim {cache_k.shape[-1]}: expected {head_dim // 2} (int4) or {head_dim} "
                         f"(int8) for head_dim {head_dim}")
    try:
        req_idx, lens = infer_state.b_req_idx, infer_state.b_seq_len
        table = infer_state.req_manager.req_to_token_indexs
    except AttributeError as e:
        raise TypeError(f"infer_state: expected LightLLM's InferStateInfo (b_req_idx, b_seq_len, "
                        f"req_manager.req_to_token_indexs): {e}") from None
    batch = getattr(infer_state, "batch_size", q.shape[0])
    if batch != q.shape[0]:
        raise ValueError(f"infer_state.batch_size = {batch}, but q holds {q.shape[0]} requests")
    if out is None:
        out = alloc_tensor_func(q.shape, dtype=q.dtype, device=q.device)
    guard_call("token_decode_attention_flash_decoding", {"out": out}, {
        "q": q, "cache_k": cache_k, "cache_k_scale": cache_k_scale, "cache_v": cache_v, "cache_v_scale": cache_v_scale,
        "b_req_idx": req_idx, "b_seq_len": lens, "req_to_token_indexs": table})
    check = None if validate else False
    return loader.decode(q, cache_k, cache_v, int32_indices(table, "req_to_token_indexs", check),
                         int32_indices(lens, "b_seq_len", check), req_idx=int32_indices(req_idx, "b_req_idx", check),
                         k_scale=cache_k_scale, v_scale=cache_v_scale, kv_format=fmt, out=out, validate=validate)


def context_attention_fwd_ppl_int8kv(q, kv, infer_state, cache_kv, cache_kv_scale, out=None,
                                     alloc_tensor_func=torch.empty, *, validate=None):
    """LightLLM's quantized-KV prefill (the layer's `_context_attention_kernel_ppl_int8kv`) on
    `aotc.loader.prefix_prefill`; returns out (q's shape and dtype).

    LightLLM dequantizes every request's whole cache into a [batch, 2 * kv_heads, max_seq_len, D]
    buffer (`destindex_copy_dequantize_kv`) and then attends over it
    (`context_attention_fwd_ppl_int8kv(q, k, v, o, b_start_loc, b_seq_len, max_input_len,
    b_prompt_cache_len)`); this one call replaces both: the cached prefix is read from the
    quantized buffer and dequantized on the tiles, nothing the size of the cache is allocated.
      q        [T, q_heads * D] or [T, q_heads, D]: the new tokens of all requests, packed in
               request order (LightLLM's b_start_loc).
      kv       [T, 2 * kv_heads, D]: their K (heads [:kv_heads]) and V in q's dtype, as the layer
               computed them (`cache_kv`); the new tokens attend to these, not to their quantized
               copies in the cache.
      infer_state  LightLLM's: b_req_idx, b_seq_len (prefix + new tokens), b_ready_cache_len
               (the prefix already in the cache) and req_manager.req_to_token_indexs (token slots,
               page size 1).
      cache_kv, cache_kv_scale  the layer's mem_manager.kv_buffer / scale_buffer: [slots,
               2 * kv_heads, D] int8 (D // 2 for int4, code + 7 nibbles) and [slots, 2 * kv_heads,
               D // group] scales in the model dtype (LightLLM's int8kv quantizes groups of 8).
    Converted: int64 indices to int32 (a copy each) and the requests' rows of req_to_token_indexs
    gathered into a block table ([batch, its width] int32, a copy). sm_scale is 1/sqrt(D), as
    LightLLM's. Limits and errors are prefix_prefill's (ValueError/TypeError naming its argument:
    k_cache / k_scale are the buffers' K halves); validate (keyword only, not LightLLM's) as
    prefix_prefill's.
    """
    from aotc import loader
    from aotc.loader.ops.value_checks import skip_value_checks

    for name, t in (("q", q), ("kv", kv), ("cache_kv", cache_kv), ("cache_kv_scale", cache_kv_scale)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if kv.dim() != 3 or kv.shape[1] % 2:
        raise ValueError(f"kv: expected [tokens, 2 * kv_heads, head_dim], got {tuple(kv.shape)}")
    kv_heads, head_dim = kv.shape[1] // 2, kv.shape[2]
    if q.dim() == 2 and q.shape[1] % head_dim == 0:
        q3 = q.view(q.shape[0], q.shape[1] // head_dim, head_dim)
    elif q.dim() == 3:
        q3 = q
    else:
        raise ValueError(f"q: expected [tokens, q_heads * {head_dim}] or [tokens, q_heads, {head_dim}] (head_dim "
                         f"from kv), got {tuple(q.shape)}")
    for name, t in (("cache_kv", cache_kv), ("cache_kv_scale", cache_kv_scale)):
        if t.dim() != 3 or t.shape[1] != 2 * kv_heads:
            raise ValueError(f"{name}: expected [slots, {2 * kv_heads}, ...] (2 * kv_heads from kv), got "
                             f"{tuple(t.shape)}")
    try:
        req_idx, lens = infer_state.b_req_idx, infer_state.b_seq_len
        ready = infer_state.b_ready_cache_len
        table = infer_state.req_manager.req_to_token_indexs
    except AttributeError as e:
        raise TypeError(f"infer_state: expected LightLLM's InferStateInfo (b_req_idx, b_seq_len, b_ready_cache_len, "
                        f"req_manager.req_to_token_indexs): {e}") from None
    guard_call("context_attention_fwd_ppl_int8kv", {"out": out}, {  # out None: allocated below, apart by birth
        "q": q, "kv": kv, "cache_kv": cache_kv, "cache_kv_scale": cache_kv_scale, "b_req_idx": req_idx,
        "b_seq_len": lens, "b_ready_cache_len": ready, "req_to_token_indexs": table})
    check = None if validate is not False else False
    lens = int32_indices(lens, "b_seq_len", check)
    ready = int32_indices(ready, "b_ready_cache_len", check)
    req_idx = int32_indices(req_idx, "b_req_idx", check)
    table = int32_indices(table, "req_to_token_indexs", check)
    if not (lens.dim() == ready.dim() == req_idx.dim() == 1 and lens.shape == ready.shape == req_idx.shape):
        raise ValueError(f"infer_state: b_seq_len, b_ready_cache_len and b_req_idx must be [batch] alike, got "
                         f"{tuple(lens.shape)}, {tuple(ready.shape)}, {tuple(req_idx.shape)}")
    if table.dim() != 2:
        raise ValueError(f"req_to_token_indexs: expected [max_requests, max_tokens], got {tuple(table.shape)}")
    # New tokens packed in request order: query_start_loc from their counts, on the device.
    query_start_loc = torch.zeros(lens.shape[0] + 1, dtype=torch.int32, device=lens.device)
    query_start_loc[1:] = torch.cumsum(lens - ready, 0)
    if validate is None:  # as prefix_prefill: host checks, except under torch.compile and graph capture
        validate = not skip_value_checks(q)
    if validate:
        if bool(((req_idx < 0) | (req_idx >= table.shape[0])).any()):
            raise ValueError(f"b_req_idx: every entry must be a row of req_to_token_indexs [0, {table.shape[0]})")
        if bool(((ready < 0) | (ready > lens)).any()):
            raise ValueError(f"b_ready_cache_len: every entry must be in [0, b_seq_len], got {ready.tolist()} for "
                             f"b_seq_len {lens.tolist()}")
    block_table = table.index_select(0, req_idx.long())
    page = slice(None), None  # token slots as pages of one token: [slots, 1, kv_heads, ...]
    k_cache, v_cache = cache_kv[:, :kv_heads][page], cache_kv[:, kv_heads:][page]
    k_scale, v_scale = cache_kv_scale[:, :kv_heads][page], cache_kv_scale[:, kv_heads:][page]
    if out is None:
        out = alloc_tensor_func(q.shape, dtype=q.dtype, device=q.device)
    if not isinstance(out, torch.Tensor) or out.numel() != q3.numel():
        raise ValueError(f"out: expected q's shape {tuple(q.shape)}, got {tuple(getattr(out, 'shape', ()))}")
    out3 = out.view(q3.shape)
    loader.prefix_prefill(q3, kv[:, :kv_heads], kv[:, kv_heads:], k_cache, v_cache, block_table, query_start_loc,
                          lens, k_scale=k_scale, v_scale=v_scale, out=out3, validate=validate)
    return out
