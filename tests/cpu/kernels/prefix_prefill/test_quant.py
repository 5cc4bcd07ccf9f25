"""prefix_prefill over int8 / int4 paged caches (issue 20) on the interpreter, against the float32
reference that dequantizes the cache and then attends (reference.prefix_prefill_ref).

Formats: decode's int8 and int4 (code + 7 nibbles) with one scale a token and head, one a token,
head and group of 8..128 channels, and per-channel scales [kv_heads, D]; layouts nhd and hnd
(Iluvatar's [blocks, kv_heads, block_size, D]). The issue's configurations are scaled down here (same GQA ratios, head dims, block sizes and
odd lengths, fewer tokens); tests/gpu/test_prefix_prefill.py runs them at full size.
Unused slots hold the largest code and (per token and group) NaN scales; outputs start as NaN.
Tolerance: cases.TOL (4e-3 fp16, 3e-2 bf16, absolute + relative), every element: the kernel adds
no error beyond the float path's rounding to fp16 of P and of the values (per token: code *
scale, as decode, per token or group; per channel the codes are exact and q * k_scale is rounded). Where kv heads
hold values of different sizes, the comparison is in units of each head's size.
"""
import pytest
import torch

from aotc.kernels.prefix_prefill.reference import dequantize_int_cache, prefix_prefill_ref, quantize_fp8_ref
from aotc.loader.ops.decode import decode
from aotc.loader.ops.prefix_prefill import prefix_prefill

from ..decode.cases import assert_close as assert_decode_close
from ..decode.cases import make_case as make_decode_case
from .cases import TOL, assert_matches, make_case

FORMATS = [("int8", "token", "nhd"), ("int4", "token", "nhd"), ("int8", "channel", "hnd"),
           ("int4", "channel", "hnd"), ("int8", "token", "hnd"), ("int4", "channel", "nhd")]
GROUP_FORMATS = [("int8", "group", "nhd"), ("int4", "group", "hnd")]  # groups of 16 (make_case's default)


def run(case, kw, **extra):
    out = torch.full(case["q"].shape, float("nan"), dtype=case["q"].dtype)
    got = prefix_prefill(**case, **kw, **extra, out=out)
    assert got is out
    ref = prefix_prefill_ref(**case, **kw, **{k: v for k, v in extra.items() if k in ("sm_scale", "window", "sinks")})
    return got, ref


@pytest.mark.parametrize("fmt,scales,layout", FORMATS + GROUP_FORMATS)
def test_mixed_batch_at_block_boundaries(fmt, scales, layout):
    # Contexts 0, 1, block-1, block, block+1 and long; new tokens 1, 16, odd, past a 128-row q block.
    dtype = torch.bfloat16 if scales == "channel" else torch.float16
    case, kw = make_case([0, 1, 15, 16, 17, 300], [1, 16, 7, 33, 5, 130], kv_format=fmt, scales=scales,
                         layout=layout, dtype=dtype, seed=1)
    got, ref = run(case, kw)
    assert_matches(got, ref, dtype)


# The issue's configurations, scaled down: (head_dim, block_size, q_heads, kv_heads, contexts, new tokens).
CONFIGS = [
    (128, 32, 4, 1, [0, 96], [40, 40]),        # B 2, 16/4 heads, D 128, new tokens over 0 and over a context
    (96, 32, 4, 1, [33, 70], [17, 9]),         # D 96 padded to 128
    (64, 16, 6, 6, [15, 49], [20, 3]),         # D 64, block 16, no GQA
    (192, 256, 4, 2, [257, 30], [9, 4]),       # D 192 padded to 256, block 256, a partial second page
    (80, 64, 8, 2, [65, 127], [31, 2]),        # D 80, block 64
    (128, 48, 12, 3, [77, 129], [33, 1]),      # 24/6 heads' ratio (4) at 12/3; block 48 (not a power of two)
    (64, 1000, 16, 1, [1001, 0], [5, 7]),      # GQA 16, a 1000-token block (any size up to 1024)
]


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("head_dim,block_size,q_heads,kv_heads,ctx,new", CONFIGS)
def test_issue_configurations(fmt, head_dim, block_size, q_heads, kv_heads, ctx, new):
    case, kw = make_case(ctx, new, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
                         dtype=torch.bfloat16, kv_format=fmt, layout="hnd" if head_dim % 3 else "nhd",
                         scales="token", scale_dtype=torch.float16, seed=head_dim + block_size)
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.bfloat16)


