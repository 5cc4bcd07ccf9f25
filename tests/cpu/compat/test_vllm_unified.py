"""aotc.compat.vllm.unified_attention with vLLM 0.33.0's conventions (cache holding every token,
[num_blocks, block_size, kv_heads, D]; cu_seqlens_q; window_size (left, right); per-tensor fp8
descales shaped [num_seqs, kv_heads]) against the float32 reference, through the Triton
interpreter; out NaN-poisoned first. Tolerance: cases.TOL (fp16 4e-3, bf16 3e-2, abs and rel).
And the one list of every option aotc does not implement, each raising NotImplementedError naming it
before anything is launched."""
import pytest
import torch

from aotc.compat import vllm
from aotc.kernels.prefix_prefill.reference import prefix_prefill_ref, quantize_fp8_ref
from tests.cpu.kernels.prefix_prefill.cases import TOL, assert_matches, make_case, random_block_table

# decode rows (q 1), a chunk past a 128-row tile, a request of no tokens, contexts around a page
Q_LENS, CTX_LENS = [1, 130, 0, 5, 1], [0, 17, 0, 15, 40]


def _problem(dtype=torch.bfloat16, cache_dtype=None, seed=0, q_heads=4, kv_heads=2, head_dim=64):
    """(vLLM's keyword arguments, the reference's case): the cache holds all of each sequence."""
    full = [c + n for c, n in zip(CTX_LENS, Q_LENS)]
    case, kw = make_case(full, Q_LENS, dtype=dtype, cache_dtype=cache_dtype, seed=seed, q_heads=q_heads,
                         kv_heads=kv_heads, head_dim=head_dim)
    case["seq_lens"] = torch.tensor(full, dtype=torch.int32)
    case["k"] = case["v"] = None
    args = dict(q=case["q"], k=case["k_cache"], v=case["v_cache"],
                out=torch.full(case["q"].shape, float("nan"), dtype=dtype), cu_seqlens_q=case["query_start_loc"],
                max_seqlen_q=max(Q_LENS), seqused_k=case["seq_lens"], max_seqlen_k=max(full),
                softmax_scale=head_dim ** -0.5, causal=True, window_size=(-1, -1), block_table=case["block_table"],
                softcap=0, q_descale=None, k_descale=None, v_descale=None)
    return args, case, kw


def test_bf16_window_softcap_sinks_alibi():
    args, case, kw = _problem(seed=1)
    sinks, slopes = torch.tensor([1.0, -0.5, 0.0, 2.0]), torch.tensor([0.2, 0.1, 0.05, 0.3])
    assert vllm.unified_attention(**{**args, "window_size": (19, 0), "softcap": 8.0}, sinks=sinks,
                                  alibi_slopes=slopes, use_alibi_sqrt=True, seq_threshold_3D=8) is None
    ref = prefix_prefill_ref(**case, **kw, sm_scale=args["softmax_scale"], window=20, softcap=8.0, sinks=sinks,
                             alibi_slopes=slopes, alibi_sqrt=True)
    assert_matches(args["out"], ref, torch.bfloat16)


def test_fp8_cache_fp8_query_per_tensor_descales():
    args, case, kw = _problem(dtype=torch.float16, cache_dtype=torch.float8_e4m3fn, seed=2, q_heads=8, kv_heads=1)
    k_scale, v_scale = kw["k_scale"], kw["v_scale"]
    q_scale = torch.tensor(0.5)
    q8 = (case["q"].float() / q_scale).to(torch.float8_e4m3fn)
    shape = (len(Q_LENS), 1)  # vLLM's tests pass [num_seqs, kv_heads] filled with the scale
    vllm.unified_attention(**{**args, "q": q8, "q_descale": q_scale, "k_descale": k_scale.expand(shape),
                              "v_descale": v_scale.expand(shape)}, kv_quant_mode=vllm.KVQuantMode.FP8_PER_TENSOR)
    ref = prefix_prefill_ref(**{**case, "q": (q8.float() * q_scale).half()}, **kw, sm_scale=args["softmax_scale"])
    assert_matches(args["out"], ref, torch.float16)


