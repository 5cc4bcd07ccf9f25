"""aotc.compat's prefill and gated-delta entry points on a GPU, at model sizes, against the float32
references: vllm.context_attention_fwd / chunked_prefill_paged_decode (cases.TOL, every element,
o NaN-poisoned) and fla.chunk_gated_delta_rule / fused_recurrent_gated_delta_rule (chunk_cases.TOL
on max error over max |want|). The CPU versions are tests/cpu/compat/test_vllm_prefill.py and
test_fla.py; these use the artifacts the loader finds (or its JIT fallback)."""
import pytest
import torch

from aotc.compat import fla, vllm
from aotc.kernels.prefix_prefill.reference import prefix_prefill_ref, quantize_fp8_ref
from tests.cpu.compat.test_fla import fla_inputs, reference
from tests.cpu.kernels.gated_delta.chunk_cases import assert_close
from tests.cpu.kernels.prefix_prefill.cases import TOL, assert_matches, make_case

pytestmark = pytest.mark.gpu
DEV = "cuda"


def vllm_args(case, kw, kv_cache_dtype="auto"):
    o = torch.full_like(case["q"], float("nan"))
    one = torch.tensor([1.0], device=DEV)
    k_cache, v_cache = case["k_cache"], case["v_cache"]
    if kv_cache_dtype != "auto":  # vLLM stores fp8 as uint8
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    q_lens = case["query_start_loc"][1:] - case["query_start_loc"][:-1]
    return [case["q"], case["k"], case["v"], o, kv_cache_dtype, k_cache, v_cache, case["block_table"].long(),
            case["query_start_loc"].long(), case["seq_lens"].long(), int(case["seq_lens"].max()), int(q_lens.max()),
            kw.get("k_scale", one), kw.get("v_scale", one)]


@pytest.mark.parametrize("head_dim", [24, 128])
def test_vllm_context_attention_fwd(head_dim):
    case, kw = make_case([0, 17, 1000, 2049], [5, 1, 300, 64], q_heads=16, kv_heads=4, head_dim=head_dim,
                         layout="vllm", dtype=torch.bfloat16, device=DEV, seed=head_dim)
    args = vllm_args(case, kw)
    vllm.context_attention_fwd(*args, sliding_window=700)
    torch.cuda.synchronize()
    assert_matches(args[3], prefix_prefill_ref(**case, **kw, window=700), torch.bfloat16)


def test_vllm_chunked_prefill_paged_decode_mixed_batch():
    # 30 decode rows (one new token) beside 3 prefill chunks, contexts around the block size (16).
    ctx = [0, 15, 16, 17, 4000] * 6 + [0, 33, 2048]
    ql = [1] * 30 + [200, 17, 512]
    case, kw = make_case(ctx, ql, q_heads=32, kv_heads=8, head_dim=128, layout="vllm", dtype=torch.float16,
                         device=DEV, seed=5)
    args = vllm_args(case, kw)
    vllm.chunked_prefill_paged_decode(*args)
    torch.cuda.synchronize()
    assert_matches(args[3], prefix_prefill_ref(**case, **kw), torch.float16)


def test_vllm_chunked_prefill_paged_decode_fp8_cache_sinks_fp8_out():
    case, kw = make_case([0, 100, 3000, 17], [1, 1, 129, 40], q_heads=16, kv_heads=4, head_dim=128, layout="vllm",
                         cache_dtype=torch.float8_e4m3fn, x=8, dtype=torch.bfloat16, device=DEV, seed=6)
    args = vllm_args(case, kw, "fp8")
    args[3] = torch.full(case["q"].shape, float("nan"), device=DEV).to(torch.float8_e4m3fn)
    sinks, out_scale = torch.randn(16, device=DEV) * 2, torch.tensor([0.01], device=DEV)
    vllm.chunked_prefill_paged_decode(*args, sliding_window=1000, output_scale=out_scale, sinks=sinks)
    torch.cuda.synchronize()
    ref = prefix_prefill_ref(**case, **kw, window=1000, sinks=sinks)
    got, want = args[3].float(), quantize_fp8_ref(ref, out_scale).float()
    assert ((got - want).abs() <= 0.125 * want.abs() + TOL[torch.bfloat16] / 0.01).all()


