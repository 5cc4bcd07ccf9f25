"""Decode over vLLM 0.33's per-token-head caches and with its score modifiers, on the interpreter.

vLLM's Triton backend stores, per (token, kv head), [K codes (D) | K scale (fp32) | V codes (D) |
V scale (fp32)] (vllm/v1/attention/backends/triton_attn.py, _ensure_scale_caches): V starts 4
bytes after a D-byte run, so it is 4-byte aligned and never 16. `vllm_inline_cache` builds that
buffer; decode reads it through strided views (kv_align 4 binaries). Tolerance: 2e-2 absolute and
relative against the float32 reference over the dequantized values (bf16 output); outputs start NaN.
"""

import pytest
import torch

from aotc import loader
from aotc.kernels.decode import reference as R

QMAX = {"int8": 127.0, "fp8_e4m3": 448.0}
CODES = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}


def vllm_inline_cache(k, v, fmt):
    """k, v [pages, page_size, kv_heads, D] float -> (k view, v view, k_scale, v_scale [.., 1] fp32
    views, k_real, v_real) over one buffer in vLLM's per-token-head layout, quantized as vLLM's
    cache writer does (scale = max(absmax / qmax, 1e-6); int8 rounds half away from zero), on k's
    device."""
    pages, bs, heads, d = k.shape
    raw = torch.zeros(pages, bs, heads, 2 * (d + 4), dtype=torch.uint8, device=k.device)
    f32 = raw.view(torch.float32)
    views, reals = [], []
    for x, off in ((k, 0), (v, d + 4)):
        scale = (x.float().abs().amax(-1) / QMAX[fmt]).clamp_min(1e-6)
        y = x.float() / scale[..., None]
        if fmt == "int8":
            codes = torch.where(y >= 0, y + 0.5, y - 0.5).trunc().clamp(-128, 127).to(torch.int8)
        else:
            codes = y.clamp(-448, 448).to(torch.float8_e4m3fn)
        raw[..., off:off + d] = codes.view(torch.uint8)
        f32[..., (off + d) // 4] = scale
        views.append((raw[..., off:off + d].view(CODES[fmt]), f32[..., (off + d) // 4:(off + d) // 4 + 1]))
        reals.append(codes.float() * scale[..., None])
    (kc, ks), (vc, vs) = views
    return kc, vc, ks, vs, reals[0], reals[1]


def _problem(lens, head_dim, kv_heads=2, group=4, page_size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    max_pages = max(1, max(-(-n // page_size) for n in lens))
    pages = len(lens) * max_pages + 2
    table = torch.randperm(pages, generator=g)[: len(lens) * max_pages].view(len(lens), max_pages).to(torch.int32)
    k = torch.randn(pages, page_size, kv_heads, head_dim, generator=g)
    v = torch.randn(pages, page_size, kv_heads, head_dim, generator=g)
    q = torch.randn(len(lens), kv_heads * group, head_dim, generator=g).to(torch.bfloat16)
    return q, k, v, table, torch.tensor(lens, dtype=torch.int32)


LENS = [1, 15, 16, 17, 100]  # page 16: 1, block - 1, block, block + 1, long (several pages, past a 64-token tile)


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_per_token_head_inline_layout(fmt, head_dim):
    q, k, v, table, lens = _problem(LENS, head_dim, seed=head_dim)
    kc, vc, ks, vs, k_real, v_real = vllm_inline_cache(k, v, fmt)
    assert vc.data_ptr() % 16 == 4 and kc.stride(2) % 16 == 8  # the layout the kv_align 4 binaries exist for
    out = torch.full_like(q, float("nan"))
    loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format=fmt, out=out)
    want = R.decode_reference(q, k_real, v_real, table, lens)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "int8"])
@pytest.mark.parametrize("mod", ["softcap", "alibi", "alibi_sqrt", "both"])
def test_score_mods(fmt, mod):
    q, k, v, table, lens = _problem(LENS, 64, seed=7)
    q = q * 4  # scores of a few units, so that a softcap of 2 bends them
    softcap = 2.0 if mod in ("softcap", "both") else 0.0
    slopes = torch.tensor([2.0 ** -(i + 1) for i in range(q.shape[1])]) if mod != "softcap" else None
    kw = {}
    if fmt == "bf16":
        kc, vc, k_real, v_real = k.bfloat16(), v.bfloat16(), k.bfloat16().float(), v.bfloat16().float()
    elif fmt == "fp8_e4m3":
        kc, vc = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        k_real, v_real = kc.float() * 0.5, vc.float() * 0.5
        kw = dict(k_scale=torch.tensor([0.5]), v_scale=torch.tensor([0.5]))
    else:
        kc, vc, ks, vs, k_real, v_real = vllm_inline_cache(k, v, "int8")
        kw = dict(k_scale=ks, v_scale=vs)
    out = torch.full_like(q, float("nan"))
    loader.decode(q, kc, vc, table, lens, out=out, softcap=softcap, alibi_slopes=slopes,
                  alibi_sqrt=mod == "alibi_sqrt", **kw)
    want = R.decode_reference(q, k_real, v_real, table, lens, softcap=softcap, alibi_slopes=slopes,
                              alibi_sqrt=mod == "alibi_sqrt")
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    plain = R.decode_reference(q, k_real, v_real, table, lens)
    assert (want - plain).abs().max() > 0.1  # the modifier changes the answer these tolerances check


def test_score_mod_refusals():
    q, k, v, table, lens = _problem([5], 64)
    kc = k.to(torch.int8)
    scale = torch.ones(*k.shape[:-1], 8)  # groups of 8: no "mod" binary
    with pytest.raises(NotImplementedError, match="softcap / alibi_slopes"):
        loader.decode(q, kc, kc, table, lens, k_scale=scale, v_scale=scale, softcap=5.0)
    with pytest.raises(ValueError, match="alibi_slopes"):
        loader.decode(q, k.bfloat16(), v.bfloat16(), table, lens, alibi_slopes=torch.ones(3))
    with pytest.raises(ValueError, match="softcap"):
        loader.decode(q, k.bfloat16(), v.bfloat16(), table, lens, softcap=-1.0)
    with pytest.raises(ValueError, match="alibi_sqrt"):
        loader.decode(q, k.bfloat16(), v.bfloat16(), table, lens, alibi_sqrt=True)


def test_fp8_per_token_e5m2_refused():
    q, k, v, table, lens = _problem([5], 64)
    kc = k.to(torch.float8_e5m2)
    scale = torch.ones(*k.shape[:-1], 1)
    with pytest.raises(NotImplementedError, match="fp8_e5m2"):
        loader.decode(q, kc, kc, table, lens, k_scale=scale, v_scale=scale)


def test_unaligned_rows_refused():
    # a per-token int8 cache whose rows are 2-byte aligned only: no binary reads it with softcap
    q, k, v, table, lens = _problem([5], 64)
    raw = torch.zeros(*k.shape[:-1], 66, dtype=torch.int8)
    kc = raw[..., :64]
    scale = torch.ones(*k.shape[:-1], 1)
    with pytest.raises(ValueError, match="4-byte"):
        loader.decode(q, kc, kc, table, lens, k_scale=scale, v_scale=scale, softcap=3.0)


def test_host_checks_ignore_the_default_device():
    # vLLM's tests set torch's default device to CUDA: decode's and prefix_prefill's host-side
    # value checks build their index tensors on the CPU explicitly (a meta default stands in here)
    q, k, v, table, lens = _problem([5, 17], 64)
    kc, vc, ks, vs, k_real, v_real = vllm_inline_cache(k, v, "int8")
    with torch.device("meta"):
        out = loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format="int8")
    torch.testing.assert_close(out.float(), R.decode_reference(q, k_real, v_real, table, lens), atol=2e-2, rtol=2e-2)


def _shifted_by_4(kc, vc, ks, vs):
    """The same codes and scales one 4-byte word further into a larger buffer: K 4 bytes past an
    8-byte boundary, so no longer vLLM's record as kv_align 8 reads it (kv_align 4 does)."""
    pages, bs, heads, d = kc.shape
    raw = torch.zeros(pages, bs, heads, 2 * (d + 4) + 4, dtype=torch.uint8, device=kc.device)  # rows: 2 d + 12
    rec = raw[..., 4:4 + 2 * (d + 4)]
    rec[..., :d] = kc.view(torch.uint8)
    rec[..., d + 4:2 * d + 4] = vc.view(torch.uint8)
    f32 = raw.view(torch.float32)
    f32[..., 1 + d // 4] = ks[..., 0]
    f32[..., 1 + (2 * d + 4) // 4] = vs[..., 0]
    return (rec[..., :d].view(kc.dtype), rec[..., d + 4:2 * d + 4].view(vc.dtype),
            f32[..., 1 + d // 4:2 + d // 4], f32[..., 1 + (2 * d + 4) // 4:2 + (2 * d + 4) // 4])


def _page_padded(vc):
    """V's record copied into a buffer whose pages are 16 bytes longer: V still 4 bytes past an
    8-byte boundary with strides multiples of 8, but its page stride no longer K's."""
    pages, bs, heads, d = vc.shape
    row = vc.stride(2) * vc.element_size()
    raw = torch.zeros(pages, bs * heads * row + 16, dtype=torch.uint8, device=vc.device)
    rec = raw[:, :bs * heads * row].view(pages, bs, heads, row)
    off = vc.storage_offset() % vc.stride(2) * vc.element_size()
    rec[..., off:off + d] = vc.view(torch.uint8)
    return rec[..., off:off + d].view(vc.dtype)


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mod", [False, True])
@pytest.mark.parametrize("layout", ["record", "shifted", "v_apart"])
def test_kv_align8_on_vllms_record(fmt, head_dim, mod, layout, monkeypatch):
    # vLLM's record takes the kv_align 8 binaries (K 8 bytes at a time, V 4, both at K's row
    # offsets); the same values 4 bytes further on, or V with strides of its own, take kv_align 4
    from aotc.loader.ops import decode as D

    chosen = []
    real = D._kv_align
    monkeypatch.setattr(D, "_kv_align", lambda *a: chosen.append(real(*a)) or chosen[-1])
    D._plans.clear()
    q, k, v, table, lens = _problem(LENS, head_dim, seed=head_dim + 1)
    q = q * 4 if mod else q
    kc, vc, ks, vs, k_real, v_real = vllm_inline_cache(k, v, fmt)
    if layout == "shifted":
        kc, vc, ks, vs = _shifted_by_4(kc, vc, ks, vs)
    elif layout == "v_apart":
        vc = _page_padded(vc)
    kw = dict(softcap=2.0, alibi_slopes=torch.tensor([2.0 ** -(i + 1) for i in range(q.shape[1])])) if mod else {}
    out = torch.full_like(q, float("nan"))
    try:
        loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format=fmt, out=out, **kw)
    finally:
        D._plans.clear()
    assert chosen == [8 if layout == "record" else 4]
    assert layout != "v_apart" or (vc.data_ptr() % 8 == 4 and vc.stride(0) != kc.stride(0))
    want = R.decode_reference(q, k_real, v_real, table, lens, **kw)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


def test_kv_align8_plan_holds_later_calls_to_the_record():
    # a plan made on vLLM's record refuses a later call whose V is not 4 bytes past an 8-byte boundary
    from aotc.loader.ops.split_merge import SplitMerge

    q, k, v, table, lens = _problem([5], 64)
    kc, vc, ks, vs, _, _ = vllm_inline_cache(k, v, "int8")
    SplitMerge.check_halfword.__get__(type("P", (), {"halfword": 7})())(kc.data_ptr(), vc.data_ptr())
    with pytest.raises(ValueError, match="kv_align 8"):
        SplitMerge.check_halfword.__get__(type("P", (), {"halfword": 7})())(kc.data_ptr(), vc.data_ptr() + 4)
    with pytest.raises(ValueError, match="kv_align 8"):
        SplitMerge.check_halfword.__get__(type("P", (), {"halfword": 7})())(kc.data_ptr() + 4, vc.data_ptr())
