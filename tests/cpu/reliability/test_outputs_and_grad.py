"""Generated cases of issue 37's classes 3 and 8 for every op (the good calls of test_bad_inputs.py):

- every output argument (written tensors: out, lse, a state pool, KV caches and their int8/int4
  scales) x {sharing its first bytes with each other tensor argument, an expand()ed stride-0
  view}: refused with a ValueError naming the output, before any launch, nothing written;
- through a cached plan (decode, gated_delta_decode with validate=False: no metadata check runs),
  an output aliasing an input is still refused (its addresses are compared every call);
- every floating-point tensor argument requiring grad while grad mode is on: NotImplementedError
  ("aotc is inference-only", naming it), through the public function and the torch.library op;
  under torch.no_grad() the same call runs;
- bools as numbers (num_splits=True, sm_scale=True, window=True, scale=True), also on a plan hit.
"""
from __future__ import annotations

import re

import pytest
import torch

import aotc.loader.ops.decode as decode_mod
import aotc.loader.ops.gated_delta as gdn_mod
from aotc.loader.ops.decode import decode
from aotc.loader.ops.decode_plan import DecodePlan
from aotc.loader.ops.gated_delta_prefill import gated_delta_prefill
from aotc.loader.ops.prefix_prefill import prefix_prefill
from aotc.loader.ops.store_kv import store_kv

from .test_bad_inputs import OPS, launches, same_bits  # noqa: F401  (launches: the fixture)

CALL = {"decode": decode, "store_kv": store_kv, "prefix_prefill": prefix_prefill,
        "gated_delta_decode": gdn_mod.gated_delta_decode, "gated_delta_prefill": gated_delta_prefill}
OUTPUTS = {"decode": ("out", "lse"), "store_kv": ("k_cache", "v_cache", "k_scale", "v_scale"),
           "prefix_prefill": ("out",), "gated_delta_decode": ("out", "state"), "gated_delta_prefill": ("out", "state")}


def good(op):
    """(positional names, args, keywords) of the op's good call; decode's also writes lse."""
    names, args, kw = OPS[op][0]()
    args, kw = dict(args), dict(kw)
    if op == "decode":
        kw.update(return_lse=True, lse=torch.full(args["q"].shape[:2], float("nan")))
    return names, args, kw


def run(op, names, args, kw):
    return CALL[op](*[args[n] for n in names], **kw)


def _tensors(args, kw) -> dict:
    return {n: t for n, t in {**args, **kw}.items() if isinstance(t, torch.Tensor)}


def _set(args, kw, name, value):
    (args if name in args else kw)[name] = value


def _shared(out_t: torch.Tensor, in_t: torch.Tensor):
    """(out', in'): contiguous tensors like out_t and in_t starting at the same byte, in' holding
    in_t's values (so every value check would pass)."""
    sizes = [t.numel() * t.element_size() for t in (out_t, in_t)]
    buf = torch.zeros(max(sizes) + 16, dtype=torch.uint8)
    in2 = buf[:sizes[1]].view(in_t.dtype).view(in_t.shape)
    in2.copy_(in_t)
    return buf[:sizes[0]].view(out_t.dtype).view(out_t.shape), in2


def _expanded(t: torch.Tensor) -> torch.Tensor:
    """t as an expand()ed view: a dim of size > 1 (not the last where another will do) of stride 0."""
    dims = [d for d in range(t.dim()) if t.shape[d] > 1]
    d = next((d for d in dims if d != t.dim() - 1), dims[0])
    return t.narrow(d, 0, 1).expand(t.shape)


def _cases():
    alias, expand = [], []
    for op, outs in OUTPUTS.items():
        tensors = _tensors(*good(op)[1:])
        for out in outs:
            alias += [(op, out, other) for other in tensors if other != out and tensors[other].numel()]
            if tensors[out].numel() > 1:
                expand.append((op, out))
    return alias, expand


ALIAS, EXPAND = _cases()


