"""decode over int8 caches with per-channel scales (scale_layout="channel": k_scale, v_scale
[kv_heads, head_dim] fp32, the Iluvatar library's layout) on CPU tensors (interpreter), against
the float32 reference that dequantizes (codes * scale[head, channel]) then attends.

Tolerance: cases.assert_close (bf16 2e-2 abs + rel per element, 1e-2 relative norm; fp16 5e-3 /
3e-3), every element; outputs poisoned with NaN first. Scales differ per KV head and channel.
Lengths straddle the 128-token tile (64 at head_dim 256).
"""
import pytest
import torch

from aotc import loader
from aotc.kernels.decode import spec as S
from aotc.loader.ops.decode import decode
from aotc.loader.ops.store_kv import store_kv
from tests.cpu.kernels.decode.cases import assert_close, make_case


def run(case, **kw):
    out = torch.full_like(case.q, float("nan"))
    got = decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, **case.kwargs, **kw)
    assert got is out
    return out


@pytest.mark.parametrize("head_dim", S.HEAD_DIMS)
def test_channel_scales_at_block_edges(head_dim):
    n = S.block_n(head_dim)
    case = make_case([0, 1, n - 1, n, n + 1, 2 * n + 3], fmt="int8", head_dim=head_dim, scale_layout="channel",
                     kv_heads=3, group=2, seed=60)
    out = run(case, num_splits=3)
    assert_close(out, case.reference(), f"channel d{head_dim}")
    assert (out[0] == 0).all()


@pytest.mark.parametrize("page_size", [16, 64])
def test_head_major_cache_with_req_idx_window_and_sinks(page_size):
    # The Iluvatar library's cache: [num_blocks, kv_heads, block_size, D], passed as its
    # .transpose(1, 2) view; fp16 queries; a window and sinks through the per-channel loop.
    case = make_case([300, 0, 17, 129], fmt="int8", head_dim=128, scale_layout="channel", head_major=True,
                     page_size=page_size, req_idx=True, kv_heads=4, group=4, q_dtype=torch.float16, seed=61)
    assert case.k_cache.stride(2) == page_size * 128  # head-major storage
    sinks = torch.randn(case.q.shape[1])
    out = run(case, window=200, sinks=sinks, num_splits=2)
    assert_close(out, case.reference(window=200, sinks=sinks), "head-major channel")


def test_scales_of_different_values_per_kv_head():
    # The review's bug (scales indexed by query head, right only when pre-expanded): each KV head's
    # scales must be its own. Swapping two heads' scale rows changes the answer, and the answer
    # still matches the reference dequantized with the swapped rows.
    case = make_case([70, 129], fmt="int8", scale_layout="channel", kv_heads=2, group=4, seed=62)
    ks, vs = case.kwargs["k_scale"], case.kwargs["v_scale"]
    assert not torch.allclose(ks[0], ks[1])
    base = run(case)
    swapped = dict(case.kwargs, k_scale=ks.flip(0).contiguous(), v_scale=vs.flip(0).contiguous())
    out = torch.full_like(case.q, float("nan"))
    decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, **swapped)
    from aotc.kernels.decode import reference as R

    ref = R.decode_reference(case.q, R.dequantize_per_channel(case.k_cache, swapped["k_scale"]),
                             R.dequantize_per_channel(case.v_cache, swapped["v_scale"]), case.table, case.seq_lens)
    assert_close(out, ref, "swapped head scales")
    assert (out.float() - base.float()).abs().max() > 0.05


def test_store_kv_writes_codes_against_the_channel_scales():
    case = make_case([5], fmt="int8", scale_layout="channel", kv_heads=2, group=1, seed=63)
    ks = case.kwargs["k_scale"]
    k = torch.randn(3, 2, 64).to(torch.bfloat16)
    v = torch.randn(3, 2, 64).to(torch.bfloat16)
    kc, vc = torch.zeros_like(case.k_cache), torch.zeros_like(case.v_cache)
    slots = torch.tensor([0, 17, 40], dtype=torch.int32)
    store_kv(k, v, kc, vc, slots, **case.kwargs)
    want = (k.float() / ks).round().clamp(-127, 127).to(torch.int8)
    assert torch.equal(kc.view(-1, 2, 64)[slots.long()], want)
    assert torch.equal(case.kwargs["k_scale"], ks)  # scales are read, not written


