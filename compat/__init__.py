"""aotc.compat: drop-in entry points with other engines' signatures and tensor conventions.

    from aotc.compat import vllm, lightllm
    vllm.decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits,
                              num_kv_splits, sm_scale)
    lightllm.token_decode_attention_flash_decoding(q, infer_state, cache_k, cache_k_scale, cache_v,
                                                   cache_v_scale)

Each converts only what must be converted (int64 indices to int32, uint8 fp8 storage to an fp8
view, a token-level buffer to pages) and calls aotc's op; an option aotc does not implement
raises NotImplementedError naming it, never computes something else. Importing this package
imports no engine and no Triton.
"""
