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
  b_seq_len [batch]; is_mla: V is the first Lv channels of k_buffer; attn_logits [batch, heads,
  num_kv_splits, Lv + 1] fp32: vLLM's workspace for its split partials; k_scale / v_scale: fp8
  dequantization scales (one-element tensors), read only for fp8 caches.

Prefill: `context_attention_fwd` (vllm/attention/ops/prefix_prefill.py, later
vllm/v1/attention/ops/prefix_prefill.py) and `chunked_prefill_paged_decode`
(vllm/attention/ops/chunked_prefill_paged_decode.py, later under vllm/v1/attention/ops/), on
`aotc.loader.prefix_prefill`. vLLM's conventions, as its tests/kernels/attention/test_prefix_prefill.py
and its Triton ops use them:
  q, k, v [tokens, heads, D] (the new tokens), o [tokens, heads, D] written in place (float8_e4m3fn
    when an fp8 output scale is given, else q's dtype);
  k_cache [num_blocks, kv_heads, D // x, block_size, x] (x read from the shape: vLLM packs 16 //
    element size, and 8 for one-byte fp8 caches stored as uint8), v_cache [num_blocks, kv_heads, D,
    block_size];
  block table [batch, max_blocks]; query start offsets [batch + 1]; seq lens [batch] = context + new
    tokens (int32, or int64 converted here);
  kv_cache_dtype "auto" (the cache has q's dtype) or "fp8" / "fp8_e4m3" / "fp8_e5m2" (float8 or its
    uint8 bytes), k_scale / v_scale one-element float32 tensors: value = fp8 * scale;
  sliding_window: keys at distance < window (None or <= 0: none); sm_scale default 1/sqrt(D);
  an fp8 output scale: o = clamp(out / scale) in e4m3 (vLLM multiplies by its inverse); sinks
    [heads] logits joined to the softmax normalizer;
  max_seq_len and max_input_len / max_query_len are accepted and unused: aotc's grid never
  depends on lengths;
  vLLM 0.33.0's later options: k = v = None (the cache already holds the new tokens), alibi_slopes
    [heads], interleaved V caches (V [num_blocks, kv_heads, block_size // P, D, P] in V's 4-D shape,
    P = interleaved_v_pack_factor, or 16 // element size with use_interleaved_v_cache) and block
    tables of addresses (is_block_table_ptr).

Unified attention: `unified_attention` (vllm/v1/attention/ops/triton_unified_attention.py), in
vllm_unified.py and re-exported here with vLLM's `KVQuantMode` values.
"""
from __future__ import annotations

import torch

from ._convert import fp32_scale, guard_call, int32_indices

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_PREFILL_FORMATS = {"auto": "auto", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


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
                         sm_scale, page_size=1, logit_cap=0.0, k_scale=None, v_scale=None, is_mla=False, *,
                         validate=True):
    """vLLM's `decode_attention_fwd` on `aotc.loader.decode` (and, for unequal key and value head
    sizes or is_mla, its MLA family): writes o (and lse when not None).

    is_mla: k_buffer is the latent cache and the value is its first v_buffer.shape[-1] channels
    (v_buffer's data is not read, as in vLLM); each cache tile is read once for both products.
    Converted: req_to_token / b_seq_len int64 -> int32 (a copy each), a 3-D req_to_token [batch,
    n, m] -> its [batch, n * m] rows (vLLM reads each row flat from its stride(0)); a uint8 cache
    (vLLM's fp8 storage) -> a float8_e4m3fn view; a token-level buffer -> its [pages, page_size,
    ...] view; a Python-number scale -> a one-element fp32 tensor; lse in another float dtype
    than fp32 (vLLM's tests allocate q's) -> written through an fp32 buffer and copied in. Scales
    given with an fp16/bf16 cache are not read (as in vLLM).
    Ignored: attn_logits and num_kv_splits (vLLM's workspace and its split count: aotc keeps its
    own workspace and picks its split count from batch, heads and the GPU, never from lengths).
    Differs: a request of length 0 gets o = 0 and lse = -inf (vLLM's kernel divides 0 by 0).
    Not implemented (NotImplementedError): logit_cap != 0 (tanh soft-capping). Other limits are
    decode's (equal head sizes 64/96/128/256, or any multiples of 16 up to 576 / 512 on the MLA
    family; page size a power of two), raised as its ValueError. validate (keyword only, not
    vLLM's): the value check of lengths and page ids, one device sync per eager call (skipped
    under CUDA graph capture).
    """
    from aotc import loader
    from aotc.loader.ops import guards

    guard_call("decode_attention_fwd", {"o": o, "lse": lse}, {
        "q": q, "k_buffer": k_buffer, "v_buffer": v_buffer, "req_to_token": req_to_token, "b_seq_len": b_seq_len,
        "k_scale": k_scale, "v_scale": v_scale})
    sm_scale = guards.real("decode_attention_fwd", "sm_scale", sm_scale)  # float(True) would be 1.0
    if logit_cap:
        raise NotImplementedError(f"logit_cap={logit_cap}: logit soft-capping is not implemented in aotc's decode")
    if not isinstance(q, torch.Tensor) or not isinstance(k_buffer, torch.Tensor) or not isinstance(v_buffer,
                                                                                                  torch.Tensor):
        raise TypeError("q, k_buffer and v_buffer must be torch.Tensors")
    if k_buffer.dtype in (torch.int8,) or v_buffer.dtype in (torch.int8,):
        raise NotImplementedError("int8 k_buffer/v_buffer: vLLM's decode_attention_fwd has no int8 cache; use "
                                  "aotc.loader.decode with per-group or per-channel scales")
    kc = _as_pages(k_buffer, page_size, "k_buffer")
    if is_mla:
        d_v = v_buffer.shape[-1]
        if not 0 < d_v <= kc.shape[-1]:
            raise ValueError(f"is_mla: v_buffer's head size {d_v} must be in [1, {kc.shape[-1]}] (k_buffer's)")
        vc = kc[..., :d_v]
    else:
        vc = _as_pages(v_buffer, page_size, "v_buffer")
    if kc.dtype == torch.uint8:  # vLLM stores fp8 ("fp8", "fp8_e4m3") caches as bytes
        kc, vc = kc.view(torch.float8_e4m3fn), vc.view(torch.float8_e4m3fn)
    if kc.dtype in _FP8:
        ks, vs = fp32_scale(k_scale, "k_scale", q.device), fp32_scale(v_scale, "v_scale", q.device)
        if is_mla:
            vs = ks  # one cache, one scale (vLLM's MLA path dequantizes its V from K with k_scale)
    else:
        ks = vs = None
    if not isinstance(req_to_token, torch.Tensor):
        raise TypeError(f"req_to_token must be a torch.Tensor, got {type(req_to_token).__name__}")
    if req_to_token.dim() > 2:
        req_to_token = req_to_token.flatten(1)
    table = int32_indices(req_to_token, "req_to_token", None if validate else False)
    lens = int32_indices(b_seq_len, "b_seq_len", None if validate else False)
    kwargs = dict(k_scale=ks, v_scale=vs, sm_scale=float(sm_scale), out=o, validate=validate)
    lse32 = lse
    if lse is not None:
        if not isinstance(lse, torch.Tensor) or not lse.dtype.is_floating_point:
            raise TypeError(f"lse must be a floating-point torch.Tensor or None, got {getattr(lse, 'dtype', lse)}")
        if lse.dtype != torch.float32:
            lse32 = torch.empty(lse.shape, dtype=torch.float32, device=lse.device)
        kwargs.update(return_lse=True, lse=lse32)
    if is_mla and vc.shape[-1] < kc.shape[-1]:
        from aotc.loader.ops.mla import split_heads_decode

        split_heads_decode(q, kc, vc, table, lens, latent=True, **kwargs)
    else:
        loader.decode(q, kc, vc, table, lens, **kwargs)
    if lse32 is not lse:
        lse.copy_(lse32)


def _f32_tensor(t, name: str, device):
    """fp32_scale, and a tensor of another float dtype converted to float32 (prefix_prefill reads fp32)."""
    t = fp32_scale(t, name, device)
    return t if t is None or t.dtype == torch.float32 else t.float()


def _block_ids(b_loc, k_cache, is_block_table_ptr: bool, name: str):
    """int32 block ids; with is_block_table_ptr, vLLM's table of block addresses (entries > 0: byte
    addresses in k_cache's pool, as vLLM converts them: (address - base) // block bytes)."""
    if not is_block_table_ptr:
        return int32_indices(b_loc, name)
    if not isinstance(b_loc, torch.Tensor) or b_loc.dtype != torch.int64:
        raise TypeError(f"{name}: block addresses must be an int64 tensor (is_block_table_ptr=True), got "
                        f"{getattr(b_loc, 'dtype', type(b_loc).__name__)}")
    block_bytes = k_cache.stride(0) * k_cache.element_size()
    return torch.where(b_loc > 0, (b_loc - k_cache.data_ptr()) // block_bytes, b_loc).to(torch.int32)


def _prefill(who, q, k, v, o, kv_cache_dtype, k_cache, v_cache, b_loc, b_start_loc, b_seq_len, k_scale, v_scale,
             alibi_slopes, sliding_window, sm_scale, skip_decode, out_scale, sinks, is_block_table_ptr, v_pack,
             causal=True):
    """The shared body of context_attention_fwd and chunked_prefill_paged_decode."""
    from aotc.loader.ops import guards
    from aotc.loader.ops.prefix_prefill import prefix_prefill

    if not causal:
        raise NotImplementedError(f"{who}: causal=False (bidirectional new tokens) is not supported by aotc's "
                                  f"prefix_prefill")
    if (k is None) != (v is None):
        raise ValueError(f"{who}: k and v must both be None (cached-K/V path) or both be tensors")
    if isinstance(q, torch.Tensor) and q.dtype == torch.float32:
        raise NotImplementedError(f"{who}: float32 q/k/v are not supported (fp16 or bf16)")
    if kv_cache_dtype not in _PREFILL_FORMATS:
        raise ValueError(f"{who}: kv_cache_dtype must be one of {tuple(_PREFILL_FORMATS)}, got {kv_cache_dtype!r}")
    fmt = _PREFILL_FORMATS[kv_cache_dtype]
    if fmt == "auto" and isinstance(k_cache, torch.Tensor) and k_cache.dtype == torch.uint8:
        raise ValueError(f"{who}: kv_cache_dtype='auto' with a uint8 cache; pass the fp8 format")
    fp8 = fmt != "auto"
    dev = q.device
    if sliding_window is not None:  # int(True) would be a window of 1
        guards.integer(who, "sliding_window", sliding_window)
    window = int(sliding_window) if sliding_window is not None and sliding_window > 0 else None
    names = (("b_loc", "b_start_loc", "b_seq_len") if who == "context_attention_fwd"  # the caller's own names
             else ("block_table", "query_start_loc", "seq_lens"))
    prefix_prefill(q, k, v, k_cache, v_cache, _block_ids(b_loc, k_cache, is_block_table_ptr, names[0]),
                   int32_indices(b_start_loc, names[1]), int32_indices(b_seq_len, names[2]),
                   kv_layout="vllm", kv_format=fmt, k_scale=_f32_tensor(k_scale, "k_scale", dev) if fp8 else None,
                   v_scale=_f32_tensor(v_scale, "v_scale", dev) if fp8 else None, sm_scale=sm_scale, window=window,
                   sinks=_f32_tensor(sinks, "sinks", dev), out_scale=_f32_tensor(out_scale, "output scale", dev),
                   skip_decode=bool(skip_decode), out=o, v_pack=int(v_pack or 0),
                   alibi_slopes=_f32_tensor(alibi_slopes, "alibi_slopes", dev))


def context_attention_fwd(q, k, v, o, kv_cache_dtype, k_cache, v_cache, b_loc, b_start_loc, b_seq_len, max_seq_len,
                          max_input_len, k_scale, v_scale, alibi_slopes=None, sliding_window=None, sm_scale=None,
                          skip_decode=False, fp8_out_scale=None, sinks=None, is_block_table_ptr=False,
                          interleaved_v_pack_factor=0, causal=True) -> None:
    """vLLM's `context_attention_fwd` on `aotc.loader.prefix_prefill`: writes o, returns None.

    Conventions in the module docstring. skip_decode: requests with one new token are left
    unwritten. k = v = None: the cache already holds the new tokens (vLLM's cached-K/V path), read
    from there. alibi_slopes [heads] (vLLM's prefix ALiBi: slope * (key - query position), the
    same softmax as aotc's slope * (key position - context length)). interleaved_v_pack_factor:
    vLLM's interleaved V cache. is_block_table_ptr: b_loc holds block addresses in k_cache's pool
    (converted to ids, one small tensor op). Converted: index tensors int64 -> int32 (a copy
    each), Python-number or non-fp32 scales, sinks and slopes -> float32. Not implemented
    (NotImplementedError): causal=False, float32 q/k/v, and, as in vLLM, ALiBi with k/v None.
    Other limits are prefix_prefill's (D a multiple of 8 up to 256, x a multiple of 8), raised as
    its ValueError/TypeError.
    """
    guard_call("context_attention_fwd", {"o": o}, {
        "q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "b_loc": b_loc, "b_start_loc": b_start_loc,
        "b_seq_len": b_seq_len, "k_scale": k_scale, "v_scale": v_scale, "fp8_out_scale": fp8_out_scale, "sinks": sinks,
        "alibi_slopes": alibi_slopes})
    if k is None and alibi_slopes is not None:
        raise NotImplementedError("context_attention_fwd: cached K/V (k=None) together with alibi_slopes is not "
                                  "supported (vLLM 0.33.0 raises the same)")
    _prefill("context_attention_fwd", q, k, v, o, kv_cache_dtype, k_cache, v_cache, b_loc, b_start_loc, b_seq_len,
             k_scale, v_scale, alibi_slopes, sliding_window, sm_scale, skip_decode, fp8_out_scale, sinks,
             is_block_table_ptr, interleaved_v_pack_factor, causal)


def chunked_prefill_paged_decode(query, key, value, output, kv_cache_dtype, key_cache, value_cache, block_table,
                                 query_start_loc, seq_lens, max_seq_len, max_query_len, k_scale, v_scale,
                                 alibi_slopes=None, sliding_window=None, sm_scale=None, output_scale=None, sinks=None,
                                 is_block_table_ptr=False, use_interleaved_v_cache=False, causal=True) -> None:
    """vLLM's `chunked_prefill_paged_decode` on one `aotc.loader.prefix_prefill` call: writes output.

    vLLM runs context_attention_fwd(skip_decode=True) for requests with several new tokens and a
    paged decode kernel for those with one. prefix_prefill computes a one-token request as a
    prefill row (context from the cache, the token itself from key/value), so one call covers
    both and needs no host read of the lengths. Differs: a decode row's own key/value come from
    `key`/`value`, not from the cache slot vLLM wrote them to: identical for fp16/bf16 caches,
    unquantized (more exact) for fp8 ones. key = value = None reads every row's keys from the
    cache. Cost (estimated, not measured): a one-token request occupies a whole 128-row query
    tile per query head, so decode-heavy batches do far more MMA work than a decode kernel (it
    stays one pass over the cache per query head); aotc's decode does not read vLLM's x-packed K
    layout, so it cannot take those rows yet. bench/bench_compat_decode_rows.py measures one call
    against prefill + decode calls. Conventions in the module docstring; sm_scale default
    1/sqrt(D); output_scale: fp8 output; use_interleaved_v_cache: vLLM's interleaved V cache, pack
    factor 16 // value_cache's element size (as vLLM). Not implemented (NotImplementedError):
    causal=False, float32 inputs.
    """
    guard_call("chunked_prefill_paged_decode", {"output": output}, {
        "query": query, "key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache,
        "block_table": block_table, "query_start_loc": query_start_loc, "seq_lens": seq_lens, "k_scale": k_scale,
        "v_scale": v_scale, "output_scale": output_scale, "sinks": sinks, "alibi_slopes": alibi_slopes})
    pack = 16 // value_cache.element_size() if use_interleaved_v_cache else 0
    _prefill("chunked_prefill_paged_decode", query, key, value, output, kv_cache_dtype, key_cache, value_cache,
             block_table, query_start_loc, seq_lens, k_scale, v_scale, alibi_slopes, sliding_window, sm_scale, False,
             output_scale, sinks, is_block_table_ptr, pack, causal)


from .vllm_unified import KVQuantMode, unified_attention  # noqa: E402,F401  (vLLM's Triton attention backend)
from .vllm_int4 import reshape_and_cache_int4  # noqa: E402,F401  (vLLM's INT4_PER_TOKEN_HEAD cache writer)
