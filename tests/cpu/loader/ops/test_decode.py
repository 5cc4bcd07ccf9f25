"""`decode` and `store_kv` on CPU tensors (Triton interpreter) against the float32 reference.

Quantized caches are written by store_kv and compared on their dequantized values, so the
tolerance (cases.assert_close: bf16 2e-2 abs+rel per element and 1e-2 relative norm; fp16 5e-3
and 3e-3) covers the kernel's arithmetic, not the quantization error. Outputs are poisoned with
NaN first. Lengths n-1, n, n+1 straddle a tile of n = BLOCK_N tokens (spec.block_n of the variant's tile).
"""
import math

import pytest
import torch

from aotc.kernels.decode import reference as R, spec as S
from aotc.loader.ops.decode import decode
from aotc.loader.ops.store_kv import store_kv
from tests.cpu.kernels.decode.cases import DTYPES, FP8, assert_close, make_case

FORMATS = ["bf16", "fp16", "int8", "int4", "fp8_e4m3", "fp8_e5m2"]


def edges(fmt, head_dim=64):
    # make_case's default groups of 32 channels ("small_group" scales): the tile the op takes
    n = S.block_n(head_dim, S.split_tiles(fmt, head_dim, "small_group")[0])
    return [0, 1, n - 1, n, n + 1, 2 * n + 2]


def run(case, **kw):
    out = torch.full_like(case.q, float("nan"))
    got = decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, **case.kwargs, **kw)
    assert got is out
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_formats_at_block_edges(fmt):
    case = make_case(edges(fmt), fmt=fmt, seed=1)
    assert_close(run(case, num_splits=3), case.reference(), fmt)
    assert (run(case, num_splits=3)[0] == 0).all()  # length 0: zeros, not NaN


@pytest.mark.parametrize("fmt,quant_group", [("int8", 64), ("int8", 32), ("int4", 64)])
def test_groups_of_32_and_64_at_head_dim_128_at_block_edges(fmt, quant_group):
    # int8 groups of 64 scale 64-channel chunks' code dots ("chunk"); groups of 32 and int4 groups
    # read a scale a run of 32 channels ("group"). Three KV heads: the per-head scale rows differ.
    axes = S.split_axes("bf16", fmt, "bf16", 128, quant_group=quant_group)
    n = S.block_n(128, S.split_tiles(fmt, 128, axes["scales"])[0])
    case = make_case([n - 1, 1, n, 0, n + 1, 3 * n + 5], fmt=fmt, head_dim=128, quant_group=quant_group,
                     kv_heads=3, group=2, seed=21)
    assert_close(run(case, num_splits=2), case.reference(), f"{fmt} g{quant_group} ({axes['scales']})")


def test_int8_chunk_variant_with_window_sinks_req_idx_and_two_head_blocks():
    # group 20 > BLOCK_H: two head blocks a KV head; window and sinks through the chunked loop
    case = make_case([0, 130, 7, 260], fmt="int8", head_dim=128, quant_group=64, kv_heads=2, group=20,
                     req_idx=True, page_size=32, seed=22)
    sinks = torch.randn(case.q.shape[1]) * 2
    out = run(case, window=100, sinks=sinks, num_splits=3)
    assert_close(out, case.reference(window=100, sinks=sinks), "int8 chunk window sinks")
    assert (out[0] == 0).all()


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


@pytest.mark.parametrize("fmt,head_dim,quant_group", [(f, 64, 32) for f in FORMATS] + [("int4", 128, 128),
                                                                                     ("int8", 128, 64)])
def test_head_major_cache_views(fmt, head_dim, quant_group):
    # Caches and scales stored [pages, kv_heads, page_size, dim] (each head's page contiguous) and
    # passed as their [pages, page_size, kv_heads, dim] views: store_kv writes through the views and
    # decode reads them by their strides, bit for bit what it computes from a token-major cache.
    lens = [65, 0, 1, 63, 129]  # both sides of 64- and 128-token tiles
    kw = dict(fmt=fmt, head_dim=head_dim, quant_group=quant_group, kv_heads=3, group=2, seed=31)
    hm, tm = make_case(lens, head_major=True, **kw), make_case(lens, **kw)
    assert hm.k_cache.stride(2) == hm.k_cache.shape[1] * hm.k_cache.shape[3]  # head-major storage
    assert torch.equal(_bits(hm.k_cache), _bits(tm.k_cache)) and torch.equal(_bits(hm.v_cache), _bits(tm.v_cache))
    for key in ("k_scale", "v_scale"):
        if fmt in ("int8", "int4"):
            assert not hm.kwargs[key].is_contiguous() and torch.equal(hm.kwargs[key], tm.kwargs[key])
    out = run(hm, num_splits=2)
    assert_close(out, hm.reference(), f"{fmt} head-major")
    assert torch.equal(out, run(tm, num_splits=2))


