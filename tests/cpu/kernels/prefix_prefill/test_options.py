"""prefix_prefill's runtime options (spec.OPTION_ARGS) and vLLM's interleaved V cache, through the
public op (Triton interpreter) against the float32 reference: softcap, ALiBi (linear and sqrt),
k = v = None (the new tokens' keys and values read from the cache, causal part at its end; float,
fp8, int8 and int4 caches) and
v_pack. Caches poisoned as in cases.py (NaN pages and slots), outputs NaN first; tolerance
cases.TOL (4e-3 fp16, 3e-2 bf16, abs and rel)."""
import pytest
import torch

from aotc.kernels.prefix_prefill.reference import prefix_prefill_ref
from aotc.loader.ops.prefix_prefill import prefix_prefill

from .cases import TOL, assert_matches, make_case

# contexts around a 16-token page and q lengths 1, odd, past a 128-row q block
CTX = [0, 15, 17, 40]
QLEN = [1, 7, 130, 16]
REF_OPTIONS = ("sm_scale", "window", "sinks", "softcap", "alibi_slopes", "alibi_sqrt", "v_pack")


def run(case, kw, **extra):
    out = torch.full(case["q"].shape, float("nan"), dtype=case["q"].dtype)
    got = prefix_prefill(**case, **kw, **extra, out=out)
    assert got is out
    ref = prefix_prefill_ref(**case, **kw, **{k: v for k, v in extra.items() if k in REF_OPTIONS})
    return got, ref


def interleave_v(v_cache: torch.Tensor, pack: int) -> torch.Tensor:
    """vLLM's interleaved V: [nb, h, D, bs] rewritten as [nb, h, bs // pack, D, pack] in the same shape."""
    nb, h, d, bs = v_cache.shape
    return v_cache.view(nb, h, d, bs // pack, pack).permute(0, 1, 3, 2, 4).contiguous().view(nb, h, d, bs)


def cache_holds_all(ctx_lens, q_lens, **kw):
    """A case whose cache holds every token (context and new), q the last q_len of each request:
    k = v = None, seq_lens the whole lengths."""
    full = [c + n for c, n in zip(ctx_lens, q_lens)]
    case, kw = make_case(full, q_lens, **kw)
    case["seq_lens"] = torch.tensor(full, dtype=torch.int32)
    case["k"] = case["v"] = None
    return case, kw


@pytest.mark.parametrize("layout", ["nhd", "vllm"])
def test_softcap(layout):
    # scale 3: logits of tens, where the cap (20) bends them
    case, kw = make_case(CTX, QLEN, layout=layout, head_dim=32, scale=1.5, seed=21)
    got, ref = run(case, kw, softcap=20.0, window=50)
    assert_matches(got, ref, torch.float16)
    plain = prefix_prefill_ref(**case, **kw, window=50)
    assert (plain - ref).abs().max() > 10 * TOL[torch.float16]  # the cap changed the answer


@pytest.mark.parametrize("sqrt", [False, True])
def test_alibi(sqrt):
    case, kw = make_case(CTX, QLEN, q_heads=4, kv_heads=2, head_dim=64, layout="vllm", dtype=torch.bfloat16,
                         seed=22)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    got, ref = run(case, kw, alibi_slopes=slopes, alibi_sqrt=sqrt, sinks=torch.tensor([0.5, -1.0, 2.0, 0.0]))
    assert_matches(got, ref, torch.bfloat16)


@pytest.mark.parametrize("layout,cache_dtype", [("nhd", None), ("vllm", None), ("nhd", torch.float8_e4m3fn)])
def test_keys_from_cache(layout, cache_dtype):
    case, kw = cache_holds_all(CTX, QLEN, layout=layout, head_dim=64, cache_dtype=cache_dtype, seed=23)
    got, ref = run(case, kw)
    assert_matches(got, ref, torch.float16)


@pytest.mark.parametrize("kv_format,scales", [("int8", "token"), ("int8", "group"), ("int4", "token")])
def test_keys_from_cache_int(kv_format, scales):
    # vLLM's INT8_PER_TOKEN_HEAD prefill rows: the cache holds the new tokens, causal in masked tiles
    case, kw = cache_holds_all(CTX, QLEN, layout="nhd", head_dim=64, kv_format=kv_format, scales=scales, seed=27)
    got, ref = run(case, kw, window=60)
    assert_matches(got, ref, torch.float16)


def test_keys_from_cache_with_window_softcap_alibi():
    case, kw = cache_holds_all([3, 31, 0], [33, 1, 129], layout="nhd", head_dim=32, block_size=32, seed=24)
    got, ref = run(case, kw, window=20, softcap=5.0, alibi_slopes=torch.tensor([0.3, 0.1, 0.2, 0.05]))
    assert_matches(got, ref, torch.float16)


@pytest.mark.parametrize("cache_dtype,pack", [(None, 8), (torch.float8_e5m2, 16)])
@pytest.mark.parametrize("from_cache", [False, True])
def test_interleaved_v(cache_dtype, pack, from_cache):
    maker = cache_holds_all if from_cache else make_case
    case, kw = maker(CTX, QLEN, layout="vllm", head_dim=40, block_size=32, cache_dtype=cache_dtype, x=8, seed=25)
    case["v_cache"] = interleave_v(case["v_cache"], pack)
    got, ref = run(case, kw, v_pack=pack)
    assert_matches(got, ref, torch.float16)
    wrong = prefix_prefill_ref(**case, **kw)  # the same bytes read as plain V
    assert (wrong.nan_to_num() - ref).abs().max() > 10 * TOL[torch.float16]


def test_option_errors():
    case, kw = make_case([5], [3], layout="vllm", seed=26)
    with pytest.raises(ValueError, match="v_pack"):
        prefix_prefill(**case, **kw, v_pack=3)  # not a divisor of the block size
    with pytest.raises(ValueError, match="softcap"):
        prefix_prefill(**case, **kw, softcap=-1.0)
    with pytest.raises(ValueError, match="alibi_slopes"):
        prefix_prefill(**case, **kw, alibi_slopes=torch.ones(3))
    with pytest.raises(ValueError, match="alibi_sqrt"):
        prefix_prefill(**case, **kw, alibi_sqrt=True)
    with pytest.raises(ValueError, match="both None"):
        prefix_prefill(**{**case, "k": None}, **kw)
    nhd, nkw = make_case([5], [3], layout="nhd", seed=26)
    with pytest.raises(ValueError, match="v_pack"):
        prefix_prefill(**nhd, **nkw, v_pack=8)
    icase, ikw = make_case([5], [3], kv_format="int8", seed=26)
    for extra in ({"softcap": 1.0}, {"alibi_slopes": torch.ones(4)}):
        with pytest.raises(NotImplementedError, match="int8"):
            prefix_prefill(**icase, **ikw, **extra)