def test_fp8_output():
    args, case, kw = _problem(dtype=torch.float16, seed=3)
    out_scale = torch.tensor(0.05)
    args["out"] = torch.full(case["q"].shape, float("nan")).to(torch.float8_e4m3fn)
    vllm.unified_attention(**args, output_scale=out_scale)
    want = quantize_fp8_ref(prefix_prefill_ref(**case, **kw, sm_scale=args["softmax_scale"]), out_scale).float()
    got = args["out"].float()
    assert ((got - want).abs() <= 0.125 * want.abs() + TOL[torch.float16] / 0.05).all()


UNSUPPORTED = [  # (option, keyword arguments): every one aotc lacks
    # INT4_PER_TOKEN_HEAD itself: tests/cpu/compat/test_vllm_int4.py
    ("INT4_PER_TOKEN_HEAD with softcap", dict(kv_quant_mode=vllm.KVQuantMode.INT4_PER_TOKEN_HEAD, softcap=5.0)),
    ("INT4_PER_TOKEN_HEAD with softcap or alibi_slopes",
     dict(kv_quant_mode=vllm.KVQuantMode.INT4_PER_TOKEN_HEAD, alibi_slopes=torch.ones(4))),
    ("INT4_PER_TOKEN_HEAD with output_scale",
     dict(kv_quant_mode=vllm.KVQuantMode.INT4_PER_TOKEN_HEAD, output_scale=torch.tensor(1.0))),
    ("causal=False with a sliding window", dict(causal=False, window_size=(15, 15))),
    ("causal=False with mm_prefix_range", dict(causal=False, mm_prefix_range=torch.zeros(len(Q_LENS), 1, 2,
                                                                                       dtype=torch.int32))),
    ("causal as a per-sequence tensor with mm_prefix_range or alibi_slopes",
     dict(causal=torch.ones(len(Q_LENS), dtype=torch.bool), alibi_slopes=torch.ones(4))),
    ("qq_bias", dict(qq_bias=torch.zeros(1))),
    ("rswa", dict(rswa_window=16, rswa_prefix_lens=torch.zeros(len(Q_LENS), dtype=torch.int32))),
]


@pytest.mark.parametrize("per_seq", [False, True])
def test_non_causal(per_seq):
    # causal=False (or per sequence): each non-causal sequence's new tokens see all of its keys. The
    # reference: one range over the whole sequence (context included), computed independently of the
    # compat's range over the new tokens; sequences 0 and 3 stay causal in the per-sequence case
    args, case, kw = _problem(seed=9)
    full = [c + n for c, n in zip(CTX_LENS, Q_LENS)]
    causal = torch.tensor([True, False, False, True, False]) if per_seq else False
    mm = torch.tensor([[[1, 0]] if per_seq and causal[i] else [[0, n - 1]] for i, n in enumerate(full)],
                      dtype=torch.int32)
    vllm.unified_attention(**{**args, "causal": causal}, sinks=torch.tensor([0.5, -1.0, 0.0, 1.5]))
    ref = prefix_prefill_ref(**case, **kw, sm_scale=args["softmax_scale"], mm_prefix_range=mm,
                             sinks=torch.tensor([0.5, -1.0, 0.0, 1.5]))
    assert_matches(args["out"], ref, torch.bfloat16)
    causal_ref = prefix_prefill_ref(**case, **kw, sm_scale=args["softmax_scale"],
                                    sinks=torch.tensor([0.5, -1.0, 0.0, 1.5]))
    assert not torch.allclose(ref[1:131], causal_ref[1:131])  # the 130-token chunk's rows do differ
    with pytest.raises(ValueError, match="causal"):
        vllm.unified_attention(**{**args, "causal": torch.ones(2, dtype=torch.bool)})


def test_non_causal_fp8_per_tensor():
    args, case, kw = _problem(dtype=torch.float16, cache_dtype=torch.float8_e4m3fn, seed=10, q_heads=8, kv_heads=1)
    full = [c + n for c, n in zip(CTX_LENS, Q_LENS)]
    shape = (len(Q_LENS), 1)
    vllm.unified_attention(**{**args, "causal": False, "k_descale": kw["k_scale"].expand(shape),
                              "v_descale": kw["v_scale"].expand(shape)},
                           kv_quant_mode=vllm.KVQuantMode.FP8_PER_TENSOR)
    mm = torch.tensor([[[0, n - 1]] for n in full], dtype=torch.int32)
    assert_matches(args["out"], prefix_prefill_ref(**case, **kw, sm_scale=args["softmax_scale"], mm_prefix_range=mm),
                   torch.float16)


