"""Issue 37's classes 3, 4 and 8 at the compat entry points and in the ops' value checks:

- each compat entry point's outputs x {sharing memory with each tensor argument, expand()ed}: a
  ValueError naming the engine's argument (the entry points copy int64 indices and scales, which
  would hide an overlap from the op); inputs requiring grad: NotImplementedError naming them;
  bools as numbers refused;
- int64 indices narrowed to int32 only when they fit: gated_delta_prefill's state_indices and
  cu_seqlens, the compat entry points' lengths and tables (a wrapped -2**32+2 is slot 2);
- store_kv: a slot named twice, fp8 scales <= 0 or not finite; an empty gated_delta_prefill batch
  is a no-op.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

from aotc.compat import fla, lightllm, vllm
from aotc.loader.ops.gated_delta_prefill import gated_delta_prefill
from aotc.loader.ops.store_kv import store_kv
from tests.cpu.compat.test_fla import fla_inputs
from tests.cpu.compat.test_lightllm import lightllm_step
from tests.cpu.compat.test_vllm import vllm_inputs
from tests.cpu.compat.test_vllm_prefill import _vllm_args
from tests.cpu.kernels.gated_delta.chunk_cases import make_case as gdp_case
from tests.cpu.kernels.prefix_prefill.cases import make_case as pp_case

from .test_bad_inputs import launches, same_bits  # noqa: F401  (launches: the fixture)
from .test_outputs_and_grad import _expanded, _shared


# -- compat entry points: (call(kwargs), kwargs, output names) ---------------------------------------
def _vllm_decode():
    q, k_buf, v_buf, o, lse, table, seq, logits, kw, _ = vllm_inputs([5, 33], page_size=16)
    return vllm.decode_attention_fwd, dict(q=q, k_buffer=k_buf, v_buffer=v_buf, o=o, lse=lse, req_to_token=table.long(),
                                           b_seq_len=seq.long(), attn_logits=logits, num_kv_splits=4, sm_scale=0.125,
                                           page_size=16, **kw), ("o", "lse")


_PP_NAMES = ["q", "k", "v", "o", "kv_cache_dtype", "k_cache", "v_cache", "b_loc", "b_start_loc", "b_seq_len",
             "max_seq_len", "max_input_len", "k_scale", "v_scale"]


def _vllm_context():
    case, kw = pp_case([0, 17], [5, 3], head_dim=64, layout="vllm", dtype=torch.float16, seed=5)
    return vllm.context_attention_fwd, dict(zip(_PP_NAMES, _vllm_args(case, kw))), ("o",)


def _vllm_chunked():
    case, kw = pp_case([0, 17], [5, 1], head_dim=64, layout="vllm", dtype=torch.float16, seed=6)
    a = dict(zip(_PP_NAMES, _vllm_args(case, kw)))
    names = dict(q="query", k="key", v="value", o="output", k_cache="key_cache", v_cache="value_cache",
                 b_loc="block_table", b_start_loc="query_start_loc", b_seq_len="seq_lens",
                 max_input_len="max_query_len")
    return vllm.chunked_prefill_paged_decode, {names.get(n, n): t for n, t in a.items()}, ("output",)


def _lightllm_decode():
    q, state, kv, scale, _ = lightllm_step([7, 20], "int8", 8, seed=82)
    return lightllm.token_decode_attention_flash_decoding, dict(
        q=q, infer_state=state, cache_k=kv[:, :2], cache_k_scale=scale[:, :2], cache_v=kv[:, 2:],
        cache_v_scale=scale[:, 2:], out=torch.full_like(q, float("nan"))), ("out",)


IGNORED = {"attn_logits"}  # vLLM's workspace: documented as not read or written by aotc
COMPAT = {"vllm.decode_attention_fwd": _vllm_decode, "vllm.context_attention_fwd": _vllm_context,
          "vllm.chunked_prefill_paged_decode": _vllm_chunked,
          "lightllm.token_decode_attention_flash_decoding": _lightllm_decode}


def _compat_cases():
    alias, expand, grad = [], [], []
    for name, build in COMPAT.items():
        _fn, kw, outs = build()
        tensors = [n for n, t in kw.items() if isinstance(t, torch.Tensor) and t.numel() and n not in IGNORED]
        alias += [(name, o, other) for o in outs for other in tensors if other != o]
        expand += [(name, o) for o in outs]
        grad += [(name, n) for n in tensors if kw[n].is_floating_point()]
    return alias, expand, grad


C_ALIAS, C_EXPAND, C_GRAD = _compat_cases()


def _refused(fn, kw, launches, arg, words, exc=ValueError):
    before = launches[0]
    with pytest.raises(exc) as err:
        fn(**kw)
    text = str(err.value)
    assert re.search(rf"(?<![\w.]){re.escape(arg)}(?!\w)", text) and re.search(words, text), text
    assert launches[0] == before, text


@pytest.mark.parametrize("entry, out, other", C_ALIAS, ids=[f"{e}-{o}-aliases-{b}" for e, o, b in C_ALIAS])
def test_a_compat_output_sharing_memory_is_refused(launches, entry, out, other):
    fn, kw, _ = COMPAT[entry]()
    kw[out], kw[other] = _shared(kw[out], kw[other])
    _refused(fn, kw, launches, out, "overlaps")


@pytest.mark.parametrize("entry, out", C_EXPAND, ids=[f"{e}-{o}" for e, o in C_EXPAND])
def test_a_compat_expanded_output_is_refused(launches, entry, out):
    fn, kw, _ = COMPAT[entry]()
    kw[out] = _expanded(kw[out])
    _refused(fn, kw, launches, out, "share memory")


@pytest.mark.parametrize("entry, arg", C_GRAD, ids=[f"{e}-{a}" for e, a in C_GRAD])
def test_a_compat_input_requiring_grad_is_refused(launches, entry, arg):
    fn, kw, _ = COMPAT[entry]()
    kw[arg] = kw[arg].clone().requires_grad_()
    with torch.enable_grad():
        _refused(fn, kw, launches, arg, "aotc is inference-only", NotImplementedError)


@pytest.mark.parametrize("who", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"])
@pytest.mark.parametrize("arg", ["q", "k", "v", "g", "beta", "initial_state"])
def test_fla_inputs_requiring_grad_give_outputs_whose_backward_raises(who, arg):
    # fla's tests build every input with requires_grad and compare forwards before any backward:
    # the forward runs, and the graph ends in a node that refuses to differentiate (compat/_fla_args).
    t, h0, cu = fla_inputs([3, 5], seed=3)
    kw = dict(t, initial_state=h0, cu_seqlens=cu, output_final_state=True)
    kw[arg] = kw[arg].clone().requires_grad_()
    with torch.enable_grad():
        o, ht = getattr(fla, who)(**kw)
        assert o.requires_grad and ht.requires_grad
        with pytest.raises(NotImplementedError, match="inference-only"):
            (o.float().sum() + ht.sum()).backward()
    assert kw[arg].grad is None


@pytest.mark.parametrize("entry, name, value", [
    ("vllm.decode_attention_fwd", "sm_scale", True),
    ("vllm.decode_attention_fwd", "sm_scale", math.nan),
    ("vllm.context_attention_fwd", "sliding_window", True),
    ("vllm.chunked_prefill_paged_decode", "sliding_window", True),
    ("vllm.context_attention_fwd", "sm_scale", True),
])
def test_a_compat_bool_number_is_refused(launches, entry, name, value):
    fn, kw, _ = COMPAT[entry]()
    kw[name] = value
    _refused(fn, kw, launches, name, ".", (TypeError, ValueError))


@pytest.mark.parametrize("entry, name", [("vllm.decode_attention_fwd", "b_seq_len"),
                                         ("vllm.decode_attention_fwd", "req_to_token"),
                                         ("vllm.context_attention_fwd", "b_seq_len")])
@pytest.mark.parametrize("value", [2 ** 32 + 5, -2 ** 32 + 2])
def test_a_compat_int64_index_outside_int32_is_refused(launches, entry, name, value):
    """Wrapped to int32, 2**32 + 5 is 5: a length or page id the op's own checks would accept."""
    fn, kw, _ = COMPAT[entry]()
    kw[name] = kw[name].long().clone()
    kw[name].view(-1)[0] = value
    _refused(fn, kw, launches, name, "does not fit int32")


