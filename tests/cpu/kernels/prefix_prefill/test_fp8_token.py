"""prefix_prefill over fp8 e4m3 caches with one fp32 scale a token and kv head (vLLM's
FP8_PER_TOKEN_HEAD) on the interpreter, against the float32 reference (codes * scale, then attention).

The kernel reads them through quant.py's int8 word tiles at kv_align 4 (the only variants of this
format): separate code and scale tensors, and vLLM's record [K codes | K scale | V codes | V scale] a
(token, kv head), whose V rows are 4 bytes past a 16-byte boundary. Unused slots hold NaN codes
(0x7f) and NaN scales; outputs start as NaN. Tolerance: cases.TOL (values rounded once to fp16, as int8).
"""
import pytest
import torch

from aotc.kernels.prefix_prefill.reference import prefix_prefill_ref
from aotc.loader.ops import prefix_prefill as pp
from aotc.loader.ops.prefix_prefill import prefix_prefill

from .cases import TOL, assert_matches, make_case

E4M3 = torch.float8_e4m3fn


def quantize(cache):
    """(codes e4m3, scales [.., 1] fp32) of a float cache [blocks, bs, heads, D] whose unused slots are
    NaN: scale = absmax / 448 a (token, head); unused slots keep NaN codes and NaN scales."""
    used = ~cache.isnan().any(-1, keepdim=True)
    x = torch.where(used, cache, torch.zeros(()))
    scale = (x.abs().amax(-1, keepdim=True) / 448.0).clamp_min(1e-6)
    codes = torch.where(used, (x / scale).clamp(-448, 448), torch.full((), float("nan"))).to(E4M3)
    return codes, torch.where(used, scale, torch.full((), float("nan")))