@pytest.mark.parametrize("fmt", ["bf16", "int4"])
def test_long_sequence_many_splits(fmt):
    case = make_case([2500, 70], fmt=fmt, kv_heads=1, group=8, head_dim=128, page_size=64, seed=2)
    assert_close(run(case, num_splits=5), case.reference(), fmt)


def test_default_split_count_and_one_split_agree():
    case = make_case([300, 5, 64], fmt="bf16", seed=3)
    ref = case.reference()
    assert_close(run(case), ref, "default splits")
    assert_close(run(case, num_splits=1), ref, "one split")


@pytest.mark.parametrize("fmt", ["fp16", "int8"])
def test_req_idx_rows(fmt):
    case = make_case([40, 0, 129], fmt=fmt, req_idx=True, seed=4)
    assert_close(run(case, num_splits=2), case.reference(), fmt)


@pytest.mark.parametrize("window", [1, 50, 64, 1000])
def test_window(window):
    case = make_case([0, 1, 49, 200], fmt="bf16", seed=5)
    assert_close(run(case, window=window, num_splits=3), case.reference(window=window), f"window {window}")


def test_sinks_and_sm_scale():
    case = make_case([0, 3, 90], fmt="fp16", seed=6)
    # Seeded and shifted up: every head's sink holds a share of 90 tokens' mass an fp16 row shows
    sinks = torch.randn(case.q.shape[1], generator=torch.Generator().manual_seed(6)) + 3
    out = run(case, sinks=sinks, sm_scale=0.3, num_splits=2)
    assert_close(out, case.reference(sinks=sinks, sm_scale=0.3), "sinks")
    assert (out[0] == 0).all()
    # The sink only takes probability mass: every head's row shrinks against the same call without it.
    plain = run(case, sm_scale=0.3, num_splits=2)
    assert (out[2].float().norm(dim=-1) < plain[2].float().norm(dim=-1)).all()
    assert not torch.allclose(out[2].float(), plain[2].float(), atol=1e-3)


@pytest.mark.parametrize("kv_heads,group", [(4, 1), (2, 4), (1, 8), (1, 32)])
def test_gqa_groups_and_mqa(kv_heads, group):
    case = make_case([17, 100], fmt="bf16", kv_heads=kv_heads, group=group, seed=7)
    assert_close(run(case, num_splits=2), case.reference(), f"{kv_heads}x{group}")


@pytest.mark.parametrize("head_dim,fmt", [(96, "bf16"), (96, "int4"), (96, "fp8_e4m3"), (128, "int8"),
                                          (256, "fp16"), (256, "int4")])
def test_head_dims(head_dim, fmt):
    lens = edges(fmt, head_dim)[:5]
    case = make_case(lens, fmt=fmt, head_dim=head_dim, kv_heads=1, group=2, seed=8)
    assert_close(run(case, num_splits=2), case.reference(), f"{fmt} d{head_dim}")


@pytest.mark.parametrize("head_dim,quant_group", [(64, 16), (96, 8), (96, 32), (256, 8), (256, 64), (256, 128)])
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quant_groups_at_other_head_dims(fmt, head_dim, quant_group):
    """Both per-group scale reads away from head_dim 128: rows of head_dim / group scales
    (groups of 8-32, head_dim 96 leaving runs past its 12 unused), in place for 64 and 128."""
    lens = edges(fmt, head_dim)[1:5]
    case = make_case(lens, fmt=fmt, head_dim=head_dim, quant_group=quant_group, kv_heads=2, group=2, seed=head_dim)
    assert_close(run(case, num_splits=2), case.reference(), f"{fmt} d{head_dim} group {quant_group}")


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_page_sizes(page_size, fmt):
    case = make_case([1, 65, 150], fmt=fmt, page_size=page_size, seed=9)
    assert_close(run(case, num_splits=2), case.reference(), f"{fmt} page {page_size}")


