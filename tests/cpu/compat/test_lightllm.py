"""aotc.compat.lightllm's decode (token_decode_attention_flash_decoding) and prefill
(context_attention_fwd_ppl_int8kv) on caches written the way LightLLM writes them, against the
float32 reference over the dequantized cache: every element within cases.assert_close's
tolerance (bf16 2e-2 abs + rel, fp16 5e-3), output poisoned with NaN first.

LightLLM's quantizers, re-implemented from its source (the memory managers
lightllm/common/ppl_int4kv_mem_manager.py and int8kv_mem_manager.py; the int4 copy kernel
`_fwd_kernel_destindex_copy_quantize_int4_kv` of `destindex_copy_int4kv`, the int8 one of
`destindex_copy_quantize_kv` in lightllm/models/llama/triton_kernel/ppl_quant_copy_kv.py): one
buffer a layer [tokens, 2 * kv_heads, D // 2] (int4) or [.., D] (int8) with K in heads [:kv_heads]
and V in the rest; scale = group absmax / 7 (int4) or / 127 (int8) in the model dtype; code =
trunc(x / scale) (Triton's float -> int8 conversion), int4 clamped to [-7, 7] and stored + 7,
channel 2i in the low nibble.
"""
from types import SimpleNamespace

import pytest
import torch

from aotc.compat import lightllm
from aotc.kernels.decode import reference as R
from tests.cpu.kernels.decode.cases import assert_close


def lightllm_quantize(kv, fmt, group):
    """LightLLM's copy-quantize of new tokens kv [T, 2 * kv_heads, D]: (codes as stored, scales)."""
    qmax = 7.0 if fmt == "int4" else 127.0
    xg = kv.unflatten(-1, (-1, group))
    scale = (xg.abs().amax(-1) / qmax).to(kv.dtype)
    codes = torch.trunc(xg.float() / scale.float()[..., None]).clamp(-qmax, qmax).to(torch.int16).flatten(-2)
    if fmt == "int8":
        return codes.to(torch.int8), scale
    nib = (codes + 7).to(torch.uint8)
    return (nib[..., 0::2] | (nib[..., 1::2] << 4)).view(torch.int8), scale


def lightllm_dequantize(stored, scale, fmt):
    codes = R.unpack_int4(stored) if fmt == "int4" else stored.to(torch.int16)
    group = codes.shape[-1] // scale.shape[-1]
    return (codes.float().unflatten(-1, (-1, group)) * scale.float()[..., None]).flatten(-2)