@pytest.mark.parametrize("clamp", [False, True])
def test_chunked_local_attention_and_bidirectional_ranges(clamp):
    # vLLM's chunk_lookback (chunk = window // (lookback + 1)) and mm_prefix_range [num_seqs, ranges, 2]
    # with inclusive ends; a window-less call with ranges; decode rows go to prefix_prefill too
    args, case, kw = _problem(seed=6)
    mm = torch.zeros(len(Q_LENS), 2, 2, dtype=torch.int32)
    mm[1, 0] = torch.tensor([20, 120])
    mm[1, 1] = torch.tensor([130, 140])
    mm[3, 0] = torch.tensor([14, 19])
    vllm.unified_attention(**{**args, "window_size": (47, 0)}, chunk_lookback=1, mm_prefix_range=mm,
                           mm_prefix_clamp_sliding_window=clamp)
    ref = prefix_prefill_ref(**case, **kw, sm_scale=args["softmax_scale"], window=48, chunk_lookback=1,
                             mm_prefix_range=mm, mm_clamp=clamp)
    assert_matches(args["out"], ref, torch.bfloat16)
    args["out"].fill_(float("nan"))
    vllm.unified_attention(**args, mm_prefix_range=mm)
    ref = prefix_prefill_ref(**case, **kw, sm_scale=args["softmax_scale"], mm_prefix_range=mm)
    assert_matches(args["out"], ref, torch.bfloat16)
    with pytest.raises(ValueError, match="mm_prefix_range"):
        vllm.unified_attention(**args, mm_prefix_range=mm[:, 0])


def test_decode_rows_with_chunks_take_prefix_prefill():
    q_lens, ctx = [1, 1, 1], [70, 5, 33]
    full = [c + n for c, n in zip(ctx, q_lens)]
    case, kw = make_case(full, q_lens, seed=7, head_dim=64, dtype=torch.bfloat16)
    case["seq_lens"] = torch.tensor(full, dtype=torch.int32)
    case["k"] = case["v"] = None
    out = torch.full(case["q"].shape, float("nan"), dtype=torch.bfloat16)
    vllm.unified_attention(q=case["q"], k=case["k_cache"], v=case["v_cache"], out=out,
                           cu_seqlens_q=case["query_start_loc"], max_seqlen_q=1, seqused_k=case["seq_lens"],
                           max_seqlen_k=max(full), softmax_scale=0.125, causal=True, window_size=(31, 0),
                           block_table=case["block_table"], softcap=0, q_descale=None, k_descale=None,
                           v_descale=None, chunk_lookback=0)
    ref = prefix_prefill_ref(**case, **kw, sm_scale=0.125, window=32, chunk_lookback=0)
    assert_matches(out, ref, torch.bfloat16)
    assert (ref - prefix_prefill_ref(**case, **kw, sm_scale=0.125, window=32)).abs().max() > 0.1


def _per_token_head_problem(mode, q_lens, ctx_lens, head_dim=64, seed=0, padded=False):
    """vLLM's per-token-head call: codes and [num_blocks, block_size, kv_heads] fp32 scale caches as
    its cache writer makes them; padded: k and v are vLLM's backend views (codes then the inline
    scale, V 4-byte aligned), else the separate tensors vLLM's tests pass. Returns (vLLM's
    arguments, the float32 reference)."""
    from tests.cpu.kernels.decode.test_vllm_caches import vllm_inline_cache

    g = torch.Generator().manual_seed(seed)
    q_heads, kv_heads, bs = 4, 2, 16
    full = [c + n for c, n in zip(ctx_lens, q_lens)]
    table, nb = random_block_table(full, bs, g)
    k = torch.randn(nb, bs, kv_heads, head_dim, generator=g)
    v = torch.randn(nb, bs, kv_heads, head_dim, generator=g)
    fmt = "int8" if mode == vllm.KVQuantMode.INT8_PER_TOKEN_HEAD else "fp8_e4m3"
    kc, vc, ks, vs, k_real, v_real = vllm_inline_cache(k, v, fmt)
    if padded:
        kc = torch.as_strided(kc, kc.shape[:-1] + (head_dim + 4,), kc.stride(), kc.storage_offset())
        vc = torch.as_strided(vc, vc.shape[:-1] + (head_dim + 4,), vc.stride(), vc.storage_offset())
    else:
        kc, vc, ks, vs = kc.contiguous(), vc.contiguous(), ks.contiguous(), vs.contiguous()
    q = torch.randn(sum(q_lens), q_heads, head_dim, generator=g).to(torch.bfloat16)
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    lens = torch.tensor(full, dtype=torch.int32)
    args = dict(q=q, k=kc, v=vc, out=torch.full(q.shape, float("nan"), dtype=q.dtype), cu_seqlens_q=qsl,
                max_seqlen_q=max(q_lens), seqused_k=lens, max_seqlen_k=max(full), softmax_scale=head_dim ** -0.5,
                causal=True, window_size=(-1, -1), block_table=table, softcap=0, q_descale=None, k_descale=None,
                v_descale=None, kv_quant_mode=mode, k_scale_cache=ks[..., 0], v_scale_cache=vs[..., 0])
    ref = prefix_prefill_ref(q, None, None, k_real, v_real, table, qsl, lens, sm_scale=head_dim ** -0.5)
    return args, ref


