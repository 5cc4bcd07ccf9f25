"""aotc.compat.vllm.decode_attention_fwd with vLLM's tensor conventions (built as vLLM's Triton
backend builds them) against the float32 reference: o within cases.assert_close's tolerance
(bf16 2e-2 abs + rel, fp16 5e-3), lse (natural log, fp32) within 2e-3 + 1e-3 |ref|, every element;
o and lse poisoned with NaN first."""
import math

import pytest
import torch

from aotc.compat import vllm
from aotc.kernels.decode import reference as R
from tests.cpu.kernels.decode.cases import assert_close


def vllm_inputs(lens, *, dtype=torch.bfloat16, heads=8, kv_heads=2, head_dim=64, page_size=16, num_kv_splits=4,
                cache="bf16", token_level=False, seed=70):
    """Inputs as vLLM's Triton decode takes them: a paged cache [num_blocks, page_size, kv_heads, D]
    (or token slots [tokens, kv_heads, D] at page_size 1), a block table [batch, max_blocks] int32,
    seq lens int32, the attn_logits workspace, o and lse."""
    g = torch.Generator().manual_seed(seed)
    batch = len(lens)
    max_blocks = max(1, max(-(-n // page_size) for n in lens))
    blocks = batch * max_blocks + 2
    k = torch.randn(blocks, page_size, kv_heads, head_dim, generator=g)
    v = torch.randn(blocks, page_size, kv_heads, head_dim, generator=g)
    kw = {}
    if cache == "fp8":  # vLLM's fp8 cache: e4m3 bytes in uint8 storage, one scale each
        ks, vs = torch.tensor([0.8]), torch.tensor([1.3])
        k_store = (k / ks).to(torch.float8_e4m3fn)
        v_store = (v / vs).to(torch.float8_e4m3fn)
        k_real, v_real = k_store.float() * ks, v_store.float() * vs
        k_buf, v_buf = k_store.view(torch.uint8), v_store.view(torch.uint8)
        kw = dict(k_scale=ks, v_scale=vs)
    else:
        k_buf, v_buf = k.to(dtype), v.to(dtype)
        k_real, v_real = k_buf.float(), v_buf.float()
    table = torch.randperm(blocks, generator=g)[: batch * max_blocks].view(batch, max_blocks).to(torch.int32)
    if token_level:
        assert page_size == 1
        k_buf, v_buf = k_buf[:, 0], v_buf[:, 0]
    q = torch.randn(batch, heads, head_dim, generator=g).to(dtype)
    seq = torch.tensor(lens, dtype=torch.int32)
    attn_logits = torch.empty(batch, heads, num_kv_splits, head_dim + 1, dtype=torch.float32)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((batch, heads), float("nan"))
    return q, k_buf, v_buf, o, lse, table, seq, attn_logits, kw, (k_real, v_real)


def check(q, o, lse, real, table, seq, sm_scale):
    ref, ref_lse = R.decode_reference(q, real[0], real[1], table, seq, sm_scale=sm_scale, return_lse=True)
    assert_close(o, ref, "vllm o")
    empty = ref_lse == float("-inf")
    assert torch.equal(lse == float("-inf"), empty)
    assert ((lse[~empty] - ref_lse[~empty]).abs() <= 2e-3 + 1e-3 * ref_lse[~empty].abs()).all()


@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_bf16_cache_writes_o_and_lse(page_size):
    q, kb, vb, o, lse, table, seq, logits, kw, real = vllm_inputs([0, 1, 127, 128, 129, 300], page_size=page_size)
    sm_scale = 1.0 / math.sqrt(64)
    vllm.decode_attention_fwd(q, kb, vb, o, lse, table, seq, logits, 4, sm_scale, page_size, **kw)
    check(q, o, lse, real, table, seq, sm_scale)
    assert (o[0] == 0).all()  # vLLM would write 0/0 here


def test_token_level_buffer_with_int64_indices_and_scaled_softmax():
    # page_size 1 with the 3-D [tokens, kv_heads, D] buffer: req_to_token holds token slots; vLLM's
    # metadata in int64 is converted to int32.
    q, kb, vb, o, lse, table, seq, logits, kw, real = vllm_inputs([5, 70, 1], page_size=1, token_level=True,
                                                                   dtype=torch.float16, heads=4, kv_heads=4)
    assert kb.dim() == 3
    vllm.decode_attention_fwd(q, kb, vb, o, lse, table.long(), seq.long(), logits, 8, 0.3)
    check(q, o, lse, (real[0], real[1]), table, seq, 0.3)


def test_fp8_cache_in_uint8_storage_with_scales():
    q, kb, vb, o, lse, table, seq, logits, kw, real = vllm_inputs([33, 64, 200], cache="fp8", seed=71)
    assert kb.dtype == torch.uint8
    vllm.decode_attention_fwd(q, kb, vb, o, lse, table, seq, logits, 4, 0.125, 16, 0.0, **kw)
    check(q, o, lse, real, table, seq, 0.125)


def test_lse_none_writes_only_o():
    q, kb, vb, o, _, table, seq, logits, kw, real = vllm_inputs([9, 40], seed=72)
    vllm.decode_attention_fwd(q, kb, vb, o, None, table, seq, logits, 4, 0.125, 16)
    assert_close(o, R.decode_reference(q, real[0], real[1], table, seq, sm_scale=0.125), "lse None")


def test_logit_cap_is_not_implemented():
    q, kb, vb, o, lse, table, seq, logits, kw, real = vllm_inputs([9], seed=73)
    with pytest.raises(NotImplementedError, match="logit_cap"):
        vllm.decode_attention_fwd(q, kb, vb, o, lse, table, seq, logits, 4, 0.125, 16, 30.0)
    assert o.isnan().all() and lse.isnan().all()


def test_bad_inputs_name_the_argument():
    q, kb, vb, o, lse, table, seq, logits, kw, real = vllm_inputs([9, 20], seed=74)
    with pytest.raises(ValueError, match="k_buffer: pages of 16 tokens"):
        vllm.decode_attention_fwd(q, kb, vb, o, lse, table, seq, logits, 4, 0.1, 8)
    with pytest.raises(TypeError, match="req_to_token: dtype"):
        vllm.decode_attention_fwd(q, kb, vb, o, lse, table.float(), seq, logits, 4, 0.1, 16)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 900 is outside"):
        vllm.decode_attention_fwd(q, kb, vb, o, lse, table, seq * 100, logits, 4, 0.1, 16)
    with pytest.raises(TypeError, match="lse must be a floating-point"):
        vllm.decode_attention_fwd(q, kb, vb, o, lse.int(), table, seq, logits, 4, 0.1, 16)
    assert o.isnan().all()