# -- gated_delta_prefill: int64 indices, the empty batch -----------------------------------------------
def _gdp(**kw):
    case = gdp_case([3, 5, 2], H=1, HV=2, K=64, V=64, seed=8, **kw)
    return {n: case[n] for n in ("q", "k", "v", "g", "beta", "state", "state_indices", "cu_seqlens")}


def test_a_wrapping_int64_state_index_is_refused_when_validated(launches):
    case = _gdp()
    idx = case["state_indices"].long()
    idx[1] = -2 ** 32 + 2  # int32: 2, another sequence's slot
    case["state_indices"] = idx
    state = case["state"].clone()
    with pytest.raises(ValueError, match=r"state_indices\[1\] = -4294967294 does not fit int32"):
        gated_delta_prefill(**case)
    assert launches[0] == 0 and same_bits(case["state"], state)


def test_a_wrapping_int64_cu_seqlens_is_refused():
    case = _gdp()
    case["cu_seqlens"] = case["cu_seqlens"].long() + torch.tensor([0, 2 ** 32, 2 ** 32, 0])
    with pytest.raises(ValueError, match="cu_seqlens"):
        gated_delta_prefill(**case)


def test_unvalidated_a_wrapping_int64_state_index_is_a_padded_sequence(launches):
    """Under graph capture values cannot be read: an index outside int32 becomes -1 (padded), never
    the slot it would wrap to."""
    wrapped, padded = _gdp(), _gdp()
    idx = wrapped["state_indices"].long()
    idx[1] = -2 ** 32 + 2
    wrapped["state_indices"] = idx
    padded["state_indices"] = padded["state_indices"].clone()
    padded["state_indices"][1] = -1
    out_w = gated_delta_prefill(**wrapped, validate=False)
    out_p = gated_delta_prefill(**padded, validate=False)
    assert same_bits(out_w, out_p) and same_bits(wrapped["state"], padded["state"])