@pytest.mark.parametrize("fmt,scales,layout", FORMATS[:4])
def test_odd_lengths(fmt, scales, layout):
    # The issue's 257, 333, 513, 777, ... scaled to odd lengths across 32-token blocks and 64-key tiles.
    case, kw = make_case([0, 33, 65, 77], [129, 33, 65, 7], kv_format=fmt, scales=scales, layout=layout,
                         block_size=32, seed=9)
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.float16)


@pytest.mark.parametrize("scales", ["token", "channel", "group"])
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_review_bug_scales_differ_per_kv_head(fmt, scales):
    # The reviewed kernel indexed scales by query head (right only with pre-expanded scales). Here
    # each kv head has its own magnitude (so its own scales), 8 query heads share 4 kv heads, and
    # the same problem with the scales' kv heads swapped is far outside the tolerance.
    gain = [0.1, 3.0, 1.0, 20.0]
    case, kw = make_case([40, 70], [9, 20], q_heads=8, kv_heads=4, kv_format=fmt, scales=scales, layout="hnd",
                         head_gain=gain, seed=13)
    got, ref = run(case, kw)
    # Errors scale with each head's values (P is rounded to fp16 before PV): compare in units of its gain.
    unit = torch.tensor(gain).repeat_interleave(2)[None, :, None]
    assert_matches(got.float() / unit, ref / unit, torch.float16)
    head_dim = 0 if scales == "channel" else 1  # hnd token/group scales are [blocks, kv_heads, bs, groups]
    swapped = {n: kw[n].flip(head_dim) for n in ("k_scale", "v_scale")}
    wrong = prefix_prefill_ref(**case, **dict(kw, **swapped))
    assert ((wrong - ref).abs() > 10 * TOL[torch.float16] * (1 + ref.abs())).any()


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_token_scales_across_fp16_range(fmt):
    # Per-token values are rounded to fp16 as code * scale: kv heads of size 1e-3 (int8 scales
    # ~2e-5, below fp16's normals) to 300 (values ~1000) stay within the tolerance in each head's
    # units. (Smaller heads lose precision gradually: at 1e-4 an int8 head's error reaches ~2%
    # of its size, ~1e-6 absolute; decode shares the format.)
    gain = [1e-3, 3.0, 1.0, 300.0]
    case, kw = make_case([40, 70], [9, 20], q_heads=8, kv_heads=4, kv_format=fmt, scales="token", layout="hnd",
                         head_gain=gain, seed=29)
    got, ref = run(case, kw)
    unit = torch.tensor(gain).repeat_interleave(2)[None, :, None]
    assert_matches(got.float() / unit, ref / unit, torch.float16)


@pytest.mark.parametrize("fmt,scales,layout", FORMATS[:4] + GROUP_FORMATS)
def test_review_bug_partial_last_page(fmt, scales, layout):
    # Contexts ending inside a page (the reviewed kernel scaled the partial page twice). The slots
    # past each context hold the largest code and NaN token scales.
    bs = 48
    case, kw = make_case([bs + 5, 2 * bs - 1, 1], [3, 20, 8], kv_format=fmt, scales=scales, layout=layout,
                         block_size=bs, seed=17)
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.float16)
    if scales != "channel":
        assert kw["k_scale"].isnan().any(), "the case must poison the unused slots' scales"


