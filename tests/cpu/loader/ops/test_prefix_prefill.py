"""The public prefix_prefill op: argument checking (before any launch), the custom op's schema
and fake implementation, and one result through it on the interpreter."""
import pytest
import torch

from aotc.kernels.prefix_prefill.reference import prefix_prefill_ref
from aotc.loader.ops import prefix_prefill as op
from tests.cpu.kernels.prefix_prefill.cases import assert_matches, make_case


@pytest.fixture
def good():
    case, kw = make_case([0, 17, 40], [5, 1, 12], q_heads=4, kv_heads=2, head_dim=64, block_size=16, seed=2)
    return case, kw


@pytest.fixture
def no_launch(monkeypatch):
    """Fails the test if a kernel would launch: errors must come first."""
    import aotc.loader.dispatch as dispatch

    def boom(*a, **k):
        raise AssertionError("launched a kernel despite bad input")

    monkeypatch.setattr(dispatch, "run_kernel", boom)


def _nhd_cache(nb=4, bs=16, h=2, d=64, dtype=torch.float16):
    return torch.randn(nb, bs, h, d).to(dtype)


BAD = [  # (name, change(case, kw), exception, words the message must hold)
    ("q dtype", lambda c, k: c.update(q=c["q"].float()), TypeError, "q must be of dtype"),
    ("q not a tensor", lambda c, k: c.update(q=c["q"].tolist()), TypeError, "q must be a torch.Tensor"),
    ("k dtype", lambda c, k: c.update(k=c["k"].bfloat16()), TypeError, "k must be of dtype"),
    ("head_dim", lambda c, k: c.update(q=c["q"][..., :44], k=c["k"][..., :44], v=c["v"][..., :44]), ValueError,
     "head_dim) must be a multiple of 8"),
    ("kv heads", lambda c, k: c.update(q=c["q"][:, :3]), ValueError, "kv_heads"),
    ("v shape", lambda c, k: c.update(v=c["v"][:-1]), ValueError, "v must be shaped like k"),
    ("q last dim strided", lambda c, k: c.update(q=torch.randn(22, 4, 128).half()[..., ::2]), ValueError,
     "q must be contiguous in its last dim"),
    ("layout name", lambda c, k: k.update(kv_layout="nhwc"), ValueError, "kv_layout"),
    ("hnd shape", lambda c, k: k.update(kv_layout="hnd"), ValueError, "[num_blocks, 2, block_size, 64] (hnd layout"),
    ("kv_format name", lambda c, k: k.update(kv_format="int2"), ValueError, "kv_format must be"),
    ("kv_format vs q", lambda c, k: k.update(kv_format="bf16"), ValueError, "kv_format must be q's dtype"),
    ("cache heads", lambda c, k: c.update(k_cache=c["k_cache"][:, :, :1]), ValueError, "k_cache must be"),
    ("cache dtype", lambda c, k: c.update(k_cache=c["k_cache"].bfloat16()), TypeError, "k_cache must have dtype"),
    ("v cache shape", lambda c, k: c.update(v_cache=c["v_cache"][:-1]), ValueError, "v_cache must be"),
    ("fp8 without scales", lambda c, k: c.update(k_cache=c["k_cache"].to(torch.float8_e4m3fn),
                                                 v_cache=c["v_cache"].to(torch.float8_e4m3fn)),
     ValueError, "k_scale is required"),
    ("scale on fp16 cache", lambda c, k: k.update(k_scale=torch.ones(1)), ValueError, "k_scale applies to fp8"),
    ("block_table dtype", lambda c, k: c.update(block_table=c["block_table"].long()), TypeError, "block_table"),
    ("query_start_loc length", lambda c, k: c.update(query_start_loc=c["query_start_loc"][:-1]), ValueError,
     "query_start_loc must be [batch + 1]"),
    ("seq_lens length", lambda c, k: c.update(seq_lens=c["seq_lens"][:-1]), ValueError, "seq_lens must be [batch]"),
    ("seq_lens dtype", lambda c, k: c.update(seq_lens=c["seq_lens"].long()), TypeError, "seq_lens"),
    ("window type", lambda c, k: k.update(window=2.5), TypeError, "window must be an int"),
    ("window negative", lambda c, k: k.update(window=-1), ValueError, "window must be"),
    ("sinks shape", lambda c, k: k.update(sinks=torch.zeros(3)), ValueError, "sinks must be [q_heads]"),
    ("sinks dtype", lambda c, k: k.update(sinks=torch.zeros(4).half()), TypeError, "sinks"),
    ("out_scale size", lambda c, k: k.update(out_scale=torch.ones(2)), ValueError, "out_scale must be a one-element"),
    ("out dtype", lambda c, k: k.update(out=torch.empty(22, 4, 64)), TypeError, "out must be of dtype"),
    ("fp8 out without scale", lambda c, k: k.update(out=torch.empty(22, 4, 64).to(torch.float8_e4m3fn)), TypeError,
     "out must be of dtype"),
    ("out shape", lambda c, k: k.update(out=torch.empty(21, 4, 64).half()), ValueError, "out must be shaped like q"),
    ("sm_scale", lambda c, k: k.update(sm_scale=float("nan")), ValueError, "sm_scale"),
    ("device", lambda c, k: c.update(seq_lens=c["seq_lens"].to("meta")), ValueError, "seq_lens must be on cpu"),
    # Data checks (the metadata is on the CPU here, so they run by default):
    ("qsl start", lambda c, k: c["query_start_loc"].add_(1), ValueError, "query_start_loc[0] must be 0"),
    ("qsl order", lambda c, k: c["query_start_loc"].copy_(torch.tensor([0, 5, 4, 18])), ValueError, "non-decreasing"),
    ("qsl past q", lambda c, k: c["query_start_loc"].copy_(torch.tensor([0, 5, 6, 30])), ValueError,
     "query_start_loc[-1] must be <= q.shape[0]"),
    ("seq shorter than new", lambda c, k: c["seq_lens"].copy_(torch.tensor([5, 0, 52])), ValueError,
     "seq_lens[1] must be >= its 1 new tokens"),
    ("context past the table", lambda c, k: c["seq_lens"].copy_(torch.tensor([5, 18, 200])), ValueError,
     "block_table's width"),
    ("block id", lambda c, k: c["block_table"].__setitem__((1, 1), 999), ValueError, "block ids in [0,"),
]


