"""prefix_prefill through the public op (Triton interpreter) against the float32 reference.

Inputs are randn at scale 1; unused cache pages and slots hold NaN (cases.py); outputs start as
NaN, so an unwritten row fails. Tolerance: cases.TOL (4e-3 fp16, 3e-2 bf16, abs and rel).
"""
import pytest
import torch

from aotc.kernels.prefix_prefill.reference import FP8_E4M3_MAX, prefix_prefill_ref, quantize_fp8_ref
from aotc.loader import fallback
from aotc.loader.ops.prefix_prefill import prefix_prefill

from .cases import FP8, TOL, assert_matches, make_case

# Context lengths around a 16-token page (0, 1, block-1, block, block+1) and a long one, with
# query lengths 1, 16, odd, and past one 128-row q block.
CTX = [0, 1, 15, 16, 17, 300]
QLEN = [1, 16, 7, 33, 5, 130]


def run(case, kw, **extra):
    out = torch.full(case["q"].shape, float("nan"), dtype=case["q"].dtype)
    got = prefix_prefill(**case, **kw, **extra, out=out)
    assert got is out
    ref = prefix_prefill_ref(**case, **{k: v for k, v in kw.items()},
                             **{k: v for k, v in extra.items() if k in ("sm_scale", "window", "sinks")})
    return got, ref


