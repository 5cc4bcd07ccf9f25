"""aotc.compat.vllm.context_attention_fwd and chunked_prefill_paged_decode with vLLM's tensor
conventions (x = 8 K packing also for fp8 stored as uint8, int64 index tensors, a preallocated o,
head sizes such as 24) against the float32 reference. Tolerance: cases.TOL (fp16 4e-3, bf16 3e-2,
absolute + relative), every element; o NaN-poisoned first."""
import pytest
import torch

from aotc.compat import vllm
from aotc.kernels.prefix_prefill.reference import prefix_prefill_ref, quantize_fp8_ref
from tests.cpu.kernels.prefix_prefill.cases import TOL, assert_matches, make_case


def _vllm_args(case, kw, kv_cache_dtype="auto"):
    """vLLM's positional arguments for a make_case problem (vllm layout), o NaN-filled."""
    o = torch.full(case["q"].shape, float("nan"), dtype=case["q"].dtype)
    k_scale = kw.get("k_scale", torch.tensor(1.0))
    v_scale = kw.get("v_scale", torch.tensor(1.0))
    k_cache, v_cache = case["k_cache"], case["v_cache"]
    if kv_cache_dtype != "auto":  # vLLM stores fp8 as uint8
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    q_lens = case["query_start_loc"][1:] - case["query_start_loc"][:-1]
    return [case["q"], case["k"], case["v"], o, kv_cache_dtype, k_cache, v_cache, case["block_table"].long(),
            case["query_start_loc"].long(), case["seq_lens"].long(), int(case["seq_lens"].max()), int(q_lens.max()),
            k_scale, v_scale]