@pytest.mark.parametrize("fmt", ["bf16", "int4", "fp8_e5m2"])
def test_token_level_cache(fmt):
    case = make_case([0, 70, 9], fmt=fmt, token_level=True, req_idx=True, seed=10)
    assert case.k_cache.dim() == 3
    assert_close(run(case, num_splits=2), case.reference(), fmt)


@pytest.mark.parametrize("quant_group,scale_dtype", [(8, "fp32"), (32, "bf16"), (64, "fp16"), (128, "fp32")])
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quant_groups_and_scale_dtypes(fmt, quant_group, scale_dtype):
    case = make_case([65, 3], fmt=fmt, head_dim=128, quant_group=quant_group, scale_dtype=scale_dtype,
                     kv_heads=1, group=4, seed=11)
    assert_close(run(case), case.reference(), f"{fmt} g{quant_group} {scale_dtype}")


@pytest.mark.parametrize("tile", ["narrow", "wide"])
def test_int4_one_scale_a_token_in_both_tiles(monkeypatch, tile):
    """int4 with one scale a token at head_dim 128 has a 64-token 2-warp tile and a 128-token 4-warp
    one, chosen by how many programs the grid holds (spec.choose_tile); the interpreter's SM count
    takes narrow, and a threshold no grid reaches forces wide. Lengths straddle both tiles."""
    from aotc.loader.ops import decode as op
    from aotc.loader.ops.rules import PlanCache

    if tile == "wide":
        monkeypatch.setattr(S, "NARROW_PROGRAMS_PER_SM", 1 << 30)
    monkeypatch.setattr(op, "_plans", PlanCache())
    case = make_case([1, 63, 64, 65, 127, 128, 129, 300], fmt="int4", head_dim=128, quant_group=128,
                     kv_heads=1, group=4, seed=31)
    assert_close(run(case, num_splits=2), case.reference(), f"int4 per token, {tile} tile")
    (plan,) = op._plans.values()
    assert plan.split_axes["tile"] == tile and plan.split_axes["scales"] == "token"


@pytest.mark.parametrize("fp8_scale", [None, "scalar"])
def test_fp8_scalar_or_no_scale(fp8_scale):
    case = make_case([66, 2], fmt="fp8_e4m3", fp8_scale=fp8_scale, seed=12)
    assert_close(run(case), case.reference(), f"fp8 scale {fp8_scale}")


def test_fp16_query_on_quantized_and_raw_byte_caches():
    case = make_case([80, 1], fmt="int8", q_dtype=torch.float16, seed=13)
    assert_close(run(case), case.reference(), "int8 fp16")
    case = make_case([80, 1], fmt="fp8_e5m2", q_dtype=torch.float16, seed=13)
    raw = dict(case.kwargs, kv_format="fp8_e5m2")
    out = decode(case.q, case.k_cache.view(torch.uint8), case.v_cache.view(torch.uint8), case.table,
                 case.seq_lens, **raw)
    assert_close(out, case.reference(), "fp8 bytes")
    case = make_case([80, 1], fmt="int4", seed=13)
    out = decode(case.q, case.k_cache.view(torch.int8), case.v_cache.view(torch.int8), case.table,
                 case.seq_lens, **case.kwargs)  # auto: int8 with head_dim // 2 is int4
    assert_close(out, case.reference(), "int4 as int8")


def test_strided_query_and_output():
    case = make_case([70, 4], fmt="bf16", seed=14)
    qkv = torch.randn(2, case.q.shape[1] * 3, 64).to(torch.bfloat16)
    q = qkv[:, : case.q.shape[1]]
    out_buf = torch.full((2, case.q.shape[1] * 2, 64), float("nan"), dtype=torch.bfloat16)
    out = out_buf[:, ::2]
    decode(q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out)
    case.q = q
    assert_close(out, case.reference(), "strided")
    assert out_buf[:, 1::2].isnan().all()  # nothing written between the rows


# --- store_kv -------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,quant_group,scale_dtype", [("int8", 32, "fp16"), ("int8", 128, "fp32"),
                                                         ("int4", 8, "bf16"), ("int4", 64, "fp16")])
