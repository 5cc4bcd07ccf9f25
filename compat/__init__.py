"""aotc.compat: drop-in entry points with other engines' signatures and tensor conventions.

    from aotc.compat import fla, lightllm, vllm
    vllm.decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits,
                              num_kv_splits, sm_scale)
    vllm.context_attention_fwd(q, k, v, o, kv_cache_dtype, k_cache, v_cache, b_loc, b_start_loc,
                               b_seq_len, max_seq_len, max_input_len, k_scale, v_scale)
    vllm.chunked_prefill_paged_decode(query, key, value, output, kv_cache_dtype, key_cache, value_cache,
                                      block_table, query_start_loc, seq_lens, max_seq_len,
                                      max_query_len, k_scale, v_scale)
    vllm.unified_attention(q, k_cache, v_cache, out, cu_seqlens_q, max_seqlen_q, seqused_k,
                           max_seqlen_k, softmax_scale, causal, window_size, block_table, softcap,
                           q_descale, k_descale, v_descale)
    vllm.reshape_and_cache_int4(key, value, key_cache, value_cache, slot_mapping,
                                k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache)
    o, final_state = fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                                output_final_state=True, cu_seqlens=cu_seqlens)
    lightllm.token_decode_attention_flash_decoding(q, infer_state, cache_k, cache_k_scale, cache_v,
                                                   cache_v_scale)
    lightllm.context_attention_fwd_ppl_int8kv(q, kv, infer_state, cache_kv, cache_kv_scale)

Each first runs the ops' guards on the caller's own tensors (NotImplementedError for an input that
requires grad in grad mode; ValueError for an output that is expand()ed or shares memory with
another argument, named as the engine names it), converts only what must be converted (int64
indices to int32 after checking they fit, uint8 fp8 storage to an fp8 view, a token-level buffer
to pages) and calls aotc's op; an option aotc does not implement
raises NotImplementedError naming it, never computes something else. Importing this package
imports no engine and no Triton.
"""