@pytest.mark.parametrize("fmt,scales", [("int8", "token"), ("int4", "channel"), ("int4", "group")])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_review_bug_row_whose_window_holds_no_cached_key(fmt, scales, with_sinks):
    # The reviewed kernel had no guard for l == 0. Decided here: a window w >= 1 always holds the
    # row's own key (distance 0), so with window 1 each row attends to itself alone and its output
    # is its own v (with sinks: v * e^s / (e^s + e^sink)); no cached key is read, so poisoning every
    # scale of the cache changes nothing. (The kernel's l == 0 guard writes zeros, and a row that
    # only has a sink gets zeros too: sinks carry no value.)
    case, kw = make_case([64, 300], [5, 70], kv_format=fmt, scales=scales, seed=19)
    sinks = torch.randn(4) * 2 if with_sinks else None
    clean, ref = run(case, kw, window=1, sinks=sinks)
    assert_matches(clean, ref, torch.float16)
    if not with_sinks:
        own_v = case["v"].float().repeat_interleave(2, dim=1)
        assert_matches(clean, own_v, torch.float16)
    kw = dict(kw, k_scale=torch.full_like(kw["k_scale"], float("nan")),
              v_scale=torch.full_like(kw["v_scale"], float("nan")))
    poisoned = prefix_prefill(**case, **kw, window=1, sinks=sinks) if scales != "channel" else None
    if poisoned is not None:
        assert torch.equal(poisoned, clean)


@pytest.mark.parametrize("fmt,scales,layout", [("int8", "token", "nhd"), ("int4", "channel", "hnd"),
                                               ("int8", "group", "hnd")])
@pytest.mark.parametrize("window", [5, 70])
def test_window_and_sinks(fmt, scales, layout, window):
    case, kw = make_case([0, 17, 300], [9, 40, 140], kv_format=fmt, scales=scales, layout=layout,
                         dtype=torch.bfloat16, seed=window)
    sinks = torch.randn(4) * 2
    got, ref = run(case, kw, window=window, sinks=sinks)
    assert_matches(got, ref, torch.bfloat16)


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scale_dtypes(scale_dtype):
    case, kw = make_case([50, 17], [20, 3], kv_format="int8", scale_dtype=scale_dtype, seed=23)
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.float16)


@pytest.mark.parametrize("fmt,scales,layout", [("int8", "token", "nhd"), ("int4", "channel", "hnd"),
                                               ("int4", "group", "nhd")])
def test_unused_pages_do_not_change_results(fmt, scales, layout):
    case, kw = make_case([16, 31], [8, 8], kv_format=fmt, scales=scales, layout=layout, seed=29)
    first = prefix_prefill(**case, **kw)
    used = set(case["block_table"][0, :1].tolist()) | set(case["block_table"][1, :2].tolist())
    for blk in range(case["k_cache"].shape[0]):
        if blk not in used:
            case["k_cache"][blk] = -77
            case["v_cache"][blk] = 119
    assert torch.equal(first, prefix_prefill(**case, **kw))


# (format, head_dim, group, layout, scale dtype): every group size decode reads, head dims that
# pad (80, 96, 24) or fill (64, 128, 256) their tile, a group that is the whole head at 128.
GROUPS = [("int8", 64, 8, "nhd", torch.float16), ("int4", 64, 16, "hnd", torch.float32),
          ("int8", 128, 32, "hnd", torch.bfloat16), ("int4", 128, 64, "nhd", torch.float16),
          ("int8", 256, 128, "nhd", torch.float32), ("int4", 96, 32, "nhd", torch.float16),
          ("int8", 80, 16, "hnd", torch.float32), ("int8", 24, 8, "nhd", torch.float16),
          ("int4", 256, 8, "hnd", torch.bfloat16)]