def _refused(op, names, args, kw, launches, arg, words, exc=ValueError):
    kept = {n: t.clone() for n, t in _tensors(args, kw).items()}
    before = launches[0]
    with pytest.raises(exc) as err:
        run(op, names, args, kw)
    text = str(err.value)
    assert re.search(rf"(?<![\w.]){re.escape(arg)}(?!\w)", text) and re.search(words, text), text
    assert launches[0] == before, f"{op}: launched before refusing: {text}"
    for n, t in kept.items():
        assert same_bits(_tensors(args, kw)[n], t), f"{op}: {n} written before the refusal"
    return text


@pytest.mark.parametrize("op, out, other", ALIAS, ids=[f"{o}-{a}-aliases-{b}" for o, a, b in ALIAS])
def test_an_output_sharing_memory_with_another_argument_is_refused(launches, op, out, other):
    names, args, kw = good(op)
    tensors = _tensors(args, kw)
    o2, i2 = _shared(tensors[out], tensors[other])
    _set(args, kw, out, o2)
    _set(args, kw, other, i2)
    _refused(op, names, args, kw, launches, out, "overlaps")


@pytest.mark.parametrize("op, out", EXPAND, ids=[f"{o}-{a}-expanded" for o, a in EXPAND])
def test_an_expanded_output_is_refused(launches, op, out):
    names, args, kw = good(op)
    _set(args, kw, out, _expanded(_tensors(args, kw)[out]))
    _refused(op, names, args, kw, launches, out, "share memory")


@pytest.mark.parametrize("op, out, other", [("decode", "out", "q"), ("decode", "lse", "out"),
                                            ("gated_delta_decode", "out", "v")])
def test_an_alias_is_refused_on_a_plan_hit_too(launches, op, out, other):
    """validate=False and the metadata of a call already planned: no metadata check runs, the
    addresses are still compared."""
    names, args, kw = good(op)
    kw["validate"] = False
    run(op, names, dict(args), dict(kw))  # plans this metadata
    plans = dict((decode_mod if op == "decode" else gdn_mod)._plans)
    tensors = _tensors(args, kw)
    alias = tensors[other]
    if tensors[out].dtype != alias.dtype or tensors[out].shape != alias.shape:  # same metadata, other bytes
        alias = alias.view(tensors[out].dtype).view(-1)[: tensors[out].numel()].view(tensors[out].shape)
    assert alias.stride() == tensors[out].stride()
    _set(args, kw, out, alias)
    _refused(op, names, args, kw, launches, out, "overlaps")
    assert (decode_mod if op == "decode" else gdn_mod)._plans.keys() == plans.keys()  # it was a hit


def test_decode_plan_refuses_aliased_and_expanded_outputs(launches):
    """At construction (decode's checks) and on every run (the layer's out against its inputs and
    against the step's table, by address)."""
    _names, args, kw = good("decode")
    common = dict(q=args["q"], k_cache=args["k_cache"], v_cache=args["v_cache"], req_idx=kw["req_idx"],
                  num_splits=2, return_lse=True)
    with pytest.raises(ValueError, match="out overlaps q"):
        DecodePlan(args["table"], args["seq_lens"], out=args["q"], **common)
    with pytest.raises(ValueError, match="lse has elements that share memory"):
        DecodePlan(args["table"], args["seq_lens"], lse=_expanded(kw["lse"]), **common)
    plan = DecodePlan(args["table"], args["seq_lens"], **common)
    out, lse = torch.empty_like(args["q"]), torch.empty_like(kw["lse"])
    before = launches[0]
    with pytest.raises(ValueError, match="out overlaps q"):
        plan.run(args["q"], args["k_cache"], args["v_cache"], args["q"], lse=lse)
    table_as_lse = args["table"].view(torch.float32).reshape(-1)[: lse.numel()].view(lse.shape)
    with pytest.raises(ValueError, match="lse overlaps table"):
        plan.run(args["q"], args["k_cache"], args["v_cache"], out, lse=table_as_lse)
    assert launches[0] == before
    plan.run(args["q"], args["k_cache"], args["v_cache"], out, lse=lse)
    assert launches[0] > before