def test_store_kv_matches_torch_quantization(fmt, quant_group, scale_dtype):
    tokens, kv_heads, head_dim, page_size, pages = 10, 2, 128, 4, 5
    k = torch.randn(tokens, kv_heads, head_dim).to(torch.bfloat16) * 3
    v = torch.randn(tokens, kv_heads, head_dim).to(torch.bfloat16)
    k[0, 0, :quant_group] = 0  # an all-zero group: scale 0, codes 0
    last = head_dim // 2 if fmt == "int4" else head_dim
    k_cache = torch.full((pages, page_size, kv_heads, last), 99, dtype=torch.int8)
    v_cache = k_cache.clone()
    scales = torch.full((pages, page_size, kv_heads, head_dim // quant_group), -1.0, dtype=DTYPES[scale_dtype])
    k_scale, v_scale = scales, scales.clone()
    slots = torch.randperm(pages * page_size)[:tokens].to(torch.int32)
    store_kv(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale, kv_format=fmt)
    page, off = slots.long() // page_size, slots.long() % page_size
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        codes, want_scale = R.quantize_reference(x, fmt, quant_group, DTYPES[scale_dtype])
        stored = R.pack_int4(codes) if fmt == "int4" else codes
        assert torch.equal(cache[page, off], stored)
        assert torch.equal(scale[page, off], want_scale)
        real = R.dequantize(cache[page, off], fmt, scale[page, off])
        step = want_scale.float().repeat_interleave(quant_group, -1)
        assert ((real - x.float()).abs() <= step / 2 + 1e-6).all()  # round to nearest
    untouched = torch.ones(pages * page_size, dtype=torch.bool)
    untouched[slots.long()] = False
    assert (k_cache.flatten(0, 1)[untouched] == 99).all()


@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "fp8_e5m2"])
def test_store_kv_float_and_fp8(fmt):
    k = torch.randn(6, 2, 64).to(torch.bfloat16) * 100
    k[0, 0, 0] = 1e5  # past both fp8 ranges: saturates, never NaN or inf
    cache = torch.zeros(3, 4, 2, 64, dtype=FP8.get(fmt, torch.bfloat16))
    v_cache = cache.clone()
    scale = torch.tensor([0.5, 2.0]) if fmt in FP8 else None
    slots = torch.tensor([11, 0, 5, 6, 3, 8], dtype=torch.int32)
    store_kv(k, k, cache, v_cache, slots, k_scale=scale, v_scale=scale)
    got = R.dequantize(cache.flatten(0, 1)[slots.long()], fmt, scale)
    assert not got.isnan().any()
    if fmt == "bf16":
        assert torch.equal(cache.flatten(0, 1)[slots.long()], k)
    else:
        limit = 448.0 if fmt == "fp8_e4m3" else 57344.0
        want = (k.float() / scale.view(-1, 1)).clamp(-limit, limit)
        assert torch.equal(got, want.to(FP8[fmt]).float() * scale.view(-1, 1))
    assert torch.equal(cache, v_cache)


# --- torch.compile --------------------------------------------------------------------------


def test_fullgraph_compile_traces_both_ops():
    case = make_case([20, 70], fmt="int8", seed=15)
    k_new = torch.randn(2, 2, 64).to(torch.bfloat16)
    slots = torch.tensor([5, 6], dtype=torch.int32)

    def step(q, k_cache, v_cache, k_scale, v_scale, table, seq_lens):
        store_kv(k_new, k_new, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
        return decode(q, k_cache, v_cache, table, seq_lens, k_scale=k_scale, v_scale=v_scale) * 2

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    args = (case.q, case.k_cache, case.v_cache, case.kwargs["k_scale"], case.kwargs["v_scale"], case.table,
            case.seq_lens)
    eager_args = [a.clone() for a in args]
    got = compiled(*args)
    want = step(*eager_args)
    assert torch.equal(got, want)
    assert torch.equal(args[1], eager_args[1]) and torch.equal(args[3], eager_args[3])  # store_kv mutated


# --- bad input ------------------------------------------------------------------------------


def _good():
    case = make_case([10, 20], fmt="int8", seed=16)
    return dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, table=case.table, seq_lens=case.seq_lens,
                **case.kwargs)


def _call(**over):
    kw = _good()
    kw.update(over)
    return decode(**kw)