@pytest.mark.parametrize("head_dim", [24, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_auto_cache(head_dim, dtype):
    case, kw = make_case([0, 17, 40], [5, 1, 70], head_dim=head_dim, layout="vllm", dtype=dtype, seed=head_dim)
    args = _vllm_args(case, kw)
    assert vllm.context_attention_fwd(*args) is None
    assert_matches(args[3], prefix_prefill_ref(**case, **kw), dtype)


@pytest.mark.parametrize("kv_cache_dtype,cache_dtype", [("fp8", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
def test_fp8_cache_as_uint8_with_x_8(kv_cache_dtype, cache_dtype):
    case, kw = make_case([0, 33, 90], [5, 16, 40], head_dim=40, layout="vllm", cache_dtype=cache_dtype, x=8, seed=3)
    args = _vllm_args(case, kw, kv_cache_dtype)
    assert args[5].dtype == torch.uint8 and args[5].shape[-1] == 8
    vllm.context_attention_fwd(*args, sliding_window=30, sm_scale=0.2)
    assert_matches(args[3], prefix_prefill_ref(**case, **kw, window=30, sm_scale=0.2), torch.float16)


def test_sinks_skip_decode_and_fp8_output():
    case, kw = make_case([5, 40, 0], [1, 20, 9], layout="vllm", dtype=torch.bfloat16, seed=7)
    sinks = torch.randn(4) * 2
    args = _vllm_args(case, kw)
    args[3] = torch.full(case["q"].shape, 3.0).to(torch.float8_e4m3fn)
    out_scale = torch.tensor(0.01)
    vllm.context_attention_fwd(*args, sliding_window=0, skip_decode=True, fp8_out_scale=out_scale, sinks=sinks)
    ref = prefix_prefill_ref(**case, **kw, sinks=sinks)
    rows = list(range(1, case["q"].shape[0]))  # row 0 is request 0's single (decode) token
    assert (args[3][0].float() == 3.0).all()
    got, want = args[3][rows].float(), quantize_fp8_ref(ref[rows], out_scale).float()
    assert ((got - want).abs() <= 0.125 * want.abs() + TOL[torch.bfloat16] / 0.01).all()


def test_unsupported_options_raise():
    case, kw = make_case([10], [3], layout="vllm", seed=9)
    args = _vllm_args(case, kw)
    args32 = list(args)
    args32[0], args32[1], args32[2] = (t.float() for t in args[:3])
    with pytest.raises(NotImplementedError, match="float32"):
        vllm.context_attention_fwd(*args32)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        vllm.context_attention_fwd(*args[:4], "int8", *args[5:])
    with pytest.raises(NotImplementedError, match="causal=False"):
        vllm.context_attention_fwd(*args, causal=False)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):  # vLLM 0.33.0 raises this too
        vllm.context_attention_fwd(args[0], None, None, *args[3:], alibi_slopes=torch.ones(4))
    assert torch.isnan(args[3]).all()  # nothing was launched


def _interleave_v(v_cache, pack):
    nb, h, d, bs = v_cache.shape
    return v_cache.view(nb, h, d, bs // pack, pack).permute(0, 1, 3, 2, 4).contiguous().view(nb, h, d, bs)


@pytest.mark.parametrize("cached_kv", [False, True])
def test_alibi_interleaved_v_cached_kv_and_block_addresses(cached_kv):
    """vLLM 0.33.0's later options: alibi_slopes, interleaved_v_pack_factor, k = v = None (the cache
    holds the new tokens too) and is_block_table_ptr (block addresses in k_cache's pool)."""
    ctx, qlen = [0, 15, 40], [20, 1, 9]
    full = [c + n for c, n in zip(ctx, qlen)]
    case, kw = make_case(full if cached_kv else ctx, qlen, head_dim=24, layout="vllm", block_size=32, seed=10)
    if cached_kv:
        case["seq_lens"] = torch.tensor(full, dtype=torch.int32)
        case["k"] = case["v"] = None
    case["v_cache"] = _interleave_v(case["v_cache"], 8)
    args = _vllm_args(case, kw)
    block_bytes = case["k_cache"].stride(0) * case["k_cache"].element_size()
    args[7] = case["block_table"].long() * block_bytes + case["k_cache"].data_ptr()  # addresses; id 0 is 0
    args[7][case["block_table"] == 0] = 0
    slopes = None if cached_kv else torch.tensor([0.25, 0.125, 0.5, 0.0625])
    vllm.context_attention_fwd(*args, alibi_slopes=slopes, is_block_table_ptr=True, interleaved_v_pack_factor=8)
    ref = prefix_prefill_ref(**case, **kw, alibi_slopes=slopes, v_pack=8)
    assert_matches(args[3], ref, torch.float16)


# chunked_prefill_paged_decode: vLLM's mixed batch, requests with one new token (decode rows) beside
# prefill chunks; contexts 0, block-1, block, block+1 and longer (block_size 16). Its first 14
# positional arguments are context_attention_fwd's, max_input_len named max_query_len.
MIXED_CTX, MIXED_Q = [0, 15, 16, 17, 100, 33], [1, 1, 1, 40, 1, 17]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_chunked_prefill_paged_decode_mixed_batch(dtype):
    case, kw = make_case(MIXED_CTX, MIXED_Q, q_heads=8, kv_heads=2, head_dim=72, layout="vllm", dtype=dtype, seed=11)
    args = _vllm_args(case, kw)
    assert vllm.chunked_prefill_paged_decode(*args) is None
    assert_matches(args[3], prefix_prefill_ref(**case, **kw), dtype)


def test_chunked_prefill_paged_decode_fp8_uint8_window_sinks_fp8_output():
    case, kw = make_case(MIXED_CTX, MIXED_Q, head_dim=64, layout="vllm", cache_dtype=torch.float8_e4m3fn, x=8,
                         dtype=torch.bfloat16, seed=12)
    args = _vllm_args(case, kw, "fp8")
    args[3] = torch.full(case["q"].shape, float("nan")).to(torch.float8_e4m3fn)
    sinks, out_scale = torch.randn(4) * 2, torch.tensor(0.01)
    vllm.chunked_prefill_paged_decode(*args, sliding_window=20, sm_scale=0.15, output_scale=out_scale, sinks=sinks)
    ref = prefix_prefill_ref(**case, **kw, window=20, sm_scale=0.15, sinks=sinks)
    got, want = args[3].float(), quantize_fp8_ref(ref, out_scale).float()
    # one e4m3 step (2^-3 relative) for values the tolerance moves across a rounding boundary
    assert ((got - want).abs() <= 0.125 * want.abs() + TOL[torch.bfloat16] / 0.01).all()


def test_chunked_prefill_paged_decode_unsupported_options_raise():
    case, kw = make_case([10, 3], [1, 4], layout="vllm", seed=13)
    args = _vllm_args(case, kw)
    with pytest.raises(NotImplementedError, match="causal=False"):
        vllm.chunked_prefill_paged_decode(*args, causal=False)
    args32 = list(args)
    args32[0], args32[1], args32[2] = (t.float() for t in args[:3])
    with pytest.raises(NotImplementedError, match="float32"):
        vllm.chunked_prefill_paged_decode(*args32)
    assert torch.isnan(args[3]).all()  # nothing was launched


def test_chunked_prefill_paged_decode_alibi_interleaved_v():
    case, kw = make_case(MIXED_CTX, MIXED_Q, q_heads=4, kv_heads=2, head_dim=64, layout="vllm", dtype=torch.bfloat16,
                         seed=14)
    case["v_cache"] = _interleave_v(case["v_cache"], 8)
    args = _vllm_args(case, kw)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    vllm.chunked_prefill_paged_decode(*args, alibi_slopes=slopes, use_interleaved_v_cache=True)
    assert_matches(args[3], prefix_prefill_ref(**case, **kw, alibi_slopes=slopes, v_pack=8), torch.bfloat16)
