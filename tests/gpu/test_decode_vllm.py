"""decode on a GPU over vLLM 0.33's per-token-head caches (its inline layout: V 4 bytes past a
16-byte boundary, scales between K and V) and with its score modifiers, at batch 32 and contexts
around pages up to 4K + 1, against the float32 reference over the dequantized values; outputs NaN
first. Tolerance: 2e-2 absolute and relative (bf16 output), as the CPU tests."""
import pytest
import torch

from aotc import loader
from aotc.kernels.decode import reference as R
from tests.cpu.kernels.decode.test_vllm_caches import vllm_inline_cache

DEV = "cuda"
LENS = [1, 15, 16, 17, 4097, 100, 2048, 3000] * 4  # batch 32


def _problem(head_dim, seed=0, kv_heads=8, group=4, page=16):
    g = torch.Generator().manual_seed(seed)
    pages_per = -(-max(LENS) // page)
    pages = len(LENS) * pages_per + 1
    table = torch.randperm(pages, generator=g)[: len(LENS) * pages_per].view(len(LENS), pages_per).to(torch.int32)
    k = torch.randn(pages, page, kv_heads, head_dim, generator=g)
    v = torch.randn(pages, page, kv_heads, head_dim, generator=g)
    q = torch.randn(len(LENS), kv_heads * group, head_dim, generator=g).to(torch.bfloat16)
    return q, k, v, table, torch.tensor(LENS, dtype=torch.int32)


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mod", [False, True], ids=["plain", "softcap_alibi"])
def test_per_token_head_inline_layout_at_length(fmt, head_dim, mod):
    q, k, v, table, lens = (t.to(DEV) for t in _problem(head_dim, seed=head_dim))
    kc, vc, ks, vs, k_real, v_real = vllm_inline_cache(k, v, fmt)  # views of one buffer on the GPU
    assert vc.data_ptr() % 16 == 4
    opts = dict(softcap=10.0, alibi_slopes=torch.rand(q.shape[1], device=DEV) / 64,
                alibi_sqrt=head_dim == 64) if mod else {}
    want = R.decode_reference(q, k_real, v_real, table, lens, **opts)
    out = torch.full_like(q, float("nan"))
    loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format=fmt, out=out, **opts)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_e5m2"])
def test_score_mods_at_length(fmt):
    q, k, v, table, lens = _problem(128, seed=3)
    q = q * 4
    if fmt == "bf16":
        kc, vc, kw = k.bfloat16(), v.bfloat16(), {}
        k_real, v_real = kc.float(), vc.float()
    else:
        kc, vc = k.to(torch.float8_e5m2), v.to(torch.float8_e5m2)
        k_real, v_real = kc.float() * 0.5, vc.float() * 0.25
        kw = dict(k_scale=torch.tensor([0.5]), v_scale=torch.tensor([0.25]))
    slopes = torch.tensor([2.0 ** -(i % 8 + 1) for i in range(q.shape[1])])
    want = R.decode_reference(q, k_real, v_real, table, lens, softcap=3.0, alibi_slopes=slopes, window=1000)
    args = [t.to(DEV) for t in (q, kc, vc, table, lens)]
    out = torch.full_like(args[0], float("nan"))
    loader.decode(*args, out=out, softcap=3.0, alibi_slopes=slopes.to(DEV), window=1000,
                  **{n: t.to(DEV) for n, t in kw.items()})
    torch.testing.assert_close(out.float().cpu(), want, atol=2e-2, rtol=2e-2)
