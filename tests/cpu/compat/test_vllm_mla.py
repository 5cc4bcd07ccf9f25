"""aotc.compat.vllm.decode_attention_fwd on its MLA and unequal-head cases, as vLLM 0.33.0 calls it
(is_mla with V a view of the latent cache's first channels, lse allocated in q's dtype, a 3-D
req_to_token [batch, pages, 1]) against the float32 reference: o within cases.assert_close's
tolerance (bf16 2e-2 abs + rel), lse within 2e-3 + 1e-3 |ref| plus its bf16 rounding (2^-8
relative); o and lse poisoned with NaN first."""
import pytest
import torch

from aotc.compat import vllm
from tests.cpu.kernels.mla.cases import assert_close, make_case


def _check_lse(lse, ref):
    assert not lse.isnan().any()
    err = (lse.float() - ref).abs()
    assert (err <= 2e-3 + 5e-3 * ref.abs()).all(), err.max()


@pytest.mark.parametrize("page_size", [1, 16])
def test_is_mla_latent_with_bf16_lse_and_3d_table(page_size):
    case = make_case([33, 65], group=16, page_size=page_size, seed=31)
    o = torch.full((2, 16, 512), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((2, 16), float("nan"), dtype=torch.bfloat16)
    kv = case.k_cache.flatten(0, 1) if page_size == 1 else case.k_cache  # vLLM's token-level buffer
    logits = torch.empty(2, 16, 8, 513)
    table = case.table.long().unsqueeze(-1)  # [batch, pages, 1], as vLLM's test builds req_to_page
    vllm.decode_attention_fwd(case.q, kv, kv[..., :512], o, lse, table, case.seq_lens.long(), logits, 8, 0.05,
                              page_size, is_mla=True)
    ref, ref_lse = case.reference(sm_scale=0.05, return_lse=True)
    assert_close(o, ref, "is_mla")
    _check_lse(lse, ref_lse)


def test_is_mla_ignores_v_buffer_data():
    case = make_case([40], group=16, seed=32)
    o = torch.full((1, 16, 512), float("nan"), dtype=torch.bfloat16)
    junk_v = torch.full((*case.k_cache.shape[:3], 512), float("nan"), dtype=torch.bfloat16)
    vllm.decode_attention_fwd(case.q, case.k_cache, junk_v, o, None, case.table, case.seq_lens, None, 4, 0.05, 16,
                              is_mla=True)
    assert_close(o, case.reference(sm_scale=0.05), "is_mla, V from K")


def test_unequal_heads_fp8_bytes_and_separate_buffers():
    case = make_case([17, 70], d_qk=192, d_v=128, latent=False, fmt="fp8_e4m3", kv_heads=2, group=4, seed=33)
    o = torch.full((2, 8, 128), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((2, 8), float("nan"), dtype=torch.float32)
    ks, vs = case.kwargs["k_scale"].reshape(()), case.kwargs["v_scale"].reshape(())  # vLLM's 0-d scales
    vllm.decode_attention_fwd(case.q, case.k_cache.view(torch.uint8), case.v_cache.view(torch.uint8), o, lse,
                              case.table, case.seq_lens, None, 4, 0.07, 16, k_scale=ks, v_scale=vs)
    ref, ref_lse = case.reference(sm_scale=0.07, return_lse=True)
    assert_close(o, ref, "192/128 fp8")
    _check_lse(lse, ref_lse)


def test_is_mla_bad_v_head_size():
    case = make_case([9], group=16, seed=34)
    o = torch.full((1, 16, 640), float("nan"), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="is_mla: v_buffer's head size 640"):
        vllm.decode_attention_fwd(case.q, case.k_cache, torch.zeros(1, 1, 1, 640), o, None, case.table,
                                  case.seq_lens, None, 4, 0.05, 16, is_mla=True)
    assert o.isnan().all()