@pytest.mark.parametrize("fmt,head_dim,group,layout,scale_dtype", GROUPS)
def test_group_scales(fmt, head_dim, group, layout, scale_dtype):
    # decode's per-group format: one scale a token, kv head and group of channels, [.., D // group].
    # Contexts 0, 1, block-1, block, block+1 and long; the groups' scales differ (absmax of their own
    # channels), and the same problem with each token's groups rotated is far outside the tolerance.
    case, kw = make_case([0, 1, 15, 16, 17, 150], [3, 16, 7, 33, 5, 70], head_dim=head_dim, kv_format=fmt,
                         scales="group", group=group, layout=layout, scale_dtype=scale_dtype, seed=group + head_dim)
    assert kw["k_scale"].shape[-1] == head_dim // group
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.float16)
    rotated = {n: kw[n].roll(1, -1) for n in ("k_scale", "v_scale")}
    wrong = prefix_prefill_ref(**case, **dict(kw, **rotated))
    if head_dim // group > 1:
        assert ((wrong - ref).abs() > 10 * TOL[torch.float16] * (1 + ref.abs())).any()


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_one_store_kv_cache_serves_decode_and_prefill(fmt):
    # A paged cache written by store_kv with groups of 16 channels (decode's tests build theirs the
    # same way): decode reads it for one query a request, and prefix_prefill prefills new tokens
    # over it, each against its float32 reference over the values the cache holds.
    c = make_decode_case([37, 70], fmt=fmt, quant_group=16, q_dtype=torch.float16, seed=41)
    assert c.kwargs["k_scale"].shape[-1] == 64 // 16
    assert_decode_close(decode(c.q, c.k_cache, c.v_cache, c.table, c.seq_lens, **c.kwargs), c.reference(),
                        f"decode {fmt}")
    g = torch.Generator().manual_seed(43)
    new = [5, 9]
    kv_heads, q_heads, head_dim = c.k_cache.shape[2], c.q.shape[1], 64
    q = torch.randn(sum(new), q_heads, head_dim, generator=g).half()
    k = torch.randn(sum(new), kv_heads, head_dim, generator=g).half()
    v = torch.randn(sum(new), kv_heads, head_dim, generator=g).half()
    qsl = torch.tensor([0, new[0], sum(new)], dtype=torch.int32)
    case = dict(q=q, k=k, v=v, k_cache=c.k_cache, v_cache=c.v_cache, block_table=c.table, query_start_loc=qsl,
                seq_lens=c.seq_lens + torch.tensor(new, dtype=torch.int32))
    kw = dict(k_scale=c.kwargs["k_scale"], v_scale=c.kwargs["v_scale"])
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.float16)
    # Both references read the cache as the same values.
    assert torch.equal(dequantize_int_cache(c.k_cache, fmt, c.kwargs["k_scale"]), c.k_real)
    assert torch.equal(dequantize_int_cache(c.v_cache, fmt, c.kwargs["v_scale"]), c.v_real)


@pytest.mark.parametrize("fmt,scales", [("int8", "token"), ("int4", "group"), ("int8", "channel")])
def test_fp8_output_and_skip_decode_over_int_caches(fmt, scales):
    # The existing options over int caches: fp8 output (one e4m3 step, 2^-3 relative, plus the
    # fp16 tolerance in the scaled domain) and skip_decode (one-token requests' rows untouched).
    case, kw = make_case([5, 40, 0, 17], [1, 20, 1, 9], kv_format=fmt, scales=scales, seed=63)
    out_scale = torch.tensor([0.005])
    out = torch.full(case["q"].shape, float("nan")).to(torch.float8_e4m3fn)
    prefix_prefill(**case, **kw, out_scale=out_scale, skip_decode=True, out=out)
    want = quantize_fp8_ref(prefix_prefill_ref(**case, **kw), out_scale).float()
    starts = case["query_start_loc"].tolist()
    decode_rows = [starts[0], starts[2]]
    rows = [r for r in range(case["q"].shape[0]) if r not in decode_rows]
    got = out.float()
    assert got[decode_rows].isnan().all()
    assert not got[rows].isnan().any()
    tol = TOL[torch.float16] / out_scale.item()
    assert ((got[rows] - want[rows]).abs() <= 0.125 * want[rows].abs() + tol).all()


def test_quantized_result_differs_from_the_float_one():
    # The reference really dequantizes: int4's rounding moves the result past the tolerance, so a
    # kernel that ignored the codes' scale or read the wrong nibble could not pass the tests above.
    q4, kw4 = make_case([80], [10], kv_format="int4", seed=31)
    f, kwf = make_case([80], [10], seed=31)
    assert (prefix_prefill_ref(**q4, **kw4) - prefix_prefill_ref(**f, **kwf)).abs().max() > 0.05
