"""prefix_prefill's other masks, through the public op (Triton interpreter) against the float32
reference: chunked local attention (chunk_lookback with a window: keys of the query's chunk and
chunk_lookback chunks back) and vLLM's bidirectional ranges (mm_prefix_range: pairs of positions
inside one range see each other, future keys included; mm_clamp keeps them inside the window).
Positions cross 16-token pages, the 32/64-key tiles and the 128-row q blocks; caches poisoned (NaN
pages and slots), outputs NaN first; tolerance cases.TOL (4e-3 fp16, 3e-2 bf16)."""
import pytest
import torch

from aotc.kernels.prefix_prefill.reference import prefix_prefill_ref
from aotc.loader.ops.prefix_prefill import prefix_prefill

from .cases import TOL, assert_matches, make_case
from .test_options import cache_holds_all


def masked_run(case, kw, **opts):
    """(the op's output over a NaN-filled out, the reference's) with the same mask options."""
    out = torch.full(case["q"].shape, float("nan"), dtype=case["q"].dtype)
    got = prefix_prefill(**case, **kw, **opts, out=out)
    assert got is out
    return got, prefix_prefill_ref(**case, **kw, **opts)


@pytest.mark.parametrize("window,lookback", [(48, 0), (48, 1), (50, 2), (17, 0)])
@pytest.mark.parametrize("from_cache", [True, False])
def test_chunked_local_attention(window, lookback, from_cache):
    ctx, q_lens = [0, 15, 40, 3], [1, 70, 130, 33]
    if from_cache:
        case, kw = cache_holds_all(ctx, q_lens, head_dim=32, seed=31)
    else:
        case, kw = make_case(ctx, q_lens, head_dim=32, seed=31)
    got, ref = masked_run(case, kw, window=window, chunk_lookback=lookback)
    assert_matches(got, ref, torch.float16)
    plain = prefix_prefill_ref(**case, **kw, window=window)
    assert (plain - ref).abs().max() > 10 * TOL[torch.float16]  # the chunks changed the answer


def _ranges(rows, width):
    """[len(rows), width, 2] int32, unused slots (0, 0)."""
    t = torch.zeros(len(rows), width, 2, dtype=torch.int32)
    for b, rs in enumerate(rows):
        for i, (s, e) in enumerate(rs):
            t[b, i, 0], t[b, i, 1] = s, e
    return t


# (contexts, q lengths, ranges a request): a range inside the new tokens, one from the context into
# them, one past the first 128-row q block (its rows see keys of the next block), two in one
# request, an unused (start >= end) one and a request without any
MM_CASES = [
    ([0, 15, 40, 3], [20, 70, 200, 1],
     [[(2, 9)], [(10, 60), (70, 70)], [(100, 230), (30, 35)], []]),
]


@pytest.mark.parametrize("window,clamp", [(None, False), (48, False), (48, True)])
@pytest.mark.parametrize("layout,cache_dtype", [("nhd", None), ("vllm", None), ("nhd", torch.float8_e4m3fn)])
def test_bidirectional_ranges(window, clamp, layout, cache_dtype):
    ctx, q_lens, rows = MM_CASES[0]
    case, kw = cache_holds_all(ctx, q_lens, head_dim=32, layout=layout, cache_dtype=cache_dtype, seed=32)
    mm = _ranges(rows, 2)
    got, ref = masked_run(case, kw, window=window, mm_prefix_range=mm, mm_clamp=clamp)
    assert_matches(got, ref, torch.float16)
    causal = prefix_prefill_ref(**case, **kw, window=window)
    assert (causal - ref).abs().max() > 10 * TOL[torch.float16]  # the ranges changed the answer


@pytest.mark.parametrize("window", [32, 64])
def test_vllm_clamped_ranges_with_chunks(window):
    # vLLM's Gemma-4 case in small: chunked local attention (chunk = window) plus clamped ranges; in
    # the second 128-row q block of request 0 the clamped range reaches below the block's first chunk
    ctx, q_lens = [0, 60], [200, 40]
    case, kw = cache_holds_all(ctx, q_lens, q_heads=4, kv_heads=2, head_dim=32, dtype=torch.bfloat16, seed=33)
    mm = _ranges([[(8, 87), (100, 180)], [(70, 95)]], 2)
    got, ref = masked_run(case, kw, window=window, chunk_lookback=0, mm_prefix_range=mm, mm_clamp=True)
    assert_matches(got, ref, torch.bfloat16)


def test_bad_mask_options():
    case, kw = cache_holds_all([4], [8], head_dim=32, seed=34)
    mm = _ranges([[(1, 5)]], 1)
    with pytest.raises(ValueError, match="window"):
        prefix_prefill(**case, **kw, window=2, chunk_lookback=2)
    with pytest.raises(ValueError, match="window"):
        prefix_prefill(**case, **kw, chunk_lookback=0)
    with pytest.raises(ValueError, match="chunk_lookback"):
        prefix_prefill(**case, **kw, window=8, chunk_lookback=-2)
    with pytest.raises(TypeError, match="chunk_lookback"):
        prefix_prefill(**case, **kw, window=8, chunk_lookback=1.0)
    with pytest.raises(ValueError, match="mm_prefix_range"):
        prefix_prefill(**case, **kw, mm_prefix_range=mm[:, :, :1].contiguous())
    with pytest.raises(ValueError, match="mm_prefix_range"):
        prefix_prefill(**case, **kw, mm_prefix_range=torch.cat([mm, mm]))
    with pytest.raises(TypeError, match="mm_prefix_range"):
        prefix_prefill(**case, **kw, mm_prefix_range=mm.long())
    with pytest.raises(NotImplementedError, match="alibi"):
        prefix_prefill(**case, **kw, mm_prefix_range=mm, alibi_slopes=torch.ones(4))
    sep, skw = make_case([4], [8], head_dim=32, seed=34)
    with pytest.raises(NotImplementedError, match="mm_prefix_range"):
        prefix_prefill(**sep, **skw, mm_prefix_range=mm)
    icase, ikw = cache_holds_all([4], [8], head_dim=64, kv_format="int8", seed=34)
    for opts in (dict(window=8, chunk_lookback=0), dict(mm_prefix_range=mm)):
        with pytest.raises(NotImplementedError, match=next(iter(set(opts) - {"window"}))):
            prefix_prefill(**icase, **ikw, **opts)