def lightllm_step(lens, fmt, group, *, head_dim=64, heads=8, kv_heads=2, dtype=torch.bfloat16, seed=80):
    """A decode step as LightLLM holds it: the layer's KV buffer filled through its quantizer at
    random token slots, req_to_token_indexs rows for shuffled request ids, infer_state."""
    g = torch.Generator().manual_seed(seed)
    batch, size = len(lens), sum(lens) + 40
    width = head_dim // 2 if fmt == "int4" else head_dim
    kv_buffer = torch.zeros(size + 1, 2 * kv_heads, width, dtype=torch.int8)
    scale_buffer = torch.zeros(size + 1, 2 * kv_heads, head_dim // group, dtype=dtype)
    new = (torch.randn(size + 1, 2 * kv_heads, head_dim, generator=g) * 2).to(dtype)
    dest = torch.randperm(size + 1, generator=g).to(torch.int32)
    stored, scales = lightllm_quantize(new, fmt, group)
    kv_buffer[dest.long()], scale_buffer[dest.long()] = stored, scales
    max_reqs, max_len = batch + 3, max(lens) + 5
    # unused entries hold slots past the buffer: never read
    req_to_token = torch.full((max_reqs, max_len), 10 ** 6, dtype=torch.int32)
    b_req_idx = torch.randperm(max_reqs, generator=g)[:batch].to(torch.int32)
    slots = torch.randperm(size + 1, generator=g).to(torch.int32)
    at = 0
    for b, n in enumerate(lens):
        req_to_token[b_req_idx[b], :n] = slots[at:at + n]
        at += n
    state = SimpleNamespace(batch_size=batch, b_req_idx=b_req_idx, b_seq_len=torch.tensor(lens, dtype=torch.int32),
                            max_len_in_batch=max(lens), max_kv_seq_len=max(lens),
                            req_manager=SimpleNamespace(req_to_token_indexs=req_to_token))
    q = torch.randn(batch, heads, head_dim, generator=g).to(dtype)
    real = lightllm_dequantize(kv_buffer, scale_buffer, fmt)  # [slots, 2 * kv_heads, D]
    return q, state, kv_buffer, scale_buffer, real


def reference(q, state, real, kv_heads):
    k, v = real[:, :kv_heads].unsqueeze(1), real[:, kv_heads:].unsqueeze(1)  # page size 1
    return R.decode_reference(q, k, v, state.req_manager.req_to_token_indexs, state.b_seq_len,
                              req_idx=state.b_req_idx)


@pytest.mark.parametrize("fmt,group,head_dim", [("int4", 8, 64), ("int4", 32, 128), ("int8", 8, 64),
                                                ("int8", 128, 128)])
def test_lightllm_cache_views_at_block_edges(fmt, group, head_dim):
    q, state, kv_buffer, scale_buffer, real = lightllm_step([1, 63, 64, 65, 129, 0], fmt, group, head_dim=head_dim)
    kvh = 2
    out = torch.full_like(q, float("nan"))
    got = lightllm.token_decode_attention_flash_decoding(
        q, state, kv_buffer[:, :kvh], scale_buffer[:, :kvh], kv_buffer[:, kvh:], scale_buffer[:, kvh:], out=out)
    assert got is out
    assert_close(out, reference(q, state, real, kvh), f"lightllm {fmt} g{group} d{head_dim}")
    assert (out[5] == 0).all()


def test_int64_indices_fp16_and_allocated_output():
    q, state, kv_buffer, scale_buffer, real = lightllm_step([7, 100], "int4", 8, dtype=torch.float16, seed=81)
    state.b_req_idx, state.b_seq_len = state.b_req_idx.long(), state.b_seq_len.long()
    state.req_manager.req_to_token_indexs = state.req_manager.req_to_token_indexs.long()
    out = lightllm.token_decode_attention_flash_decoding(q, state, kv_buffer[:, :2], scale_buffer[:, :2],
                                                         kv_buffer[:, 2:], scale_buffer[:, 2:])
    assert out.dtype == torch.float16
    assert_close(out, reference(q, state, real, 2), "lightllm int64 indices")


def test_quantizer_round_trip_is_lightllm_format():
    # channel 2i low nibble, 2i + 1 high, each code + 7; codes truncated toward zero
    x = torch.tensor([[[0.7, -0.7, 7.0, -7.0, 3.99, -3.99, 1.0, 0.0]]], dtype=torch.float32)
    stored, scale = lightllm_quantize(x, "int4", 8)
    assert float(scale) == 1.0
    assert stored.view(torch.uint8).tolist() == [[[0x77, 0x0E, 0x4A, 0x78]]]


def test_bad_inputs_are_refused():
    q, state, kv_buffer, scale_buffer, _ = lightllm_step([9], "int4", 8, seed=82)
    with pytest.raises(ValueError, match="cache_k: last dim"):
        lightllm.token_decode_attention_flash_decoding(q, state, kv_buffer[:, :2, :16], scale_buffer[:, :2],
                                                       kv_buffer[:, 2:, :16], scale_buffer[:, 2:])
    with pytest.raises(TypeError, match="infer_state"):
        lightllm.token_decode_attention_flash_decoding(q, object(), kv_buffer[:, :2], scale_buffer[:, :2],
                                                       kv_buffer[:, 2:], scale_buffer[:, 2:])
    state.batch_size = 3
    with pytest.raises(ValueError, match="batch_size"):
        lightllm.token_decode_attention_flash_decoding(q, state, kv_buffer[:, :2], scale_buffer[:, :2],
                                                       kv_buffer[:, 2:], scale_buffer[:, 2:])


# ---- prefill over the quantized cache: context_attention_fwd_ppl_int8kv ----

def lightllm_prefill(prefix, new, fmt, group, *, head_dim=64, heads=8, kv_heads=2, dtype=torch.bfloat16, seed=90):
    """A prefill step as LightLLM holds it: each request's prefix (b_ready_cache_len tokens) in the
    layer's buffer through its quantizer, its new tokens' K/V (`kv`, the model dtype) also copied
    into the buffer (as LightLLM does before attention) at the slots after the prefix."""
    g = torch.Generator().manual_seed(seed)
    batch, lens = len(prefix), [p + n for p, n in zip(prefix, new)]
    size = sum(lens) + 30
    width = head_dim // 2 if fmt == "int4" else head_dim
    values = (torch.randn(size, 2 * kv_heads, head_dim, generator=g) * 2).to(dtype)
    stored, scales = lightllm_quantize(values, fmt, group)
    kv_buffer = torch.zeros(size, 2 * kv_heads, width, dtype=torch.int8)
    scale_buffer = torch.full((size, 2 * kv_heads, head_dim // group), float("nan"), dtype=dtype)
    slots = torch.randperm(size, generator=g).to(torch.int32)
    max_reqs, max_len = batch + 2, max(lens) + 3
    req_to_token = torch.full((max_reqs, max_len), 10 ** 6, dtype=torch.int32)  # past the buffer: never read
    b_req_idx = torch.randperm(max_reqs, generator=g)[:batch].to(torch.int32)
    kv = (torch.randn(sum(new), 2 * kv_heads, head_dim, generator=g) * 2).to(dtype)
    at, row = 0, 0
    for b, (p, n) in enumerate(zip(prefix, new)):
        own = slots[at:at + p + n].long()
        req_to_token[b_req_idx[b], :p + n] = own.to(torch.int32)
        kv_buffer[own[:p]], scale_buffer[own[:p]] = stored[own[:p]], scales[own[:p]]
        new_stored, new_scales = lightllm_quantize(kv[row:row + n], fmt, group)
        kv_buffer[own[p:]], scale_buffer[own[p:]] = new_stored, new_scales
        at, row = at + p + n, row + n
    state = SimpleNamespace(batch_size=batch, b_req_idx=b_req_idx, b_seq_len=torch.tensor(lens, dtype=torch.int32),
                            b_ready_cache_len=torch.tensor(prefix, dtype=torch.int32),
                            b_start_loc=torch.tensor([0] + list(torch.tensor(new).cumsum(0)[:-1]), dtype=torch.int32),
                            req_manager=SimpleNamespace(req_to_token_indexs=req_to_token))
    q = torch.randn(sum(new), heads * head_dim, generator=g).to(dtype)  # as the layer passes it
    return q, kv, state, kv_buffer, scale_buffer


def prefill_reference(q, kv, state, kv_buffer, scale_buffer, fmt):
    """float32: each new token over its request's dequantized prefix and, causally, the new K/V."""
    kv_heads, head_dim = kv.shape[1] // 2, kv.shape[2]
    real = lightllm_dequantize(kv_buffer, scale_buffer.nan_to_num(0.0), fmt)
    q = q.float().view(q.shape[0], -1, head_dim)
    out = torch.zeros_like(q)
    row = 0
    for b in range(len(state.b_seq_len)):
        p, total = int(state.b_ready_cache_len[b]), int(state.b_seq_len[b])
        n = total - p
        own = state.req_manager.req_to_token_indexs[state.b_req_idx[b], :p].long()
        keys = torch.cat([real[own], kv[row:row + n].float()])  # [p + n, 2 * kv_heads, D]
        k = keys[:, :kv_heads].repeat_interleave(q.shape[1] // kv_heads, 1)
        v = keys[:, kv_heads:].repeat_interleave(q.shape[1] // kv_heads, 1)
        s = torch.einsum("qhd,khd->hqk", q[row:row + n], k) / head_dim ** 0.5
        allowed = torch.arange(total, device=q.device)[None, :] <= torch.arange(p, total, device=q.device)[:, None]
        out[row:row + n] = torch.einsum("hqk,khd->qhd", s.masked_fill(~allowed, float("-inf")).softmax(-1), v)
        row += n
    return out


@pytest.mark.parametrize("fmt,group,head_dim", [("int8", 8, 64), ("int8", 8, 128), ("int4", 8, 64),
                                                ("int4", 32, 128)])
def test_prefill_over_a_lightllm_cache(fmt, group, head_dim):
    # Prefixes 0, 1, 15, 16, 17 and long; new tokens 1, a few and past a 128-row q block.
    q, kv, state, kv_buffer, scale_buffer = lightllm_prefill([0, 1, 15, 16, 17, 150], [5, 1, 16, 3, 130, 9], fmt,
                                                             group, head_dim=head_dim)
    out = torch.full_like(q, float("nan"))
    got = lightllm.context_attention_fwd_ppl_int8kv(q, kv, state, kv_buffer, scale_buffer, out=out)
    assert got is out and got.shape == q.shape
    ref = prefill_reference(q, kv, state, kv_buffer, scale_buffer, fmt)
    assert_close(out.view(ref.shape), ref, f"lightllm prefill {fmt} g{group} d{head_dim}")


def test_prefill_int64_indices_fp16_3d_q_and_allocated_output():
    q, kv, state, kv_buffer, scale_buffer = lightllm_prefill([40, 0], [7, 20], "int8", 8, dtype=torch.float16, seed=91)
    for name in ("b_req_idx", "b_seq_len", "b_ready_cache_len"):
        setattr(state, name, getattr(state, name).long())
    state.req_manager.req_to_token_indexs = state.req_manager.req_to_token_indexs.long()
    q3 = q.view(q.shape[0], 8, 64)
    out = lightllm.context_attention_fwd_ppl_int8kv(q3, kv, state, kv_buffer, scale_buffer)
    assert out.shape == q3.shape and out.dtype == torch.float16
    assert_close(out, prefill_reference(q, kv, state, kv_buffer, scale_buffer, "int8"), "lightllm prefill int64")


def test_prefill_bad_inputs_are_refused():
    q, kv, state, kv_buffer, scale_buffer = lightllm_prefill([9, 3], [4, 2], "int8", 8, seed=92)
    with pytest.raises(TypeError, match="infer_state"):
        lightllm.context_attention_fwd_ppl_int8kv(q, kv, object(), kv_buffer, scale_buffer)
    with pytest.raises(ValueError, match=r"kv: expected \[tokens, 2 \* kv_heads, head_dim\]"):
        lightllm.context_attention_fwd_ppl_int8kv(q, kv[:, :3], state, kv_buffer, scale_buffer)
    with pytest.raises(ValueError, match=r"cache_kv_scale: expected \[slots, 4, ...\]"):
        lightllm.context_attention_fwd_ppl_int8kv(q, kv, state, kv_buffer, scale_buffer[:, :2])
    with pytest.raises(ValueError, match="k_scale"):  # groups of 4: prefix_prefill's own check
        lightllm.context_attention_fwd_ppl_int8kv(q, kv, state, kv_buffer, scale_buffer.repeat(1, 1, 2))
    bad = SimpleNamespace(**vars(state))
    bad.b_req_idx = state.b_req_idx.clone()
    bad.b_req_idx[1] = 99
    with pytest.raises(ValueError, match="b_req_idx"):
        lightllm.context_attention_fwd_ppl_int8kv(q, kv, bad, kv_buffer, scale_buffer)
    bad = SimpleNamespace(**vars(state))
    bad.b_ready_cache_len = state.b_seq_len + 1
    with pytest.raises(ValueError, match="b_ready_cache_len: every entry must be in"):
        lightllm.context_attention_fwd_ppl_int8kv(q, kv, bad, kv_buffer, scale_buffer)