def record(kc, vc, ks, vs):
    """vLLM's buffer [blocks, bs, heads, 2 (D + 4)] bytes holding both, and its (k, v, k_scale, v_scale) views."""
    nb, bs, h, d = kc.shape
    raw = torch.zeros(nb, bs, h, 2 * (d + 4), dtype=torch.uint8, device=kc.device)
    raw[..., :d] = kc.view(torch.uint8)
    raw[..., d + 4:2 * d + 4] = vc.view(torch.uint8)
    f32 = raw.view(torch.float32)
    f32[..., d // 4] = ks[..., 0]
    f32[..., (2 * d + 4) // 4] = vs[..., 0]
    return (raw[..., :d].view(E4M3), raw[..., d + 4:2 * d + 4].view(E4M3), f32[..., d // 4:d // 4 + 1],
            f32[..., (2 * d + 4) // 4:(2 * d + 4) // 4 + 1])


def fp8_case(ctx_lens, q_lens, from_cache, inline, device="cpu", **kw):
    """A case (make_case's, on `device`) whose caches are fp8 e4m3 with per-token scales: separate
    tensors, or inline: vLLM's record. from_cache: the cache holds the new tokens too (k = v = None)."""
    full = [c + n for c, n in zip(ctx_lens, q_lens)] if from_cache else ctx_lens
    case, _ = make_case(full, q_lens, dtype=kw.pop("dtype", torch.float16), cache_dtype=torch.float32, **kw)
    (kc, ks), (vc, vs) = (tuple(t.to(device) for t in quantize(case[n])) for n in ("k_cache", "v_cache"))
    if inline:
        kc, vc, ks, vs = record(kc, vc, ks, vs)
    case = {n: t.to(device) for n, t in case.items()}
    case.update(k_cache=kc, v_cache=vc)
    if from_cache:
        case["seq_lens"] = torch.tensor(full, dtype=torch.int32, device=device)
        case["k"] = case["v"] = None
    return case, dict(kv_format="fp8_e4m3", k_scale=ks, v_scale=vs)


def run(case, kw, **extra):
    out = torch.full(case["q"].shape, float("nan"), dtype=case["q"].dtype)
    got = prefix_prefill(**case, **kw, **extra, out=out)
    assert got is out
    return got, prefix_prefill_ref(**case, **kw, **extra)


@pytest.mark.parametrize("inline", [False, True], ids=["separate", "record"])
@pytest.mark.parametrize("from_cache", [False, True], ids=["new_kv", "from_cache"])
@pytest.mark.parametrize("head_dim,dtype", [(64, torch.float16), (128, torch.bfloat16), (40, torch.float16)])
def test_mixed_batch_at_block_boundaries(inline, from_cache, head_dim, dtype, monkeypatch):
    # contexts 0, 1, block-1, block, block+1 (page 16, key tile 32: 31, 32, 33) and long; new tokens
    # 1, 16, odd, past a 128-row q block
    seen = []
    real = pp.launch_plan
    monkeypatch.setattr(pp, "launch_plan", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    case, kw = fp8_case([0, 1, 15, 16, 17, 31, 33, 300], [1, 16, 7, 33, 5, 2, 3, 130], from_cache, inline,
                        head_dim=head_dim, dtype=dtype, seed=head_dim + 2 * from_cache + inline)
    got, ref = run(case, kw)
    assert_matches(got, ref, dtype)
    assert [(a["kv"], a["scales"], a.get("kv_align")) for a, _, _ in seen] == [("fp8_e4m3", "token", 4)]


def test_head_major_cache():
    # [blocks, kv_heads, block_size, D] codes and scales: the op's (block, token, head) strides
    case, kw = fp8_case([33, 0, 70], [5, 17, 2], False, False, head_dim=64, seed=35)
    case["k_cache"], case["v_cache"] = (case[n].transpose(1, 2).contiguous() for n in ("k_cache", "v_cache"))
    kw["k_scale"], kw["v_scale"] = (kw[n].transpose(1, 2).contiguous() for n in ("k_scale", "v_scale"))
    got, ref = run(case, kw, kv_layout="hnd")
    assert_matches(got, ref, torch.float16)


def test_window_sinks_and_gqa():
    case, kw = fp8_case([70, 5], [40, 9], True, True, head_dim=64, q_heads=8, kv_heads=2, seed=31)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0, 0.1, -0.3, 0.7])
    got, ref = run(case, kw, window=37, sinks=sinks, sm_scale=0.2)
    assert_matches(got, ref, torch.float16)


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_16_bit_scales(scale_dtype):
    # k_scale / v_scale in fp16 or bf16 (the op's scale dtypes for int8 too), separate tensors
    case, kw = fp8_case([40, 3], [9, 33], False, False, head_dim=64, seed=36)
    kw["k_scale"], kw["v_scale"] = kw["k_scale"].to(scale_dtype), kw["v_scale"].to(scale_dtype)
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.float16)


def test_scales_matter_per_token():
    # each token's scale is read: the same codes under one scale per tensor give another answer
    case, kw = fp8_case([60], [20], True, False, head_dim=64, seed=32)
    kw["k_scale"] = kw["k_scale"] * torch.linspace(0.5, 2.0, kw["k_scale"].shape[1])[None, :, None, None]
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.float16)
    flat = dict(kw, k_scale=kw["k_scale"].nan_to_num().amax().reshape(1), v_scale=kw["v_scale"].nan_to_num().amax().reshape(1))
    assert (prefix_prefill_ref(**case, **flat) - ref).abs().max() > 10 * TOL[torch.float16]


def test_refusals():
    case, kw = fp8_case([20], [5], True, True, head_dim=64, seed=33)
    with pytest.raises(NotImplementedError, match="softcap with an fp8_e4m3 cache with per-token scales"):
        prefix_prefill(**case, **kw, softcap=5.0)
    with pytest.raises(ValueError, match="fp8_e4m3 for per-token scales"):
        prefix_prefill(**{**case, "k_cache": case["k_cache"].view(torch.uint8), "v_cache": case["v_cache"].view(torch.uint8)},
                       **{**kw, "kv_format": "fp8_e5m2"})
    small, skw = fp8_case([20], [5], True, False, head_dim=32, seed=34)
    with pytest.raises(ValueError, match="head_dim"):
        prefix_prefill(**small, **skw)
    raw = torch.zeros(case["k_cache"].shape[:-1] + (2 * 64 + 6,), dtype=torch.uint8)  # rows 2 bytes off 4
    odd = raw[..., :64].view(E4M3), raw[..., 66:130].view(E4M3)
    with pytest.raises(ValueError, match="k_cache's strides"):
        prefix_prefill(**{**case, "k_cache": odd[0], "v_cache": odd[1]}, **kw)
    shifted = torch.zeros(case["k_cache"].numel() + 2, dtype=torch.uint8)[2:].view(E4M3).view(case["k_cache"].shape)
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        prefix_prefill(**{**case, "k_cache": shifted, "v_cache": case["v_cache"].contiguous()}, **kw)