PTH = [vllm.KVQuantMode.INT8_PER_TOKEN_HEAD, vllm.KVQuantMode.FP8_PER_TOKEN_HEAD]


@pytest.mark.parametrize("mode", PTH, ids=lambda m: m.name)
@pytest.mark.parametrize("padded", [False, True], ids=["separate", "inline"])
def test_per_token_head_decode_rows(mode, padded):
    # decode rows only: aotc's decode kernel (vLLM's test_per_token_kv_cache shapes are these)
    args, ref = _per_token_head_problem(mode, [1, 1, 1, 1], [0, 14, 16, 90], padded=padded, head_dim=128)
    vllm.unified_attention(**args)
    assert_matches(args["out"], ref, torch.bfloat16)


@pytest.mark.parametrize("mode", PTH, ids=lambda m: m.name)
@pytest.mark.parametrize("padded", [False, True], ids=["separate", "inline"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_per_token_head_prefill_rows(mode, padded, head_dim, monkeypatch):
    # a mixed batch: one prefix_prefill over the int8 / fp8 cache, the new tokens read from it; vLLM's
    # inline record (rows 4-byte aligned) on the kv_align 4 binaries, separate 16-byte rows not
    # (int8; fp8 per token has kv_align 4 binaries only)
    from aotc.loader.ops import prefix_prefill as pp

    seen = []
    real = pp.launch_plan
    monkeypatch.setattr(pp, "launch_plan", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    args, ref = _per_token_head_problem(mode, Q_LENS, CTX_LENS, padded=padded, head_dim=head_dim, seed=head_dim)
    vllm.unified_attention(**args)
    assert_matches(args["out"], ref, torch.bfloat16)
    fp8 = mode == vllm.KVQuantMode.FP8_PER_TOKEN_HEAD
    assert [(axes["kv"], axes["scales"], axes.get("kv_align")) for axes, _, _ in seen] == [
        ("fp8_e4m3" if fp8 else "int8", "token", 4 if padded or fp8 else None)]


def test_prefill_rows_under_another_default_device():
    # vLLM's tests set torch's default device to CUDA; the host-side checks build theirs on the CPU
    args, ref = _per_token_head_problem(vllm.KVQuantMode.INT8_PER_TOKEN_HEAD, Q_LENS, CTX_LENS, seed=3)
    with torch.device("meta"):
        vllm.unified_attention(**args)
    assert_matches(args["out"], ref, torch.bfloat16)


def test_per_token_head_refusals():
    args, _ = _per_token_head_problem(vllm.KVQuantMode.FP8_PER_TOKEN_HEAD, Q_LENS, CTX_LENS)
    with pytest.raises(NotImplementedError, match="FP8_PER_TOKEN_HEAD with softcap"):
        vllm.unified_attention(**{**args, "alibi_slopes": torch.ones(4)})
    args, _ = _per_token_head_problem(vllm.KVQuantMode.INT8_PER_TOKEN_HEAD, Q_LENS, CTX_LENS)
    with pytest.raises(NotImplementedError, match="INT8_PER_TOKEN_HEAD with softcap"):
        vllm.unified_attention(**{**args, "softcap": 5.0})
    with pytest.raises(ValueError, match="needs v_scale_cache"):
        vllm.unified_attention(**{**args, "v_scale_cache": None})
    with pytest.raises(TypeError, match="needs torch.int8 caches"):
        vllm.unified_attention(**{**args, "kv_quant_mode": vllm.KVQuantMode.INT8_PER_TOKEN_HEAD,
                                  "k": args["k"].view(torch.uint8)})
    with pytest.raises(ValueError, match="k_scale_cache / v_scale_cache"):
        vllm.unified_attention(**{**args, "kv_quant_mode": vllm.KVQuantMode.NONE, "k": args["q"]})
    assert torch.isnan(args["out"]).all()


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_decode_rows_score_mods(fmt):
    # decode rows with softcap, ALiBi (sqrt), sinks and a window: the decode kernel's "mod" binaries
    q_lens, ctx = [1, 1, 1], [0, 16, 70]
    full = [c + n for c, n in zip(ctx, q_lens)]
    cache_dtype = torch.float8_e4m3fn if fmt == "fp8" else None
    case, kw = make_case(full, q_lens, dtype=torch.bfloat16, cache_dtype=cache_dtype, seed=9, head_dim=64)
    case["seq_lens"] = torch.tensor(full, dtype=torch.int32)
    case["k"] = case["v"] = None
    q = case["q"] * 4
    sinks, slopes = torch.tensor([1.0, -0.5, 0.0, 2.0]), torch.tensor([0.2, 0.1, 0.05, 0.3])
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    extra = {}
    if fmt == "fp8":
        shape = (len(q_lens), 2)
        extra = dict(kv_quant_mode=vllm.KVQuantMode.FP8_PER_TENSOR, k_descale=kw["k_scale"].expand(shape),
                     v_descale=kw["v_scale"].expand(shape))
    vllm.unified_attention(q, case["k_cache"], case["v_cache"], out, case["query_start_loc"], 1, case["seq_lens"],
                           max(full), 0.125, True, (39, 0), case["block_table"], 3.0, None,
                           extra.pop("k_descale", None), extra.pop("v_descale", None), sinks=sinks,
                           alibi_slopes=slopes, use_alibi_sqrt=True, **extra)
    ref = prefix_prefill_ref(**{**case, "q": q}, **kw, sm_scale=0.125, window=40, softcap=3.0, sinks=sinks,
                             alibi_slopes=slopes, alibi_sqrt=True)
    assert_matches(out, ref, torch.bfloat16)


@pytest.mark.parametrize("name,options", UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_unsupported_options_raise(name, options):
    args, _, _ = _problem(seed=4)
    with pytest.raises(NotImplementedError, match=name):
        vllm.unified_attention(**{**args, **options})
    assert torch.isnan(args["out"]).all()  # nothing was launched


def test_supported_options_are_not_rejected():
    """vLLM's accepted-and-ignored arguments: split-K workspace, use_td, chunk_lookback without a window."""
    args, case, kw = _problem(seed=5)
    scratch = torch.empty(8, 4, 16, 64)
    vllm.unified_attention(**args, seq_threshold_3D=8, num_par_softmax_segments=16, softmax_segm_output=scratch,
                           softmax_segm_max=scratch[..., 0], softmax_segm_expsum=scratch[..., 0], use_td=True,
                           chunk_lookback=2, mm_prefix_clamp_sliding_window=True)
    assert_matches(args["out"], prefix_prefill_ref(**case, **kw, sm_scale=args["softmax_scale"]), torch.bfloat16)


@pytest.mark.parametrize("validate,reads", [(None, True), (True, True), (False, False)])
def test_validate_false_skips_the_value_reads(monkeypatch, validate, reads):
    # an engine's hot loop passes validate=False: no host read of lengths or page ids (a device sync
    # each on the GPU), the result unchanged
    from aotc.loader.ops import prefix_prefill as pp

    seen = []
    real = pp._check_lengths
    monkeypatch.setattr(pp, "_check_lengths", lambda *a, **k: seen.append(1) or real(*a, **k))
    args, case, kw = _problem(seed=7)
    args["block_table"] = args["block_table"].long()  # int64: int32_indices' range check reads it too
    vllm.unified_attention(**args, validate=validate)
    assert bool(seen) == reads
    assert_matches(args["out"], prefix_prefill_ref(**case, **kw, sm_scale=args["softmax_scale"]), torch.bfloat16)
