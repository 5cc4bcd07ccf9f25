"""LightLLM's quantized-KV flash decoding entry point, with LightLLM's signature, on aotc's decode.

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

from ._convert import int32_indices


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
    return loader.decode(q, cache_k, cache_v, int32_indices(table, "req_to_token_indexs"),
                         int32_indices(lens, "b_seq_len"), req_idx=int32_indices(req_idx, "b_req_idx"),
                         k_scale=cache_k_scale, v_scale=cache_v_scale, kv_format=fmt, out=out, validate=validate)
