"""Decode over vLLM 0.33's INT4_PER_TOKEN_HEAD cache (kv_format "int4_rht"), on the interpreter.

Caches are written by the reference writer (kernels/common/int4_rht.write: rotation, asymmetric
nibbles, zero point in the scale word), in two layouts: codes and scale words apart, and one
buffer per (token, head) [K codes | K scale | V codes | V scale] (D // 2 + 4 bytes each: V and the
scales 4-byte aligned only). The reference is decode_reference over the dequantized, unrotated
values. Tolerance: 2e-2 absolute and relative (measured: <= 0.009 bf16, 0.0016 fp16 at |out|
~3; q', the rotated output and the output are each rounded to q's dtype, the probabilities times
V's scale to fp16); outputs start NaN.
"""
import pytest
import torch

from aotc import loader
from aotc.kernels.common import int4_rht as F
from aotc.kernels.decode import reference as R

TOL = dict(atol=2e-2, rtol=2e-2)


def int4_cache(k, v, inline=False):
    """k, v [pages, page_size, kv_heads, D] -> (k codes, v codes, k words [..., 1], v words [..., 1],
    k_real, v_real)."""
    (kp, kw), (vp, vw) = F.write(k), F.write(v)
    d2 = kp.shape[-1]
    if inline:
        raw = torch.zeros(*kp.shape[:-1], 2 * (d2 + 4), dtype=torch.uint8, device=k.device)
        raw[..., :d2], raw[..., d2 + 4:2 * d2 + 4] = kp, vp
        f32 = raw.view(torch.float32)
        f32[..., d2 // 4], f32[..., (2 * d2 + 4) // 4] = kw, vw
        kc, vc = raw[..., :d2], raw[..., d2 + 4:2 * d2 + 4]
        ks, vs = f32[..., d2 // 4:d2 // 4 + 1], f32[..., (2 * d2 + 4) // 4:(2 * d2 + 4) // 4 + 1]
    else:
        kc, vc, ks, vs = kp, vp, kw[..., None], vw[..., None]
    return kc, vc, ks, vs, F.dequantize(kp, kw), F.dequantize(vp, vw)


def problem(lens, head_dim, dtype, kv_heads=2, group=4, page_size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    max_pages = max(1, max(-(-n // page_size) for n in lens))
    pages = len(lens) * max_pages + 2
    table = torch.randperm(pages, generator=g)[: len(lens) * max_pages].view(len(lens), max_pages).to(torch.int32)
    k = torch.randn(pages, page_size, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(pages, page_size, kv_heads, head_dim, generator=g).to(dtype)
    q = torch.randn(len(lens), kv_heads * group, head_dim, generator=g).to(dtype)
    return q, k, v, table, torch.tensor(lens, dtype=torch.int32)


LENS = [1, 63, 64, 65, 200]  # the narrow tile of 64 tokens: 1, block - 1, block, block + 1, long


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("inline", [False, True])
def test_int4_rht_decode(dtype, head_dim, inline):
    q, k, v, table, lens = problem(LENS, head_dim, dtype, seed=head_dim + inline)
    kc, vc, ks, vs, k_real, v_real = int4_cache(k, v, inline)
    if inline:
        assert vc.data_ptr() % 16 != 0 and vs.data_ptr() % 8 != 0
    out = torch.full_like(q, float("nan"))
    got, lse = loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format="int4_rht", out=out,
                             return_lse=True)
    assert got is out
    want, want_lse = R.decode_reference(q, k_real, v_real, table, lens, return_lse=True)
    torch.testing.assert_close(out.float(), want, **TOL)
    torch.testing.assert_close(lse, want_lse, atol=2e-2, rtol=1e-3)
    # the rotation matters: the same codes read unrotated are another answer
    plain = loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format="int4_zp")
    assert float((plain.float() - want).abs().max()) > 0.2


def test_int4_rht_splits_window_sinks_req_idx():
    q, k, v, table, lens = problem([130, 7, 90], 128, torch.bfloat16, kv_heads=1, group=8, page_size=8, seed=3)
    kc, vc, ks, vs, k_real, v_real = int4_cache(k, v)
    sinks = torch.randn(q.shape[1])
    req_idx = torch.tensor([2, 0, 1], dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    loader.decode(q, kc, vc, table, lens, req_idx=req_idx, k_scale=ks, v_scale=vs, kv_format="int4_rht",
                  window=70, sinks=sinks, sm_scale=0.1, num_splits=3, out=out)
    want = R.decode_reference(q, k_real, v_real, table, lens, req_idx=req_idx, window=70, sinks=sinks, sm_scale=0.1)
    torch.testing.assert_close(out.float(), want, **TOL)


def test_int4_zp_matches_reference_over_rotated_values():
    """The kernel's format alone: codes read as (n - zp) * scale, no rotation, against the reference
    over the rotated values (the same values the op reads)."""
    q, k, v, table, lens = problem([65, 1], 64, torch.float16, seed=5)
    (kp, kw), (vp, vw) = F.write(k), F.write(v)
    out = torch.full_like(q, float("nan"))
    loader.decode(q, kp, vp, table, lens, k_scale=kw[..., None], v_scale=vw[..., None], kv_format="int4_zp",
                  out=out, sm_scale=0.02)
    want = R.decode_reference(q, F.dequantize_rotated(kp, kw), F.dequantize_rotated(vp, vw), table, lens,
                              sm_scale=0.02)
    torch.testing.assert_close(out.float(), want, atol=3e-2, rtol=2e-2)


def _bad(**change):
    q, k, v, table, lens = problem([5], 64, torch.bfloat16, seed=1)
    kc, vc, ks, vs, _, _ = int4_cache(k, v)
    args = dict(q=q, k_cache=kc, v_cache=vc, table=table, seq_lens=lens, k_scale=ks, v_scale=vs, kv_format="int4_rht")
    args.update(change)
    return args


@pytest.mark.parametrize("change, error, match", [
    (lambda a: dict(k_scale=a["k_scale"].half()), TypeError, "k_scale"),
    (lambda a: dict(v_scale=a["v_scale"][..., 0]), ValueError, "v_scale"),
    (lambda a: dict(k_scale=None), ValueError, "k_scale"),
    (lambda a: dict(q=torch.zeros(1, 8, 96, dtype=torch.bfloat16), k_cache=torch.zeros(4, 16, 2, 48, dtype=torch.uint8),
                    v_cache=torch.zeros(4, 16, 2, 48, dtype=torch.uint8), k_scale=torch.zeros(4, 16, 2, 1),
                    v_scale=torch.zeros(4, 16, 2, 1)), ValueError, "head_dim 96"),
    (lambda a: dict(q=torch.zeros(1, 8, 80, dtype=torch.bfloat16)), ValueError, "head_dim 80"),
    (lambda a: dict(k_cache=a["k_cache"][..., :16].contiguous(), v_cache=a["v_cache"][..., :16].contiguous()),
     ValueError, "last dim"),
    (lambda a: dict(k_cache=a["k_cache"].half(), v_cache=a["v_cache"].half()), TypeError, "k_cache"),
    (lambda a: dict(q=a["q"].float()), TypeError, "q"),
    (lambda a: dict(alibi_slopes=torch.ones(8)), NotImplementedError, "alibi"),
    (lambda a: dict(softcap=5.0), NotImplementedError, "softcap"),
])
def test_bad_input_raises_before_launch(change, error, match, monkeypatch):
    from aotc.loader.ops import decode_rht, split_merge

    def no_launch(*a, **k):
        raise AssertionError("launched")

    monkeypatch.setattr(split_merge.SplitMerge, "launch", no_launch)
    monkeypatch.setattr(decode_rht, "signs", no_launch)
    args = _bad()
    args.update(change(args))
    q, kc, vc, table, lens = (args.pop(n) for n in ("q", "k_cache", "v_cache", "table", "seq_lens"))
    with pytest.raises(error, match=match):
        loader.decode(q, kc, vc, table, lens, **args)


@pytest.mark.parametrize("head_dim,tile", [(64, "narrow"), (128, "narrow"), (128, "wide")])
def test_int4_rht_split_partials_are_unrotated(head_dim, tile):
    """The RHT split kernel alone, workspace NaN-poisoned: split s's partial output is the attention
    over its own chunk of the real (unrotated) values, its lse base 2, and an empty split writes
    lse = -inf and leaves its partial NaN. Lengths around the tile: 1, block-1, block, block+1, long."""
    import math

    from aotc.kernels.decode import kernel, spec as S
    from aotc.kernels.decode.reference import gather_tokens
    from aotc.loader.ops.decode_rht import signs

    block = S.block_n(head_dim, tile)
    lens = [0, 1, block - 1, block, block + 1, 3 * block + 5]
    q, k, v, table, seq_lens = problem(lens, head_dim, torch.float16, kv_heads=1, group=2, page_size=16, seed=7)
    kc, vc, ks, vs, k_real, v_real = int4_cache(k, v)
    batch, q_heads, _ = q.shape
    splits = 3
    part_o = torch.full((batch, q_heads, splits, head_dim), float("nan"))
    part_lse = torch.full((batch, q_heads, splits), float("nan"))
    rot, gain = signs(head_dim, q.device)
    axes = dict(S.split_axes("fp16", "int4_rht", "fp32", head_dim, per_token=True), tile=tile)
    kb, vb = kc.view(torch.int8), vc.view(torch.int8)
    args = [q, kb, vb, ks, vs, table, seq_lens, seq_lens, part_o, part_lse, rot,
            1 / math.sqrt(head_dim) / gain, 0, 0, 4, table.shape[1], table.stride(0), q_heads, 2,
            head_dim.bit_length() - 1, q.stride(0), q.stride(1), *kb.stride()[:3], *vb.stride()[:3],
            *ks.stride()[:3], *vs.stride()[:3], 0.0, 0]
    kernel.decode_split_kernel[S.split_grid(batch, 1, 2, splits)](*args, **S.SPLIT.compile_constexprs(axes, 90))
    for b, n in enumerate(lens):
        chunk = -(-(-(-n // splits)) // block) * block
        kt = gather_tokens(k_real, table[b], n).float()
        vt = gather_tokens(v_real, table[b], n).float()
        for s in range(splits):
            lo, hi = s * chunk, min((s + 1) * chunk, n)
            for h in range(q_heads):
                if lo >= hi:
                    assert part_lse[b, h, s] == float("-inf")
                    assert part_o[b, h, s].isnan().all(), "an empty split wrote a partial"
                    continue
                scores = kt[lo:hi, 0] @ q[b, h].float() / math.sqrt(head_dim)
                torch.testing.assert_close(part_lse[b, h, s], torch.logsumexp(scores, 0) / math.log(2),
                                           atol=2e-2, rtol=1e-3)
                torch.testing.assert_close(part_o[b, h, s], torch.softmax(scores, 0) @ vt[lo:hi, 0], **TOL)


def test_int4_rht_plan_and_steady_state_match_the_first_call():
    """DecodePlan serves int4_rht (the signs packed once), and an unvalidated eager call's steady
    state passes them too: both equal the first call's output bit for bit."""
    q, k, v, table, lens = problem([70, 3], 128, torch.bfloat16, seed=11)
    kc, vc, ks, vs, k_real, v_real = int4_cache(k, v)
    want = loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format="int4_rht")
    torch.testing.assert_close(want.float(), R.decode_reference(q, k_real, v_real, table, lens), **TOL)
    for _ in range(2):  # the second unvalidated call takes the steady state where one is made
        out = torch.full_like(q, float("nan"))
        loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format="int4_rht", out=out, validate=False)
        assert torch.equal(out, want)
    plan = loader.DecodePlan(table, lens, q=q, k_cache=kc, v_cache=vc, k_scale=ks, v_scale=vs, kv_format="int4_rht")
    out = torch.full_like(q, float("nan"))
    plan.run(q, kc, vc, out, ks, vs)
    assert torch.equal(out, want)
