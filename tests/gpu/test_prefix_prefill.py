"""prefix_prefill on a GPU (AOT binary, or the JIT fallback where none is built) against the
float32 reference: the CPU suite's cases at larger sizes, plus the fp8 encoder bit for bit.

Same poisoning as the CPU tests (cases.py): NaN in unused pages and slots, NaN outputs.
"""
import os

import pytest
import torch
import triton
import triton.language as tl

from aotc.kernels.prefix_prefill.kernel import _fp32_to_e4m3_bits
from aotc.kernels.prefix_prefill.reference import FP8_E4M3_MAX, prefix_prefill_ref, quantize_fp8_ref
from aotc.loader.ops.prefix_prefill import prefix_prefill
from tests.cpu.kernels.prefix_prefill.cases import FP8, TOL, assert_matches, make_case

pytestmark = pytest.mark.gpu
DEV = "cuda"


def run(case, kw, **extra):
    out = torch.full(case["q"].shape, float("nan"), dtype=case["q"].dtype, device=DEV)
    got = prefix_prefill(**case, **kw, **extra, out=out, validate=True)
    torch.cuda.synchronize()
    ref = prefix_prefill_ref(**case, **kw, **{k: v for k, v in extra.items() if k in ("sm_scale", "window", "sinks")})
    return got, ref


@pytest.mark.parametrize("layout", ["nhd", "vllm"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 48, 128])
def test_mixed_batch(layout, dtype, block_size):
    ctx = [0, 1, block_size - 1, block_size, block_size + 1, 1000, 3000]
    qlen = [1, 16, 7, 129, 5, 300, 64]
    case, kw = make_case(ctx, qlen, q_heads=8, kv_heads=2, head_dim=128, block_size=block_size, dtype=dtype,
                         layout=layout, device=DEV, seed=block_size)
    got, ref = run(case, kw)
    assert_matches(got, ref, dtype)


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("q_heads,kv_heads", [(4, 4), (64, 1)])
def test_head_dims_and_groups(head_dim, q_heads, kv_heads):
    case, kw = make_case([0, 33, 500], [70, 1, 200], q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                         block_size=32, dtype=torch.bfloat16, device=DEV, seed=head_dim)
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.bfloat16)


def test_long_context():
    case, kw = make_case([16384], [1024], q_heads=4, kv_heads=1, head_dim=128, block_size=16,
                         dtype=torch.bfloat16, device=DEV, seed=5)
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.bfloat16)


@pytest.mark.parametrize("window", [1, 17, 128, 1000])
@pytest.mark.parametrize("layout", ["nhd", "vllm"])
def test_window_and_sinks(window, layout):
    case, kw = make_case([0, 40, 2000], [50, 300, 200], q_heads=8, kv_heads=2, head_dim=64, block_size=16,
                         layout=layout, device=DEV, seed=window)
    sinks = torch.randn(8, device=DEV) * 2
    for extra in ({"window": window}, {"window": window, "sinks": sinks}, {"sinks": sinks}):
        got, ref = run(case, kw, **extra)
        assert_matches(got, ref, torch.float16)