@pytest.mark.parametrize("layout", ["nhd", "vllm"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mixed_batch_at_block_boundaries(layout, dtype):
    case, kw = make_case(CTX, QLEN, dtype=dtype, layout=layout, seed=1)
    got, ref = run(case, kw)
    assert_matches(got, ref, dtype)


@pytest.mark.parametrize("head_dim,block_size,layout,dtype,q_heads,kv_heads", [
    (80, 48, "vllm", torch.bfloat16, 4, 1),   # padded head_dim, block size not a power of two
    (96, 32, "nhd", torch.float16, 8, 8),     # padded head_dim, no GQA
    (128, 128, "nhd", torch.bfloat16, 8, 1),  # GQA group 8, one page holds all of a context
    (256, 16, "vllm", torch.float16, 2, 2),
    (64, 48, "nhd", torch.float16, 3, 1),
])
def test_head_dims_block_sizes_groups(head_dim, block_size, layout, dtype, q_heads, kv_heads):
    case, kw = make_case([0, block_size - 1, block_size + 1, 2 * block_size], [3, 1, 20, 70],
                         head_dim=head_dim, block_size=block_size, layout=layout, dtype=dtype,
                         q_heads=q_heads, kv_heads=kv_heads, seed=head_dim)
    got, ref = run(case, kw)
    assert_matches(got, ref, dtype)


def test_long_context():
    case, kw = make_case([2000, 37], [150, 64], q_heads=2, kv_heads=1, block_size=32, seed=7)
    got, ref = run(case, kw, sm_scale=0.2)
    assert_matches(got, ref, torch.float16)


@pytest.mark.parametrize("sm", [80, 90])
@pytest.mark.parametrize("window", [None, 1500])
def test_context_over_several_block_id_chunks(window, sm, monkeypatch):
    # fp16/bf16 rows up to d128 read the mask-free tiles' block ids 16 tiles at a time (kernel.py),
    # tiles of 64 keys (sm80's constexprs: chunks of 1024) or 32 (sm90's, spec._two_programs_an_sm:
    # chunks of 512): contexts of exactly one or two chunks, chunks and a tile or two, and chunks and
    # a part; the window starts the mask-free tiles inside a chunk.
    run_jit = fallback.run_jit

    def run_as_sm(spec, axes, grid, args, arch):  # the interpreter runs sm90's constexprs otherwise
        run_jit(spec, axes, grid, args, arch=sm)

    monkeypatch.setattr(fallback, "run_jit", run_as_sm)
    case, kw = make_case([1024, 2112, 2900], [5, 130, 20], head_dim=128, q_heads=2, kv_heads=1, block_size=16,
                         dtype=torch.bfloat16, seed=91)
    got, ref = run(case, kw, window=window)
    assert_matches(got, ref, torch.bfloat16)


@pytest.mark.parametrize("window", [1, 5, 40, 200])
@pytest.mark.parametrize("layout", ["nhd", "vllm"])
def test_sliding_window(window, layout):
    # Windows smaller than a tile, straddling the context/new boundary, and wider than most.
    case, kw = make_case([0, 17, 300], [9, 40, 140], layout=layout, seed=window)
    got, ref = run(case, kw, window=window)
    assert_matches(got, ref, torch.float16)
    full = prefix_prefill_ref(**case, **kw)
    assert (ref - full).abs().max() > 0.05, "the window must change these results"


def test_window_zero_or_none_means_full():
    case, kw = make_case([20, 70], [12, 3], seed=11)
    a = prefix_prefill(**case, **kw, window=0)
    b = prefix_prefill(**case, **kw, window=None)
    assert torch.equal(a, b)
    assert_matches(a, prefix_prefill_ref(**case, **kw), torch.float16)


@pytest.mark.parametrize("window", [None, 24])
def test_sinks(window):
    case, kw = make_case([0, 16, 100], [1, 33, 20], q_heads=4, kv_heads=2, dtype=torch.bfloat16, seed=21)
    sinks = torch.randn(4) * 2
    sinks[0] = 6.0  # a sink that dominates some rows
    got, ref = run(case, kw, sinks=sinks, window=window)
    assert_matches(got, ref, torch.bfloat16)
    plain = prefix_prefill_ref(**case, **kw, window=window)
    assert (ref - plain).abs().max() > 0.05, "the sinks must change these results"


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("layout", ["nhd", "vllm"])
def test_fp8_cache(cache_dtype, layout):
    dtype = torch.bfloat16 if layout == "vllm" else torch.float16
    case, kw = make_case([0, 15, 33, 200], [5, 16, 1, 70], layout=layout, cache_dtype=cache_dtype, dtype=dtype,
                         seed=31)
    got, ref = run(case, kw, window=100)
    assert_matches(got, ref, dtype)


def test_fp8_cache_tiny_values():
    # e4m3 subnormals (below 2^-6) decode exactly: a cache of them, scaled up, must match.
    case, kw = make_case([40], [8], cache_dtype=torch.float8_e4m3fn, seed=41, scale=0.004)
    case["q"] = case["q"] * 250
    kw["k_scale"] = torch.tensor([200.0])
    kw["v_scale"] = torch.tensor([300.0])
    got, ref = run(case, kw)
    assert ref.abs().max() > 0.3
    assert_matches(got, ref, torch.float16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_output(dtype):
    case, kw = make_case([0, 16, 90], [4, 17, 40], dtype=dtype, seed=51)
    out_scale = torch.tensor([0.005])  # outputs of ~1 map to ~200; those past 2.24 saturate at 448
    out = torch.full(case["q"].shape, float("nan")).to(torch.float8_e4m3fn)
    got = prefix_prefill(**case, **kw, out_scale=out_scale, out=out)
    assert got.dtype == torch.float8_e4m3fn
    ref = prefix_prefill_ref(**case, **kw)
    want = quantize_fp8_ref(ref, out_scale).float()
    got = got.float()
    assert not got.isnan().any()
    # One e4m3 step (2^-3 relative) plus the input dtype's error, in the scaled domain.
    tol = TOL[dtype] / out_scale.item()
    assert ((got - want).abs() <= 0.125 * want.abs() + tol).all()
    assert (got.abs() == FP8_E4M3_MAX).any() and (want.abs() == FP8_E4M3_MAX).any()
    assert got.abs().max() == FP8_E4M3_MAX


def test_skip_decode_leaves_decode_rows_untouched():
    case, kw = make_case([5, 40, 0, 17], [1, 20, 1, 9], seed=61)
    sentinel = 12.5
    # Two spare rows past query_start_loc[-1] (CUDA-graph padding) must stay untouched too.
    tokens = case["q"].shape[0]
    for name in ("q", "k", "v"):
        case[name] = torch.cat([case[name], torch.randn(2, *case[name].shape[1:]).to(case[name].dtype)])
    out = torch.full(case["q"].shape, sentinel, dtype=torch.float16)
    prefix_prefill(**case, **kw, skip_decode=True, out=out)
    ref = prefix_prefill_ref(**case, **kw)
    starts = case["query_start_loc"].tolist()
    decode_rows = [starts[0], starts[2]]
    kept = decode_rows + [tokens, tokens + 1]
    assert (out[kept] == sentinel).all()
    rows = [r for r in range(tokens) if r not in decode_rows]
    assert_matches(out, ref, torch.float16, rows=rows)
    # Without skip_decode the same rows are computed.
    out2 = prefix_prefill(**case, **kw, out=torch.full_like(out, float("nan")))
    assert_matches(out2, ref, torch.float16, rows=list(range(tokens)))


def test_nan_in_unused_pages_does_not_leak_and_results_do_not_depend_on_them():
    case, kw = make_case([16, 31], [8, 8], seed=71)
    first = prefix_prefill(**case, **kw)
    used = set(case["block_table"][0, :1].tolist()) | set(case["block_table"][1, :2].tolist())
    for blk in range(case["k_cache"].shape[0]):
        if blk not in used:
            case["k_cache"][blk] = 1e4
            case["v_cache"][blk] = -1e4
    assert torch.equal(first, prefix_prefill(**case, **kw))


def test_batch_of_empty_requests_and_default_out():
    case, kw = make_case([10, 0, 30], [0, 0, 3], seed=81)
    got = prefix_prefill(**case, **kw)
    assert got.shape == case["q"].shape and got.dtype == case["q"].dtype
    assert_matches(got, prefix_prefill_ref(**case, **kw), torch.float16)


@pytest.mark.parametrize("head_dim", [24, 40, 72, 112, 192])
@pytest.mark.parametrize("layout", ["nhd", "vllm"])
def test_padded_head_sizes(head_dim, layout):
    # Issue 21 item 4: any multiple of 8 up to 256, padded to the 32/64/128/256-wide tile.
    case, kw = make_case([0, 17, 70], [9, 20, 3], head_dim=head_dim, layout=layout, dtype=torch.bfloat16,
                         seed=head_dim)
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.bfloat16)


@pytest.mark.parametrize("cache_dtype,fmt", [(torch.float8_e4m3fn, "fp8_e4m3"), (torch.float8_e5m2, "fp8_e5m2")])
@pytest.mark.parametrize("head_dim", [24, 64])
def test_vllm_x_8_for_one_byte_fp8_stored_as_uint8(cache_dtype, fmt, head_dim):
    # vLLM packs K with x = 8 even for one-byte fp8 caches, which it stores as uint8: x comes from
    # K's shape and the format from kv_format.
    case, kw = make_case([0, 33, 90], [5, 16, 40], layout="vllm", cache_dtype=cache_dtype, x=8, head_dim=head_dim,
                         seed=head_dim)
    assert case["k_cache"].shape[-1] == 8
    case = dict(case, k_cache=case["k_cache"].view(torch.uint8), v_cache=case["v_cache"].view(torch.uint8))
    got, ref = run(case, dict(kw, kv_format=fmt))
    assert_matches(got, ref, torch.float16)


def test_vllm_x_16_for_fp16():
    # A K group wider than 16 bytes (x = 16 for a 2-byte dtype) is read as two runs of 8.
    case, kw = make_case([20, 70], [9, 3], layout="vllm", x=16, seed=5)
    assert case["k_cache"].shape[-1] == 16
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.float16)