@pytest.mark.parametrize("over,exc,match", [
    (lambda g: dict(q=g["q"].float()), TypeError, "q must be of dtype"),
    (lambda g: dict(q=g["q"][0]), ValueError, "q must be 3-D"),
    (lambda g: dict(q=g["q"][..., :48]), ValueError, "head_dim 48"),
    (lambda g: dict(q=g["q"][:1].expand(65536, -1, -1)), ValueError, "q: batch 65536 is over 65535"),
    (lambda g: dict(q=g["q"].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "q must be contiguous in its last dim"),
    (lambda g: dict(q=g["q"][:, :7]), ValueError, r"q_heads \(7\) must be a multiple of kv_heads \(2\)"),
    (lambda g: dict(k_cache=g["k_cache"].float(), v_cache=g["v_cache"].float()), TypeError, "k_cache: cannot infer"),
    (lambda g: dict(v_cache=g["v_cache"][:1]), ValueError, "v_cache"),
    (lambda g: dict(k_cache=g["k_cache"][..., :40], v_cache=g["v_cache"][..., :40]), ValueError, "k_cache: last dim 40"),
    (lambda g: dict(kv_format="int3"), ValueError, "kv_format"),
    (lambda g: dict(kv_format="int4"), ValueError, "k_cache: last dim 64, expected 32"),
    (lambda g: dict(kv_format="bf16"), TypeError, "k_cache: a bf16 cache must have dtype"),
    (lambda g: dict(kv_format="fp8_e4m3"), ValueError, "k_scale: an fp8 scale is a scalar or"),
    (lambda g: dict(k_scale=None), ValueError, "needs k_scale"),
    (lambda g: dict(k_scale=g["k_scale"].to(torch.int32)), TypeError, "k_scale must be of dtype"),
    (lambda g: dict(k_scale=g["k_scale"][..., :1].expand(*g["k_scale"].shape[:-1], 3)), ValueError, "group"),
    (lambda g: dict(table=g["table"].long()), TypeError, "table must be of dtype"),
    (lambda g: dict(k_cache=g["k_cache"][:, :12], v_cache=g["v_cache"][:, :12], k_scale=g["k_scale"][:, :12],
                    v_scale=g["v_scale"][:, :12]), ValueError, "k_cache: page size 12 .* is not a power of two"),
    (lambda g: dict(seq_lens=g["seq_lens"][:1]), ValueError, "seq_lens"),
    (lambda g: dict(seq_lens=g["seq_lens"] + 1000), ValueError, r"seq_lens\[0\] = 1010 is outside"),
    (lambda g: dict(seq_lens=g["seq_lens"] - 11), ValueError, r"seq_lens\[0\] = -1"),
    (lambda g: dict(req_idx=torch.tensor([0, 5], dtype=torch.int32)), ValueError, r"req_idx\[1\] = 5"),
    (lambda g: dict(table=g["table"] + 1000), ValueError, "is not a page"),
    (lambda g: dict(sinks=torch.zeros(8, dtype=torch.bfloat16)), TypeError, "sinks must be of dtype"),
    (lambda g: dict(sinks=torch.zeros(3)), ValueError, "sinks"),
    (lambda g: dict(out=torch.empty(2, 8, 64)), TypeError, "out must be of dtype"),
    (lambda g: dict(out=torch.empty(2, 4, 64, dtype=torch.bfloat16)), ValueError, "out: shape"),
    (lambda g: dict(window=0), ValueError, "window"),
    (lambda g: dict(sm_scale=float("nan")), ValueError, "sm_scale"),
    (lambda g: dict(num_splits=513), ValueError, "num_splits"),
    (lambda g: dict(q=g["q"].to("meta")), ValueError, "k_cache must be on meta"),
])
def test_bad_input_names_the_argument(over, exc, match):
    with pytest.raises(exc, match=match):
        _call(**over(_good()))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_int_caches_with_odd_strides_or_addresses_are_refused(fmt):
    """int8/int4 caches are read as int16 words: an odd stride or start address is refused before
    any launch (the output keeps its poison), on the planned call and on a repeat of a planned one."""
    case = make_case([10, 20], fmt=fmt, seed=17)
    k, v = case.k_cache, case.v_cache
    out = torch.full_like(case.q, float("nan"))
    decode(case.q, k, v, case.table, case.seq_lens, out=out, **case.kwargs)  # the plan for these shapes

    def odd_stride(t):
        return torch.zeros(*t.shape[:-1], t.shape[-1] + 1, dtype=t.dtype)[..., :t.shape[-1]].copy_(t)

    for over, match in [(dict(k_cache=odd_stride(k)), "k_cache: .* strides must be even"),
                        (dict(v_cache=odd_stride(v)), "v_cache: .* strides must be even")]:
        poison = torch.full_like(case.q, float("nan"))
        kw = {"k_cache": k, "v_cache": v}
        kw.update(over)
        with pytest.raises(ValueError, match=match):
            decode(case.q, kw["k_cache"], kw["v_cache"], case.table, case.seq_lens, out=poison, **case.kwargs)
        assert poison.isnan().all()
    flat = torch.zeros(k.numel() + 1, dtype=k.dtype)
    odd_address = flat[1:].view(k.shape).copy_(k)
    for validate in (True, False):  # validate=False takes the planned path straight to the launch
        poison = torch.full_like(case.q, float("nan"))
        with pytest.raises(ValueError, match="k_cache: .* even address"):
            decode(case.q, odd_address, v, case.table, case.seq_lens, out=poison, validate=validate, **case.kwargs)
        assert poison.isnan().all()


def test_cache_dtype_must_match_a_float_query():
    case = make_case([5], fmt="bf16")
    with pytest.raises(TypeError, match="bf16 cache needs an bf16 query"):
        decode(case.q.half(), case.k_cache, case.v_cache, case.table, case.seq_lens)


def test_bad_store_kv_input():
    g = _good()
    k = torch.randn(2, 2, 64).to(torch.bfloat16)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    ok = dict(k_scale=g["k_scale"], v_scale=g["v_scale"])
    with pytest.raises(TypeError, match="slots must be of dtype"):
        store_kv(k, k, g["k_cache"], g["v_cache"], slots.long(), **ok)
    with pytest.raises(ValueError, match=r"slots\[1\] = 100000 is outside"):
        store_kv(k, k, g["k_cache"], g["v_cache"], torch.tensor([0, 100000], dtype=torch.int32), **ok)
    with pytest.raises(ValueError, match="k: 1 kv heads"):
        store_kv(k[:, :1], k[:, :1], g["k_cache"], g["v_cache"], slots, **ok)
    with pytest.raises(TypeError, match="v must be of dtype"):
        store_kv(k, k.half(), g["k_cache"], g["v_cache"], slots, **ok)
    with pytest.raises(ValueError, match="needs k_scale"):
        store_kv(k, k, g["k_cache"], g["v_cache"], slots)


def test_zero_batch_returns_empty():
    g = _good()
    out = decode(g["q"][:0], g["k_cache"], g["v_cache"], g["table"], g["seq_lens"][:0], k_scale=g["k_scale"],
                 v_scale=g["v_scale"])
    assert out.shape == (0, 8, 64)


def test_default_sm_scale_is_inverse_sqrt_head_dim():
    case = make_case([33], fmt="bf16", seed=17)
    assert torch.equal(run(case), run(case, sm_scale=1 / math.sqrt(64)))


# both sides of each merge tile (4, 16, 64, 256), and the looping merge past 256 (over and under
# its 64-split steps, up to MAX_SPLITS)
@pytest.mark.parametrize("splits", [4, 5, 8, 16, 17, 64, 65, 128, 129, 256, 257, 320, 512])
def test_stale_workspace_is_never_read(monkeypatch, splits):
    """Empty splits leave their partial slots as they were: NaN there must not reach the output."""
    from aotc.loader import workspace

    monkeypatch.setattr(workspace, "get", lambda device, n: torch.full((n,), float("nan"), device=device))
    case = make_case([0, 1, 65, 1000], fmt="bf16", seed=18)
    assert_close(run(case, num_splits=splits), case.reference(), f"NaN workspace, {splits} splits")


def test_wide_merge_over_channel_blocks_with_sinks_and_lse(monkeypatch):
    """65-256 splits at head_dim 128: one 256-split tile a program over four 32-channel blocks; the
    sink and the LSE (written by the first block only) on a NaN workspace, lengths across a tile."""
    from aotc.loader import workspace

    monkeypatch.setattr(workspace, "get", lambda device, n: torch.full((n,), float("nan"), device=device))
    n = S.block_n(128)
    case = make_case([0, 1, n - 1, n + 1, 9 * n + 3], head_dim=128, kv_heads=2, group=4, seed=19)
    sinks = torch.randn(case.q.shape[1]) * 2
    out, lse = torch.full_like(case.q, float("nan")), torch.full(case.q.shape[:2], float("nan"))
    decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, lse=lse, return_lse=True,
           sinks=sinks, num_splits=100, **case.kwargs)
    ref, ref_lse = case.reference(sinks=sinks, return_lse=True)
    assert_close(out, ref, "wide merge")
    assert torch.allclose(lse, ref_lse, atol=2e-3, rtol=1e-3)