@pytest.mark.parametrize("window,lookback,clamp", [(128, 0, True), (512, 3, False), (None, -1, False)])
@pytest.mark.parametrize("layout", ["nhd", "vllm"])
def test_chunks_and_bidirectional_ranges(window, lookback, clamp, layout):
    # vLLM's unified-attention masks with the cache holding every token: chunked local attention
    # and multimodal ranges (one past the first 128-row q block, one from the context, an unused one)
    ctx, new = [0, 300, 37], [384, 96, 700]
    full = [c + n for c, n in zip(ctx, new)]
    case, kw = make_case(full, new, q_heads=8, kv_heads=2, head_dim=128, block_size=16, layout=layout,
                         dtype=torch.bfloat16, device=DEV, seed=lookback + 7)
    case["seq_lens"] = torch.tensor(full, dtype=torch.int32, device=DEV)
    case["k"] = case["v"] = None
    mm = torch.tensor([[[32, 351], [0, 0]], [[160, 287], [390, 395]], [[37, 600], [650, 730]]], dtype=torch.int32,
                      device=DEV)
    opts = dict(window=window, chunk_lookback=lookback, mm_prefix_range=mm, mm_clamp=clamp)
    out = torch.full(case["q"].shape, float("nan"), dtype=torch.bfloat16, device=DEV)
    prefix_prefill(**case, **kw, **opts, out=out, validate=True)
    torch.cuda.synchronize()
    assert_matches(out, prefix_prefill_ref(**case, **kw, **opts), torch.bfloat16)


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("layout", ["nhd", "vllm"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_cache(cache_dtype, layout, dtype):
    case, kw = make_case([0, 15, 33, 1200], [5, 16, 1, 300], q_heads=8, kv_heads=2, head_dim=128,
                         layout=layout, cache_dtype=cache_dtype, dtype=dtype, device=DEV, seed=7)
    got, ref = run(case, kw, window=700)
    assert_matches(got, ref, dtype)


def test_fp8_output_and_skip_decode():
    case, kw = make_case([5, 400, 0, 17], [1, 200, 1, 90], q_heads=8, kv_heads=4, head_dim=128, device=DEV, seed=9)
    out_scale = torch.tensor([0.005], device=DEV)
    sentinel = torch.tensor(3.0).to(torch.float8_e4m3fn)
    out = torch.full(case["q"].shape, 3.0, device=DEV).to(torch.float8_e4m3fn)
    prefix_prefill(**case, **kw, out_scale=out_scale, skip_decode=True, out=out)
    ref = prefix_prefill_ref(**case, **kw)
    starts = case["query_start_loc"].tolist()
    decode = [starts[0], starts[2]]
    assert (out[decode].view(torch.uint8) == sentinel.view(torch.uint8).item()).all()
    rows = [r for r in range(case["q"].shape[0]) if r not in decode]
    got, want = out[rows].float(), quantize_fp8_ref(ref[rows], out_scale).float()
    assert ((got - want).abs() <= 0.125 * want.abs() + TOL[torch.float16] / 0.005).all()
    assert got.abs().max() == FP8_E4M3_MAX


@triton.jit
def _encode(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    tl.store(Y + offs, _fp32_to_e4m3_bits(x).to(tl.uint8), mask=offs < n)


def test_fp8_encoder_matches_torch_bit_for_bit():
    # Every e4m3 value, the midpoints between neighbours (ties), their fp32 neighbours, and beyond 448.
    codes = torch.arange(256, dtype=torch.uint8, device=DEV).view(torch.float8_e4m3fn).float()
    codes = codes[codes.isfinite()].unique()
    mids = (codes[1:] + codes[:-1]) / 2
    x = torch.cat([codes, mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1),
                   torch.randn(100000, device=DEV) * 50, torch.tensor([500.0, -1e6, 448.0, 464.0], device=DEV)])
    y = torch.empty(x.shape, dtype=torch.uint8, device=DEV)
    _encode[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    want = x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(y, want)


_MEMCHECK = """
import torch
from tests.cpu.kernels.prefix_prefill.cases import make_case
from aotc.loader.ops.prefix_prefill import prefix_prefill
for layout, cdt, window in [("nhd", None, None), ("vllm", None, 20), ("nhd", torch.float8_e4m3fn, 100),
                            ("vllm", torch.float8_e5m2, None)]:
    # The last request has the widest row and a 15-page context: a 64-key tail tile that read
    # block-table entries unmasked would read past the table's own allocation.
    case, kw = make_case([16, 0, 47, 64, 240], [5, 9, 1, 30, 3], layout=layout, cache_dtype=cdt, device="cuda")
    prefix_prefill(**case, **kw, window=window, out_scale=torch.tensor([0.01], device="cuda"))
    torch.cuda.synchronize()
for extra, window in [(dict(kv_format="int8", scales="token", layout="nhd"), None),
                      (dict(kv_format="int4", scales="channel", layout="hnd"), 20),
                      (dict(kv_format="int8", scales="group", group=8, layout="hnd"), 30),
                      (dict(layout="vllm", head_dim=40, cache_dtype=torch.float8_e5m2, x=8), None)]:
    case, kw = make_case([16, 0, 47, 64, 240], [5, 9, 1, 30, 3], device="cuda", **extra)
    prefix_prefill(**case, **kw, window=window)
    torch.cuda.synchronize()
"""


def test_no_out_of_bounds_access_under_memcheck():
    # Seen on an H100: 0 errors; with the block-table gather unmasked, memcheck stops the launch.
    import os
    import shutil
    import subprocess
    import sys

    tool = shutil.which("compute-sanitizer")
    if tool is None:
        pytest.skip("compute-sanitizer is not on PATH")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")  # one allocation per tensor: exact bounds
    res = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-c", _MEMCHECK],
                         cwd=root, env=env, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "ERROR SUMMARY: 0 errors" in res.stdout


# ---- vLLM's FP8_PER_TOKEN_HEAD: fp8 e4m3 with per-token scales (quant.py's word tiles, kv_align 4) ----

@pytest.mark.parametrize("inline", [False, True], ids=["separate", "record"])
@pytest.mark.parametrize("from_cache", [False, True], ids=["new_kv", "from_cache"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp8_per_token_cache(inline, from_cache, head_dim):
    from tests.cpu.kernels.prefix_prefill.test_fp8_token import fp8_case

    case, kw = fp8_case([0, 1, 15, 16, 17, 1000, 3000], [1, 16, 7, 129, 5, 300, 64], from_cache, inline, device=DEV,
                        q_heads=8, kv_heads=2, head_dim=head_dim, dtype=torch.bfloat16, seed=head_dim + from_cache)
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.bfloat16)


# ---- issue 20: int8 / int4 caches (dequantization fused on the tiles) ----

INT_FORMATS = [("int8", "token", "nhd"), ("int4", "token", "nhd"), ("int8", "channel", "hnd"),
               ("int4", "channel", "hnd"), ("int8", "token", "hnd"),
               ("int8", "group", "nhd"), ("int4", "group", "hnd")]  # groups of 16 channels (make_case's default)
# The issue's configurations at full size: (head_dim, block_size, q_heads, kv_heads, contexts, new tokens).
INT_CONFIGS = [
    (128, 32, 16, 4, [0, 2048], [1024, 1024]),
    (96, 32, 16, 4, [2048, 0], [1024, 1024]),
    (64, 16, 16, 4, [2048, 333], [1024, 257]),
    (192, 256, 16, 4, [2049, 513], [777, 1025]),
    (80, 64, 16, 4, [3073, 0], [257, 333]),
    (128, 32, 24, 6, [0, 2048], [1024, 1024]),
    (128, 1024, 16, 1, [2049, 3073], [513, 1]),     # block 1024, GQA 16
    (128, 1000, 16, 16, [1025, 777], [333, 257]),   # a block size that is not a power of two, no GQA
]


@pytest.mark.parametrize("fmt,scales,layout", INT_FORMATS)
@pytest.mark.parametrize("head_dim,block_size,q_heads,kv_heads,ctx,new", INT_CONFIGS)
def test_int_cache_issue_configurations(fmt, scales, layout, head_dim, block_size, q_heads, kv_heads, ctx, new):
    case, kw = make_case(ctx, new, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
                         dtype=torch.bfloat16, kv_format=fmt, scales=scales, layout=layout, device=DEV,
                         seed=head_dim + block_size)
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.bfloat16)


@pytest.mark.parametrize("fmt,scales,layout", INT_FORMATS)
def test_int_cache_review_bugs(fmt, scales, layout):
    # Scales of different values per kv head, contexts ending inside a page, window 1 (no cached
    # key inside any row's window: each row is its own v), sinks; fp16 scales.
    gain = [0.1, 3.0, 1.0, 20.0]
    case, kw = make_case([48 * 7 + 5, 48 * 20 - 1, 1], [300, 129, 64], q_heads=16, kv_heads=4, head_dim=128,
                         block_size=48, kv_format=fmt, scales=scales, layout=layout, head_gain=gain,
                         scale_dtype=torch.float16, device=DEV, seed=3)
    sinks = torch.randn(16, device=DEV) * 2
    unit = torch.tensor(gain, device=DEV).repeat_interleave(4)[None, :, None]  # errors scale with each head's values
    for extra in ({}, {"window": 1}, {"window": 100, "sinks": sinks}):
        got, ref = run(case, kw, **extra)
        assert_matches(got.float() / unit, ref / unit, torch.float16)
    got, _ = run(case, kw, window=1)
    assert_matches(got.float() / unit, case["v"].float().repeat_interleave(4, dim=1) / unit, torch.float16)


def _kernels_run(case, kw, **extra):
    """Names of the kernels a call launched (the dispatcher's selections made during the call)."""
    from aotc.loader import dispatch

    dispatch.reset()
    got, ref = run(case, kw, **extra)
    return {name for name, _axes, _dev in dispatch._selections}, got, ref


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the Gluon kernel (kernel_ws.py) is sm90's")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scales,layout,group", [("token", "nhd", 16), ("channel", "hnd", 16), ("group", "nhd", 8),
                                                 ("group", "hnd", 64)])
def test_sm90_int_caches_run_the_gluon_kernel(fmt, dtype, scales, layout, group, monkeypatch):
    # The op's routing: int8/int4 at 128-wide tiles -> kernel_ws.py; the Triton kernel for the
    # same call under AOTC_PREFIX_PREFILL_WS=0, and for head dims that miss the ALIGNED
    # specialization (72..120 not divisible by 16). Both within tolerance of the reference.
    case, kw = make_case([0, 300, 1025, 4], [129, 1, 257, 384], q_heads=16, kv_heads=4, head_dim=128, block_size=48,
                         dtype=dtype, kv_format=fmt, scales=scales, layout=layout, group=group, device=DEV, seed=11)
    names, got, ref = _kernels_run(case, kw, window=700)
    assert names == {"prefix_prefill_ws"}
    assert_matches(got, ref, dtype)
    monkeypatch.setenv("AOTC_PREFIX_PREFILL_WS", "0")
    names, got_triton, _ = _kernels_run(case, kw, window=700)
    assert names == {"prefix_prefill"}
    assert_matches(got_triton, ref, dtype)
    monkeypatch.delenv("AOTC_PREFIX_PREFILL_WS")
    odd, okw = make_case([300, 64], [200, 77], q_heads=8, kv_heads=2, head_dim=120, block_size=32, dtype=dtype,
                         kv_format=fmt, scales=scales, layout=layout, group=8, device=DEV, seed=12)
    names, got, ref = _kernels_run(odd, okw)
    assert names == {"prefix_prefill"}
    assert_matches(got, ref, dtype)


def _cache_keys_case(fmt, dtype, ctx, qlen, head_dim=128, q_heads=16, kv_heads=4, block_size=16, seed=0):
    """A case whose cache holds every key (k = v = None, as vLLM's unified_attention calls): fmt
    "int8" / "fp8_e4m3": vLLM's per-token-head record ([K codes | K scale | V codes | V scale] a
    token and kv head, rows 4-byte aligned); "fp8_tensor": float8_e4m3fn pages, one scale a cache.
    Unused slots hold NaN (codes 0x7f in fp8, NaN scales in the record)."""
    from tests.cpu.kernels.decode.test_vllm_caches import vllm_inline_cache

    full = [c + n for c, n in zip(ctx, qlen)]
    fp8 = fmt == "fp8_tensor"
    case, kw = make_case(full, qlen, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
                         dtype=dtype, cache_dtype=torch.float8_e4m3fn if fp8 else torch.float32, device=DEV,
                         seed=seed)
    case["seq_lens"] = torch.tensor(full, dtype=torch.int32, device=DEV)
    case["k"] = case["v"] = None
    if not fp8:
        poison = case["k_cache"].isnan().any(-1)
        kc, vc, ks, vs, _, _ = vllm_inline_cache(case["k_cache"].nan_to_num(), case["v_cache"].nan_to_num(), fmt)
        ks[poison], vs[poison] = float("nan"), float("nan")
        case.update(k_cache=kc, v_cache=vc)
        kw = dict(kv_format=fmt, k_scale=ks, v_scale=vs)
    return case, kw


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the Gluon kernel (kernel_ws_rec.py) is sm90's")
@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "fp8_tensor"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sm90_cache_keys_run_the_gluon_record_kernel(fmt, dtype, monkeypatch):
    # vLLM's prefill rows (every key in the cache) -> kernel_ws_rec.py, within tolerance of the
    # reference at block boundaries: query lengths 1, 127, 128, 129 and long; contexts 0, 1, 16, 17
    # and long (pages of 16, key tiles of 128); then window + sinks, and the Triton kernel's answer
    # under AOTC_PREFIX_PREFILL_WS=0.
    ctx = [0, 1, 16, 17, 2000, 0, 17, 1, 300]
    qlen = [129, 128, 127, 1, 700, 1, 129, 300, 128]
    case, kw = _cache_keys_case(fmt, dtype, ctx, qlen, seed=21)
    names, got, ref = _kernels_run(case, kw)
    assert names == {"prefix_prefill_ws_rec"}
    assert_matches(got, ref, dtype)
    sinks = torch.randn(16, device=DEV)
    for window in (1, 100, 1000):
        names, got, ref = _kernels_run(case, kw, window=window, sinks=sinks)
        assert names == {"prefix_prefill_ws_rec"}
        assert_matches(got, ref, dtype)
    monkeypatch.setenv("AOTC_PREFIX_PREFILL_WS", "0")
    names, got_triton, ref = _kernels_run(case, kw)
    assert names == {"prefix_prefill"}
    assert_matches(got_triton, ref, dtype)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the Gluon kernel (kernel_ws_rec.py) is sm90's")
@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_sm90_record_kernel_gqa_heads_and_long_context(fmt):
    # GQA 8 at llama's 32 / 4 heads, a long context over pages of 32, and head dim 96 (a 128-wide
    # tile, 16-byte q rows); head dim 120 (q rows not 16-byte multiples) keeps the Triton kernel.
    case, kw = _cache_keys_case(fmt, torch.bfloat16, [16384, 5], [1024, 130], q_heads=32, kv_heads=4, block_size=32,
                                seed=22)
    names, got, ref = _kernels_run(case, kw)
    assert names == {"prefix_prefill_ws_rec"}
    assert_matches(got, ref, torch.bfloat16)
    for head_dim, want in ((96, "prefix_prefill_ws_rec"), (120, "prefix_prefill")):
        case, kw = _cache_keys_case(fmt, torch.float16, [40, 300], [200, 77], head_dim=head_dim, q_heads=8,
                                    kv_heads=2, seed=head_dim)
        names, got, ref = _kernels_run(case, kw, window=64)
        assert names == {want}
        assert_matches(got, ref, torch.float16)


@pytest.mark.parametrize("head_dim", [24, 40, 72, 112, 192])
@pytest.mark.parametrize("layout,cache_dtype,x", [("vllm", None, None), ("vllm", torch.float8_e4m3fn, 8),
                                                  ("nhd", None, None)])
def test_padded_head_sizes_and_vllm_x(head_dim, layout, cache_dtype, x):
    # Issue 21 item 4: any multiple of 8 up to 256, and vLLM's x = 8 for one-byte fp8 caches.
    case, kw = make_case([0, 33, 700], [70, 1, 200], q_heads=8, kv_heads=2, head_dim=head_dim, block_size=16,
                         layout=layout, cache_dtype=cache_dtype, x=x, device=DEV, seed=head_dim)
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.float16)