@pytest.mark.parametrize("v_first", [False, True])
def test_fla_chunk_varlen_k128(v_first):
    t, h0, cu = fla_inputs([1, 63, 64, 65, 1000], v_first=v_first, H=2, HV=4, K=128, V=128, dtype=torch.bfloat16,
                           device=DEV, seed=31)
    keep = h0.clone()
    o, ht = fla.chunk_gated_delta_rule(**t, initial_state=h0, output_final_state=True,
                                       use_qk_l2norm_in_kernel=True, cu_seqlens=cu, state_v_first=v_first)
    torch.cuda.synchronize()
    want_o, want_h = reference(t, h0, cu, v_first=v_first)
    assert_close(o, want_o, torch.bfloat16, "o")
    assert_close(ht, want_h, torch.bfloat16, "final_state")
    assert torch.equal(h0, keep)


def test_fla_fused_recurrent_decode_k128():
    t, h0, _ = fla_inputs([2] * 16, equal=True, H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, device=DEV, seed=32)
    o, ht = fla.fused_recurrent_gated_delta_rule(**t, initial_state=h0, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    want_o, want_h = reference(t, h0, None)
    assert_close(o, want_o, torch.bfloat16, "o")
    assert_close(ht, want_h, torch.bfloat16, "final_state")


@pytest.mark.parametrize("entry", ["chunk_gated_delta_rule", "chunk_kda"])
def test_fla_fp32_head_size_100(entry):
    # fp32 through the ops (tf32x3 dots, fp32 workspace), K = V = 100 inside the 128 tiles.
    kda = entry == "chunk_kda"
    t, h0, cu = fla_inputs([1, 63, 64, 65, 1000], H=2, HV=4, K=100, V=100, kda=kda, dtype=torch.float32, device=DEV,
                           seed=33)
    o, ht = getattr(fla, entry)(**t, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                cu_seqlens=cu)
    torch.cuda.synchronize()
    want_o, want_h = reference(t, h0, cu)
    assert o.dtype == torch.float32
    assert_close(o, want_o, torch.float32, "o")
    assert_close(ht, want_h, torch.float32, "final_state")


@pytest.mark.parametrize("entry", ["fused_recurrent_gated_delta_rule", "fused_recurrent_kda"])
def test_fla_decode_rows_gate_and_beta_sigmoid_in_the_kernel(entry):
    # T = 2 rows, fla's in-kernel gate and beta sigmoid: the decode kernel's fused-gate form
    # (compat/_fla_args.forward) against fla's formula applied in float32.
    kda = entry == "fused_recurrent_kda"
    B, T, HV, K = 64, 2, 8, 128
    t, h0, _ = fla_inputs([T] * B, equal=True, kda=kda, H=4, HV=HV, K=K, V=K, dtype=torch.bfloat16, device=DEV, seed=39)
    gen = torch.Generator(device=DEV).manual_seed(39)
    raw_g = torch.randn(*t["g"].shape, generator=gen, device=DEV)
    raw_b = torch.randn(B, T, HV, generator=gen, device=DEV)
    a_log = torch.log(torch.rand(HV, generator=gen, device=DEV) * 15 + 1)
    dt_bias = torch.randn(HV * (K if kda else 1), generator=gen, device=DEV)
    o, ht = getattr(fla, entry)(**{**t, "g": raw_g, "beta": raw_b}, initial_state=h0, output_final_state=True,
                                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
                                use_beta_sigmoid_in_kernel=True)
    torch.cuda.synchronize()
    x = raw_g + (dt_bias.view(HV, K) if kda else dt_bias)
    g = -(a_log.exp().view(HV, 1) if kda else a_log.exp()) * torch.nn.functional.softplus(x)
    packed = {n: v.reshape(1, B * T, *v.shape[2:]) for n, v in {**t, "g": g, "beta": torch.sigmoid(raw_b)}.items()}
    cu = torch.arange(0, (B + 1) * T, T, device=DEV)
    want_o, want_h = reference(packed, h0, cu)
    assert_close(o.reshape(1, B * T, HV, K), want_o, torch.bfloat16, "o")
    assert_close(ht, want_h, torch.bfloat16, "final_state")
