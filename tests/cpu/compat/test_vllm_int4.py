"""vLLM 0.33's INT4_PER_TOKEN_HEAD through aotc.compat.vllm on the interpreter: the cache writer
(`reshape_and_cache_int4`) against the format's reference, and `unified_attention`'s decode rows
(aotc's decode, kv_format "int4_rht") against the float32 reference over the dequantized, unrotated
cache, and its prefill rows (aotc's prefix_prefill, kv_format "int4_rht") against the prefix-prefill
reference over the same values. Tolerance: 2e-2 absolute and relative (bf16 output; see
tests/cpu/kernels/decode/test_vllm_int4.py); outputs start NaN."""
import pytest
import torch

from aotc.compat import vllm
from aotc.kernels.common import int4_rht as F
from aotc.kernels.decode import reference as R
from aotc.kernels.prefix_prefill.reference import prefix_prefill_ref
from tests.cpu.kernels.prefix_prefill.cases import random_block_table

INT4 = vllm.KVQuantMode.INT4_PER_TOKEN_HEAD


def _caches(nb, bs, kv_heads, d, pad):
    k = torch.zeros(nb, bs, kv_heads, d // 2 + pad, dtype=torch.uint8)
    return k, torch.zeros_like(k), torch.zeros(nb, bs, kv_heads), torch.zeros(nb, bs, kv_heads)


def test_writer_matches_the_reference_and_skips_negative_slots():
    g = torch.Generator().manual_seed(0)
    key, value = torch.randn(6, 2, 64, generator=g).bfloat16(), torch.randn(6, 2, 64, generator=g).bfloat16()
    kc, vc, ks, vs = _caches(3, 4, 2, 64, pad=4)
    kc[...], vc[...] = 0xAB, 0xAB
    slots = torch.tensor([0, 5, -1, 11, 6, 1])
    vllm.reshape_and_cache_int4(key, value, kc, vc, slots, k_scale_cache=ks, v_scale_cache=vs)
    kp, kw = F.write(key)
    vp, vw = F.write(value)
    for i, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        assert torch.equal(kc[s // 4, s % 4, :, :32], kp[i]) and torch.equal(vc[s // 4, s % 4, :, :32], vp[i])
        assert torch.equal(ks[s // 4, s % 4], kw[i]) and torch.equal(vs[s // 4, s % 4], vw[i])
    assert (kc[..., 32:] == 0xAB).all()  # the padding past head_size // 2 is never written
    written = {s for s in slots.tolist() if s >= 0}
    for s in set(range(12)) - written:
        assert (kc[s // 4, s % 4] == 0xAB).all() and (ks[s // 4, s % 4] == 0).all()
    with pytest.raises(TypeError, match="k_scale_cache"):
        vllm.reshape_and_cache_int4(key, value, kc, vc, slots, k_scale_cache=ks.half(), v_scale_cache=vs)
    with pytest.raises(ValueError, match="slot_mapping"):
        vllm.reshape_and_cache_int4(key, value, kc, vc, slots[:3], k_scale_cache=ks, v_scale_cache=vs)


def _problem(q_lens, ctx_lens, head_dim=64, pad=0, seed=0, bs=16):
    g = torch.Generator().manual_seed(seed)
    q_heads, kv_heads = 8, 2
    full = [c + n for c, n in zip(ctx_lens, q_lens)]
    table, nb = random_block_table(full, bs, g)
    kc, vc, ks, vs = _caches(nb, bs, kv_heads, head_dim, pad)
    for b, n in enumerate(full):  # every token of each request, written as vLLM's tests do
        t = torch.arange(n)
        slots = table[b, t // bs].long() * bs + t % bs
        key = torch.randn(n, kv_heads, head_dim, generator=g).bfloat16()
        value = torch.randn(n, kv_heads, head_dim, generator=g).bfloat16()
        vllm.reshape_and_cache_int4(key, value, kc, vc, slots, k_scale_cache=ks, v_scale_cache=vs)
    q = torch.randn(sum(q_lens), q_heads, head_dim, generator=g).bfloat16()
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    lens = torch.tensor(full, dtype=torch.int32)
    args = dict(q=q, k=kc, v=vc, out=torch.full(q.shape, float("nan"), dtype=q.dtype), cu_seqlens_q=qsl,
                max_seqlen_q=max(q_lens), seqused_k=lens, max_seqlen_k=max(full), softmax_scale=head_dim ** -0.5,
                causal=True, window_size=(-1, -1), block_table=table, softcap=0, q_descale=None, k_descale=None,
                v_descale=None, kv_quant_mode=INT4, k_scale_cache=ks, v_scale_cache=vs)
    k_real = F.dequantize(kc[..., :head_dim // 2], ks)
    v_real = F.dequantize(vc[..., :head_dim // 2], vs)
    return args, k_real, v_real


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("pad", [0, 4], ids=["separate", "padded"])
def test_decode_rows(head_dim, pad):
    args, k_real, v_real = _problem([1, 1, 1, 1], [0, 14, 16, 90], head_dim=head_dim, pad=pad, seed=head_dim)
    vllm.unified_attention(**args)
    want = R.decode_reference(args["q"], k_real, v_real, args["block_table"], args["seqused_k"],
                              sm_scale=head_dim ** -0.5)
    torch.testing.assert_close(args["out"].float(), want, atol=2e-2, rtol=2e-2)


def test_decode_rows_window_and_sinks():
    args, k_real, v_real = _problem([1, 1, 1], [40, 3, 70], seed=2)
    sinks = torch.randn(args["q"].shape[1])
    vllm.unified_attention(**{**args, "window_size": (31, 0), "sinks": sinks})
    want = R.decode_reference(args["q"], k_real, v_real, args["block_table"], args["seqused_k"],
                              sm_scale=64 ** -0.5, window=32, sinks=sinks)
    torch.testing.assert_close(args["out"].float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("pad", [0, 4], ids=["separate", "padded"])
def test_prefill_rows(head_dim, pad):
    # a mixed batch (prefill, decode and a fresh prompt): one prefix_prefill over the int4 cache
    q_lens, ctx = [3, 1, 20, 17], [5, 9, 0, 47]
    args, k_real, v_real = _problem(q_lens, ctx, head_dim=head_dim, pad=pad, seed=head_dim + 1)
    vllm.unified_attention(**args)
    want = prefix_prefill_ref(args["q"], None, None, k_real, v_real, args["block_table"], args["cu_seqlens_q"],
                              args["seqused_k"], sm_scale=head_dim ** -0.5)
    torch.testing.assert_close(args["out"].float(), want.float(), atol=2e-2, rtol=2e-2)


def test_prefill_rows_window_and_sinks():
    args, k_real, v_real = _problem([9, 1, 30], [40, 3, 7], seed=4)
    sinks = torch.randn(args["q"].shape[1])
    vllm.unified_attention(**{**args, "window_size": (15, 0), "sinks": sinks})
    want = prefix_prefill_ref(args["q"], None, None, k_real, v_real, args["block_table"], args["cu_seqlens_q"],
                              args["seqused_k"], sm_scale=64 ** -0.5, window=16, sinks=sinks)
    torch.testing.assert_close(args["out"].float(), want.float(), atol=2e-2, rtol=2e-2)


def test_refusals():
    args, _, _ = _problem([3, 1], [5, 9], seed=1)
    for extra, match in ((dict(softcap=10.0), "INT4_PER_TOKEN_HEAD with softcap"),
                         (dict(alibi_slopes=torch.ones(8)), "INT4_PER_TOKEN_HEAD with softcap or alibi"),
                         (dict(output_scale=torch.tensor(1.0)), "INT4_PER_TOKEN_HEAD with output_scale"),
                         (dict(window_size=(7, 0), chunk_lookback=0), "chunk_lookback"),
                         (dict(mm_prefix_range=torch.zeros(2, 1, 2, dtype=torch.int32)), "mm_prefix_range")):
        with pytest.raises(NotImplementedError, match=match):
            vllm.unified_attention(**{**args, **extra})
    args, _, _ = _problem([1, 1], [5, 9], seed=1)
    with pytest.raises(NotImplementedError, match="softcap"):
        vllm.unified_attention(**{**args, "softcap": 10.0})
    with pytest.raises(TypeError, match="needs torch.uint8 caches"):
        vllm.unified_attention(**{**args, "k": args["k"].view(torch.int8).to(torch.int16)})
    with pytest.raises(ValueError, match="needs v_scale_cache"):
        vllm.unified_attention(**{**args, "v_scale_cache": None})
    with pytest.raises(ValueError, match="k_scale_cache must be"):
        vllm.unified_attention(**{**args, "k_scale_cache": args["k_scale_cache"][:1]})
    assert torch.isnan(args["out"]).all()  # nothing was launched


def test_prefill_rows_checked_once(monkeypatch):
    # int4_rht checks the call on q before rotating it; the rotated int4_zp call is not checked again
    from aotc.loader.ops import prefix_prefill as P

    calls = []
    checks = P._validate
    monkeypatch.setattr(P, "_validate", lambda *a, **kw: calls.append(a[0]) or checks(*a, **kw))
    args, k_real, v_real = _problem([4, 1], [6, 17], seed=5)
    vllm.unified_attention(**args)
    assert len(calls) == 1 and calls[0] is args["q"]
    want = prefix_prefill_ref(args["q"], None, None, k_real, v_real, args["block_table"], args["cu_seqlens_q"],
                              args["seqused_k"], sm_scale=64 ** -0.5)
    torch.testing.assert_close(args["out"].float(), want.float(), atol=2e-2, rtol=2e-2)