def _built_prefix_prefill_variants():
    """Built variant names of both prefix-prefill kernels (the Triton one and, on sm90, the Gluon one)."""
    from aotc.loader import artifacts

    tgt = artifacts.load_target(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None
    if tgt is None:
        return []
    return sorted({e.key.rsplit("@", 1)[0] for e in tgt.manifest.entries
                   if e.kernel in ("prefix_prefill", "prefix_prefill_ws", "prefix_prefill_ws_rec")})


def _vllm_record_case(axes, dtype):
    """The every-variant case on the cache a vLLM-record key reads: INT4_PER_TOKEN_HEAD's codes ("token_zp":
    kv_format "int4_zp", the kernel's format: no rotation), or int8 / fp8 codes with their fp32 scale inline a (token, head) ("kv_align"
    4: rows 4-byte aligned)."""
    from tests.cpu.kernels.decode.test_vllm_caches import vllm_inline_cache
    from tests.cpu.kernels.decode.test_vllm_int4 import int4_cache

    case, _ = make_case([0, 40, 300], [70, 1, 130], q_heads=8, kv_heads=2, head_dim=axes["block_d"], dtype=dtype,
                        cache_dtype=torch.float32, device=DEV, seed=1)
    k, v = case["k_cache"].nan_to_num(), case["v_cache"].nan_to_num()  # [blocks, bs, kv_heads, D]; NaN: unused slots
    if axes["scales"] == "token_zp":
        kc, vc, ks, vs, _, _ = int4_cache(k, v)
        fmt = "int4_zp"
    else:
        kc, vc, ks, vs, _, _ = vllm_inline_cache(k, v, axes["kv"])
        fmt = axes["kv"]
    case.update(k_cache=kc, v_cache=vc)
    return case, dict(kv_format=fmt, k_scale=ks, v_scale=vs)


def test_every_built_variant_matches_the_jit_bit_for_bit(tmp_path, monkeypatch):
    import warnings

    from aotc import loader
    from aotc.kernels.prefix_prefill import spec
    from aotc.loader.fallback import AotcJitFallbackWarning
    from tests.gpu.aot_jit import jit_cubin_shas, loaded_entries

    variants = _built_prefix_prefill_variants()
    assert variants, "no prefix_prefill artifacts: run aotc build --arch sm90 first"
    ws_built = [v for v in variants if v.startswith(("prefix_prefill_ws(", "prefix_prefill_ws_rec("))]
    assert ws_built or torch.cuda.get_device_capability() != (9, 0), "sm90 artifacts without the Gluon kernel"
    variants = [v for v in variants if v not in ws_built]
    only = os.environ.get("AOTC_PP_PARITY", "")
    if only not in ("", "all"):  # e.g. "score=mod+block_d=128": the built keys holding every part
        variants = [v for v in variants if all(part in v for part in only.split("+"))]
        ws_built = []
    elif only != "all":
        # Each JIT compile takes ~10-20 s: by default the variants new with issue 20/21 at one
        # dtype each (int8/int4 x token/channel at their smallest and at 128-wide tiles, and the
        # 32-wide float tiles); AOTC_PP_PARITY=all checks every built variant, and parts joined by
        # "+" the keys that hold them all.
        variants = [v for v in variants if ("kv=int" in v and ("dtype=bf16" in v) == ("scales=token" in v)
                                            and ("block_d=128" in v or "block_d=32" in v or
                                                 ("block_d=64" in v and "kv=int4" in v)))
                    or ("block_d=32" in v and "dtype=fp16" in v and "kv=fp8_e5m2" not in v)]
    variants += ws_built  # every Gluon variant (12 + 6)
    monkeypatch.setenv("AOTC_MISS_LOG", str(tmp_path / "misses.jsonl"))
    torch_dt = {"fp16": torch.float16, "bf16": torch.bfloat16}
    fp8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
    loader.set_artifacts(None)  # forget the binaries earlier tests of this process loaded (loaded_entries)
    try:
        for key_text in variants:
            axes = {k: (int(v) if v.isdigit() else v) for k, v in
                    (p.split("=") for p in key_text[key_text.index("(") + 1:-1].split(","))}
            score = axes.get("score", "plain")  # the Gluon kernel's keys have no score axis
            call_axes = {k: v for k, v in axes.items() if k != "kv_align"}  # kv_align: the call's addresses pick it
            assert spec.axes_for(axes["dtype"], axes["kv"], axes["scales"], axes["block_d"], axes["layout"],
                                 score) == dict(call_axes, score=score)
            mods = dict(softcap=30.0, alibi_slopes=torch.rand(8, device=DEV)) if score == "mod" else {}
            quant = axes["kv"] in spec.INT_FORMATS
            rec = key_text.startswith("prefix_prefill_ws_rec(")
            if rec:  # every key in the cache: vLLM's records, or fp8 pages with one scale
                fmt = "fp8_tensor" if axes["scales"] == "none" else axes["kv"]
                case, kw = _cache_keys_case(fmt, torch_dt[axes["dtype"]], [0, 40, 300], [70, 1, 130], q_heads=8,
                                            kv_heads=2, seed=1)
            elif axes["scales"] == "token_zp" or "kv_align" in axes:  # vLLM's records
                case, kw = _vllm_record_case(axes, torch_dt[axes["dtype"]])
            else:
                case, kw = make_case([0, 40, 300], [70, 1, 130], q_heads=8, kv_heads=2, head_dim=axes["block_d"],
                                     dtype=torch_dt[axes["dtype"]], cache_dtype=fp8.get(axes["kv"]),
                                     kv_format=axes["kv"] if quant else None, scales=axes["scales"],
                                     layout="hnd" if quant else axes["layout"], device=DEV, seed=1)
            sinks = torch.randn(8, device=DEV)
            kernel = spec.PREFIX_PREFILL_WS_REC if rec else spec.PREFIX_PREFILL_WS if key_text.startswith(
                "prefix_prefill_ws(") else spec.PREFIX_PREFILL
            # a Triton variant the op would route to a Gluon kernel here: the switch sends it back
            monkeypatch.setenv("AOTC_PREFIX_PREFILL_WS", "0" if kernel is spec.PREFIX_PREFILL else "1")
            with warnings.catch_warnings():
                warnings.simplefilter("error", AotcJitFallbackWarning)  # the AOT run must not fall back
                aot = prefix_prefill(**case, **kw, window=200, sinks=sinks, **mods)
            used = loaded_entries(kernel.name, axes)
            assert used, f"the AOT run loaded no binary of {key_text}"
            loader.set_artifacts(tmp_path)  # an empty folder: the JIT compiles the same key
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", AotcJitFallbackWarning)
                jit = prefix_prefill(**case, **kw, window=200, sinks=sinks, **mods)
            loader.set_artifacts(None)
            torch.cuda.synchronize()
            assert torch.equal(aot, jit), key_text
            shas = jit_cubin_shas(kernel)
            # the level the case's addresses took (vLLM's records: GENERIC), each built binary it loaded
            for entry in used:
                assert entry.sha256 in shas, f"JIT cubin differs for {entry.key}"
    finally:
        loader.set_artifacts(None)


def test_lightllm_int8kv_prefill_entry_point():
    # compat.lightllm.context_attention_fwd_ppl_int8kv on a LightLLM-written buffer (its quantizer,
    # groups of 8, page size 1) at llama's 32/8 heads, d128: prefixes 0, 2048, 777.
    from types import SimpleNamespace

    from aotc.compat import lightllm
    from tests.cpu.compat.test_lightllm import lightllm_prefill, prefill_reference
    from tests.cpu.kernels.decode.cases import assert_close

    for fmt in ("int8", "int4"):
        q, kv, state, kv_buffer, scale_buffer = lightllm_prefill([0, 2048, 777], [1024, 513, 1], fmt, 8, head_dim=128,
                                                                 heads=32, kv_heads=8, seed=7)
        q, kv, kv_buffer, scale_buffer = (t.to(DEV) for t in (q, kv, kv_buffer, scale_buffer))
        names = ("b_req_idx", "b_seq_len", "b_ready_cache_len")
        state = SimpleNamespace(**{n: getattr(state, n).to(DEV) for n in names}, req_manager=SimpleNamespace(
            req_to_token_indexs=state.req_manager.req_to_token_indexs.to(DEV)))
        out = torch.full_like(q, float("nan"))
        lightllm.context_attention_fwd_ppl_int8kv(q, kv, state, kv_buffer, scale_buffer, out=out)
        torch.cuda.synchronize()
        ref = prefill_reference(q, kv, state, kv_buffer, scale_buffer, fmt)
        assert_close(out.view(ref.shape), ref, f"lightllm prefill {fmt}")


@pytest.mark.parametrize("layout,dtype,cache_dtype", [("nhd", torch.bfloat16, None), ("vllm", torch.float16, None),
                                                      ("nhd", torch.float16, torch.float8_e4m3fn)])
@pytest.mark.parametrize("cached_kv", [False, True])
def test_softcap_alibi_cached_kv_interleaved_v(layout, dtype, cache_dtype, cached_kv):
    # the runtime options vLLM's entry points need (spec.OPTION_ARGS), at d128 and llama-like lengths
    from tests.cpu.kernels.prefix_prefill.test_options import interleave_v

    ctx, qlen = [0, 300, 17, 1000], [70, 1, 130, 256]
    full = [c + n for c, n in zip(ctx, qlen)]
    case, kw = make_case(full if cached_kv else ctx, qlen, q_heads=8, kv_heads=2, head_dim=128, dtype=dtype,
                         cache_dtype=cache_dtype, layout=layout, device=DEV, seed=5)
    if cached_kv:
        case["seq_lens"] = torch.tensor(full, dtype=torch.int32, device=DEV)
        case["k"] = case["v"] = None
    extra = dict(softcap=20.0, alibi_slopes=torch.rand(8, device=DEV), alibi_sqrt=cached_kv, window=500,
                 sinks=torch.randn(8, device=DEV))
    if layout == "vllm":
        case["v_cache"] = interleave_v(case["v_cache"], 8)
        extra["v_pack"] = 8
    out = torch.full(case["q"].shape, float("nan"), dtype=dtype, device=DEV)
    prefix_prefill(**case, **kw, **extra, out=out, validate=True)
    assert_matches(out, prefix_prefill_ref(**case, **kw, **extra), dtype)