def test_decode_plan_with_channel_scales():
    case = make_case([1, 128, 129], fmt="int8", scale_layout="channel", seed=64)
    ks, vs = case.kwargs["k_scale"], case.kwargs["v_scale"]
    plan = loader.DecodePlan(case.table, case.seq_lens, q=case.q, k_cache=case.k_cache, v_cache=case.v_cache,
                             k_scale=ks, v_scale=vs, scale_layout="channel", return_lse=True)
    out = torch.full_like(case.q, float("nan"))
    _, lse = plan.run(case.q, case.k_cache, case.v_cache, out, ks, vs)
    ref, ref_lse = case.reference(return_lse=True)
    assert_close(out, ref, "plan channel")
    assert (lse - ref_lse).abs().max() < 5e-3
    with pytest.raises(ValueError, match="k_scale"):
        plan.run(case.q, case.k_cache, case.v_cache, out, ks[:, :32], vs)


def _errors():
    return [
        ("fp16 scales", dict(k_scale=lambda s: s.half(), v_scale=lambda s: s.half()), TypeError, "k_scale must be of dtype"),
        ("half the channels", dict(k_scale=lambda s: s[:, :32], v_scale=lambda s: s[:, :32]), ValueError,
         r"k_scale: per-channel scales are \[kv_heads, head_dim\]"),
        ("query heads", dict(k_scale=lambda s: s.repeat(4, 1), v_scale=lambda s: s.repeat(4, 1)), ValueError,
         r"k_scale: per-channel"),
        ("channels strided", dict(k_scale=lambda s: s.t().contiguous().t(), v_scale=lambda s: s), ValueError,
         "k_scale must be contiguous in its last dim"),
        ("v only", dict(v_scale=lambda s: s[:1]), ValueError, "v_scale"),
        ("unknown layout", dict(scale_layout=lambda s: "token"), ValueError, "scale_layout must be one of"),
        ("group layout", dict(scale_layout=lambda s: "group"), ValueError, "k_scale: shape"),
    ]


@pytest.mark.parametrize("what,change,exc,match", _errors(), ids=[e[0] for e in _errors()])
def test_bad_channel_scales_are_refused(what, change, exc, match):
    case = make_case([5], fmt="int8", scale_layout="channel", kv_heads=2, group=2, seed=65)
    kw = dict(case.kwargs)
    for name, f in change.items():
        kw[name] = f(kw[name])
    with pytest.raises(exc, match=match):
        decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, **kw)


def test_channel_layout_is_for_int8_only():
    case = make_case([5], fmt="int4", seed=66)
    with pytest.raises(ValueError, match="scale_layout='channel'.*int8"):
        decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, scale_layout="channel",
               k_scale=torch.ones(2, 64), v_scale=torch.ones(2, 64))
    with pytest.raises(ValueError, match="per-channel scales are for int8"):
        S.split_axes("bf16", "int8", "bf16", 128, channel=True)


def test_fullgraph_compile_with_lse_and_channel_scales():
    case = make_case([20, 130], fmt="int8", scale_layout="channel", seed=67)

    def step(q, k_cache, v_cache, k_scale, v_scale, table, seq_lens):
        out, lse = decode(q, k_cache, v_cache, table, seq_lens, k_scale=k_scale, v_scale=v_scale,
                          scale_layout="channel", return_lse=True)
        return out * 2, lse + 1

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    args = (case.q, case.k_cache, case.v_cache, case.kwargs["k_scale"], case.kwargs["v_scale"], case.table,
            case.seq_lens)
    got, want = compiled(*args), step(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