# -- autograd ----------------------------------------------------------------------------------------
GRAD = [(op, n) for op in OPS for n, t in _tensors(*good(op)[1:]).items() if t.is_floating_point()]


@pytest.mark.parametrize("op, arg", GRAD, ids=[f"{o}-{a}" for o, a in GRAD])
def test_an_input_requiring_grad_is_refused_in_grad_mode(launches, op, arg):
    names, args, kw = good(op)
    _set(args, kw, arg, _tensors(args, kw)[arg].clone().requires_grad_())
    with torch.enable_grad():
        _refused(op, names, args, kw, launches, arg, "aotc is inference-only", NotImplementedError)


@pytest.mark.parametrize("op", list(OPS))
def test_under_no_grad_the_same_call_runs(launches, op):
    names, args, kw = good(op)
    grads = {n: t.clone().requires_grad_() for n, t in _tensors(args, kw).items() if t.is_floating_point()}
    for n, t in grads.items():
        _set(args, kw, n, t)
    with torch.no_grad():
        run(op, names, args, kw)
    assert all(t.grad_fn is None for t in grads.values())  # no cache joined an autograd graph


@pytest.mark.parametrize("op, call", [
    ("store_kv", lambda a, kw: torch.ops.aotc.store_kv(a["k"], a["v"], a["k_cache"], a["v_cache"], a["slots"],
                                                       kw["k_scale"], kw["v_scale"], "auto")),
    ("prefix_prefill", lambda a, kw: torch.ops.aotc.prefix_prefill(
        a["q"], a["k"], a["v"], a["k_cache"], a["v_cache"], a["block_table"], a["query_start_loc"], a["seq_lens"],
        kw["out"], "nhd", "auto", None, None, 0.125, 0, None, None, False, False, 0, None, False, 0.0)),
    ("gated_delta_prefill", lambda a, kw: torch.ops.aotc.gated_delta_prefill(
        a["q"], a["k"], a["v"], a["g"], a["beta"], a["state"], a["state_indices"], a["cu_seqlens"], kw["out"], 0.125,
        False, "vmajor", False)),
    ("decode", lambda a, kw: torch.ops.aotc.decode(a["q"], a["k_cache"], a["v_cache"], a["table"], a["seq_lens"],
                                                   kw["req_idx"], None, None, "auto", None, None, None, 2, kw["out"])),
])
def test_the_library_op_refuses_grad_too(launches, op, call):
    names, args, kw = good(op)
    first = names[0]
    args[first] = args[first].clone().requires_grad_()
    with torch.enable_grad(), pytest.raises(NotImplementedError, match=f"inference-only: {op}: {first} requires grad"):
        call(args, kw)


# -- bools are not numbers -------------------------------------------------------------------------
BOOLS = [("decode", "num_splits"), ("decode", "sm_scale"), ("decode", "window"), ("prefix_prefill", "sm_scale"),
         ("prefix_prefill", "window"), ("gated_delta_decode", "scale"), ("gated_delta_decode", "qk_l2norm"),
         ("gated_delta_prefill", "scale")]
PLAIN = {"num_splits": 1, "sm_scale": 1.0, "window": 1, "scale": 1.0, "qk_l2norm": True}
TRUE = {"qk_l2norm": 1}  # qk_l2norm is the bool: 1 is the wrong type there


@pytest.mark.parametrize("op, name", BOOLS, ids=[f"{o}-{n}" for o, n in BOOLS])
def test_a_bool_number_is_refused_even_on_a_plan_hit(launches, op, name):
    names, args, kw = good(op)
    if op in ("decode", "gated_delta_decode"):  # plan the plain value's metadata first
        run(op, names, dict(args), dict(kw, **{name: PLAIN[name]}, validate=False))
        kw["validate"] = False
    kw[name] = TRUE.get(name, True)
    before = launches[0]
    with pytest.raises((TypeError, ValueError), match=name):
        run(op, names, args, kw)
    assert launches[0] == before