@pytest.mark.parametrize("name,change,exc,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_before_launch(good, no_launch, name, change, exc, words):
    case, kw = good
    change(case, kw)
    with pytest.raises(exc, match=None) as info:
        op.prefix_prefill(**case, **kw)
    assert words in str(info.value), str(info.value)


def test_vllm_layout_shape_and_stride_checks(good, no_launch):
    case, kw = make_case([20], [3], layout="vllm", seed=4)
    k = case["k_cache"]
    bad_k = torch.cat([k, k], dim=-1)[..., : k.shape[-1]]  # right shape, token stride 2x instead of x
    with pytest.raises(ValueError, match="k_cache must be contiguous in its last two dims"):
        op.prefix_prefill(**dict(case, k_cache=bad_k), **kw)
    with pytest.raises(ValueError, match="v_cache must be"):
        op.prefix_prefill(**dict(case, v_cache=case["v_cache"].transpose(2, 3)), **kw)


def test_result_through_the_op_and_the_registered_custom_op(good):
    case, kw = good
    out = op.prefix_prefill(**case, **kw, sm_scale=0.3, window=9)
    assert_matches(out, prefix_prefill_ref(**case, **kw, sm_scale=0.3, window=9), torch.float16)
    out2 = torch.full_like(out, float("nan"))
    torch.ops.aotc.prefix_prefill(*case.values(), out2, "nhd", "auto", None, None, 0.3, 9, None, None, False, True,
                                  0, None, False, 0.0)
    assert torch.equal(out, out2)


def test_custom_op_schema_and_fake_impl(good):
    case, kw = good
    out = torch.empty_like(case["q"])
    sinks = torch.randn(4)
    args = (*case.values(), out, "nhd", "auto", None, None, 0.125, 0, sinks, None, False, True, 0, None, False, 0.0)
    torch.library.opcheck(torch.ops.aotc.prefix_prefill.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in case.values()]
        got = op.prefix_prefill(*fake, validate=False)  # shapes only: nothing is read
    assert got.shape == case["q"].shape and got.dtype == case["q"].dtype


def _int_case(fmt="int8", scales="token", layout="nhd"):
    return make_case([0, 17, 40], [5, 1, 12], kv_format=fmt, scales=scales, layout=layout, seed=5)


def _groups(scale, n):
    """A per-token scale tensor widened (or narrowed) to n groups a token."""
    return scale.expand(*scale.shape[:-1], max(n, 1)).contiguous()[..., :n]


INT_BAD = [  # int8/int4 caches: (name, change(case, kw), exception, words)
    ("missing scale", lambda c, k: k.pop("v_scale"), ValueError, "v_scale is required for an int8/int4 cache"),
    ("scale dtype", lambda c, k: k.update(k_scale=k["k_scale"].double(), v_scale=k["v_scale"].double()), TypeError,
     "k_scale must have dtype"),
    ("scales differ", lambda c, k: k.update(v_scale=k["v_scale"].half()), ValueError, "v_scale must be k_scale's"),
    ("groups not dividing D", lambda c, k: k.update(k_scale=_groups(k["k_scale"], 3), v_scale=_groups(k["v_scale"], 3)),
     ValueError, "a group must be a power of two in [8, 128] dividing head_dim (64)"),
    ("groups of 4", lambda c, k: k.update(k_scale=_groups(k["k_scale"], 16), v_scale=_groups(k["v_scale"], 16)),
     ValueError, "gives groups of head_dim / 16 channels (64 / 16)"),
    ("groups not contiguous", lambda c, k: k.update(k_scale=k["k_scale"].expand(*k["k_scale"].shape[:-1], 4),
                                                    v_scale=k["v_scale"].expand(*k["v_scale"].shape[:-1], 4)),
     ValueError, "contiguous in its last dim (the groups of a token)"),
    ("no groups", lambda c, k: k.update(k_scale=_groups(k["k_scale"], 0), v_scale=_groups(k["v_scale"], 0)),
     ValueError, "plus a last dim of head_dim // group"),
    ("channel scale shape", lambda c, k: k.update(k_scale=torch.ones(2, 32), v_scale=torch.ones(2, 32)), ValueError,
     "[kv_heads, head_dim] = [2, 64]"),
    ("int8 in vllm layout", lambda c, k: k.update(kv_layout="vllm"), ValueError, "k_cache must be 5-D"),
    ("odd strides", lambda c, k: c.update(k_cache=torch.zeros(*c["k_cache"].shape[:3], 65, dtype=torch.int8)[..., :64],
                                          v_cache=torch.zeros(*c["k_cache"].shape[:3], 65, dtype=torch.int8)[..., :64]),
     ValueError, "strides must be even"),
    ("odd address", lambda c, k: c.update(k_cache=torch.zeros(c["k_cache"].numel() + 1, dtype=torch.int8)[1:].view(
        c["k_cache"].shape)), ValueError, "k_cache must start at an even address"),
    ("int4 as int8 width", lambda c, k: k.update(kv_format="int4"), ValueError, "k_cache must be"),
]


@pytest.mark.parametrize("name,change,exc,words", INT_BAD, ids=[b[0] for b in INT_BAD])
def test_bad_int_cache_input_is_refused_before_launch(no_launch, name, change, exc, words):
    case, kw = _int_case()
    change(case, kw)
    with pytest.raises(exc) as info:
        op.prefix_prefill(**case, **kw)
    assert words in str(info.value), str(info.value)


def test_vllm_layout_x_is_read_from_the_shape(no_launch):
    case, kw = make_case([20], [3], layout="vllm", head_dim=64, seed=4)
    k = case["k_cache"]  # x = 8 for fp16
    bad = k.reshape(k.shape[0], k.shape[1], k.shape[2] * 2, k.shape[3], 4)  # x = 4: not a multiple of 8
    with pytest.raises(ValueError, match="x a multiple of 8"):
        op.prefix_prefill(**dict(case, k_cache=bad), **kw)


def test_uint8_fp8_cache_needs_an_explicit_format(no_launch):
    case, kw = make_case([20], [3], layout="vllm", cache_dtype=torch.float8_e4m3fn, x=8, seed=4)
    case = dict(case, k_cache=case["k_cache"].view(torch.uint8), v_cache=case["v_cache"].view(torch.uint8))
    with pytest.raises(TypeError, match="fp8 stored as bytes needs kv_format"):
        op.prefix_prefill(**case, **kw)


def test_more_q_blocks_than_the_grid_holds_are_refused(good, no_launch, monkeypatch):
    """Float caches put the q blocks on the grid's second axis (65535 at most on CUDA): a call with
    more tokens than that holds is refused naming q; int caches (q blocks on the first axis) are not
    limited by it."""
    case, kw = good
    monkeypatch.setattr(op, "_GRID_Y_MAX", 2)  # the case has 3 requests: 3 q blocks
    with pytest.raises(ValueError, match=r"prefix_prefill: q must be at most 2 q blocks in one call: tokens // 128 \+ requests.*got 18 tokens in 3 requests"):
        op.prefix_prefill(**case, **kw)
    axes, grid, _ = op.launch_plan(*_int8_plan(case), None, None, False)
    assert axes["kv"] == "int8" and grid[0] == 3


def _int8_plan(case):
    kc = torch.randint(-127, 128, case["k_cache"].shape, dtype=torch.int8)
    vc = torch.randint(-127, 128, case["v_cache"].shape, dtype=torch.int8)
    ks = torch.rand(*kc.shape[:-1], 1) + 0.5
    return (case["q"], case["k"], case["v"], kc, vc, case["block_table"], case["query_start_loc"], case["seq_lens"],
            torch.empty_like(case["q"]), "nhd", "int8", ks, ks.clone(), 0.125, None)