@pytest.mark.parametrize("n", [0, 2])
def test_an_empty_prefill_batch_is_a_no_op(launches, n):
    """T = 0 tokens (N = 0 sequences, or N sequences of length 0): an empty out, states untouched."""
    case = _gdp()
    for name in ("q", "k", "v", "g", "beta"):
        case[name] = case[name][:, :0]
    case["state_indices"] = case["state_indices"][:n]
    case["cu_seqlens"] = torch.zeros(n + 1, dtype=torch.int32)
    state = case["state"].clone()
    out = gated_delta_prefill(**case)
    assert out.shape == (1, 0, 2, 64) and launches[0] == 0 and same_bits(case["state"], state)
    assert "An empty batch (T = 0, N >= 0) is a no-op" in gated_delta_prefill.__doc__


# -- store_kv's value checks ---------------------------------------------------------------------------
def _store(fmt="int8"):
    from tests.cpu.kernels.decode.cases import make_case

    case = make_case([0], fmt=fmt, kv_heads=2, group=1, page_size=4, extra_pages=3, seed=4)
    g = torch.Generator().manual_seed(5)
    k = torch.randn(6, 2, 64, generator=g).to(torch.bfloat16)
    v = torch.randn(6, 2, 64, generator=g).to(torch.bfloat16)
    slots = torch.randperm(case.k_cache.shape[0] * 4, generator=g)[:6].to(torch.int32)
    return dict(k=k, v=v, k_cache=case.k_cache, v_cache=case.v_cache, slots=slots,
                k_scale=case.kwargs.get("k_scale"), v_scale=case.kwargs.get("v_scale"))


def test_store_kv_refuses_a_slot_named_twice_writing_nothing():
    a = _store()
    a["slots"][4] = a["slots"][1]
    kept = a["k_cache"].clone(), a["v_cache"].clone()
    with pytest.raises(ValueError, match=r"slots\[1\] and slots\[4\] are both slot"):
        store_kv(**a)
    assert same_bits(a["k_cache"], kept[0]) and same_bits(a["v_cache"], kept[1])


@pytest.mark.parametrize("name", ["k_scale", "v_scale"])
@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_store_kv_refuses_an_fp8_scale_that_is_not_positive_and_finite(name, value):
    a = _store("fp8_e4m3")
    a["k_scale"], a["v_scale"] = torch.tensor([0.5]), torch.tensor([0.5])
    a[name] = torch.tensor([value])
    kept = a["k_cache"].clone()
    with pytest.raises(ValueError, match=rf"{name}\[0\] = .*finite and > 0"):
        store_kv(**a)
    assert same_bits(a["k_cache"], kept)


def test_store_kv_fp8_with_good_scales_and_unique_slots_writes_no_nan():
    a = _store("fp8_e4m3")
    a["k_scale"], a["v_scale"] = torch.tensor([0.5]), torch.tensor([2.0])
    store_kv(**a)
    page, off = (a["slots"] // 4).long(), (a["slots"] % 4).long()
    assert torch.isfinite(a["k_cache"][page, off].float()).all()
