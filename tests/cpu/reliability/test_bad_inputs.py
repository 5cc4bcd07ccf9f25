"""Generated bad inputs for every op: decode, store_kv, prefix_prefill, gated_delta_decode,
gated_delta_prefill.

Each op has one good call (small CPU shapes, run through Triton's interpreter). From it, every
tensor argument gets wrong dtypes (float64, int64, bool), one rank more and one less, the "meta"
device (a wrong device on a CPU box), a non-tensor, and a last dim of stride 2; then each op's own
value cases (negative and past-the-end lengths, page ids, request indices and state slots, bad
options, empty batches, `out` sharing memory with an input).

The rule each case is held to:
- refused: TypeError/ValueError whose message names the argument (a wrong device may name the
  argument it disagrees with, and then says "meta"), with no kernel launched (the launch path is
  wrapped and counted) and, for store_kv, nothing written;
- or accepted: then the outputs equal the good call's bit for bit (a strided input read by its
  strides, an output that may share memory with an input because no element is written before it
  is read). An accepted wrong type, rank or device fails.
NaN and inf inputs are not errors: the rows they reach come out NaN/inf ("NaN in, NaN out", said
in each op's docstring) and no other row changes.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

import aotc.loader.dispatch as dispatch
import aotc.loader.ops.split_merge as split_merge_mod
import aotc.loader.ops.gated_delta as gdn_mod
from aotc.loader.ops.gated_delta_prefill import gated_delta_prefill
from aotc.loader.ops.decode import decode
from aotc.loader.ops.prefix_prefill import prefix_prefill
from aotc.loader.ops.store_kv import store_kv
from tests.cpu.kernels.decode.cases import make_case as decode_case
from tests.cpu.kernels.gated_delta.cases import make_case as gdn_case
from tests.cpu.kernels.gated_delta.chunk_cases import make_case as gdp_case
from tests.cpu.kernels.prefix_prefill.cases import make_case as pp_case

REFUSE = (TypeError, ValueError)


@pytest.fixture
def launches(monkeypatch):
    """Counts kernel launches (each still runs): a refusal must come with none."""
    count = [0]
    real = dispatch.run_kernel

    def counted(*a, **k):
        count[0] += 1
        return real(*a, **k)

    for module in (dispatch, split_merge_mod, gdn_mod):
        monkeypatch.setattr(module, "run_kernel", counted)
    return count


# -- the ops' good calls: (positional names, args dict, keywords, run(args, kw) -> output tensors) --------
def _decode_good():
    case = decode_case([5, 0, 17, 33], fmt="bf16", kv_heads=2, group=2, page_size=16, req_idx=True, seed=3)
    names = ["q", "k_cache", "v_cache", "table", "seq_lens"]
    args = dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, table=case.table, seq_lens=case.seq_lens)
    kw = dict(case.kwargs, num_splits=2, out=torch.full_like(case.q, float("nan")))
    return names, args, kw


def _decode_run(names, args, kw):
    kw = dict(kw)
    if isinstance(kw.get("out"), torch.Tensor) and kw["out"].data_ptr() not in {
            a.data_ptr() for a in args.values() if isinstance(a, torch.Tensor)}:
        kw["out"] = kw["out"].clone()
    return [decode(*[args[n] for n in names], **kw)]


def _store_good():
    case = decode_case([0], fmt="int8", kv_heads=2, group=1, page_size=4, extra_pages=3, seed=4)
    g = torch.Generator().manual_seed(5)
    k = torch.randn(6, 2, 64, generator=g).to(torch.bfloat16)
    v = torch.randn(6, 2, 64, generator=g).to(torch.bfloat16)
    slots = torch.randperm(case.k_cache.shape[0] * 4, generator=g)[:6].to(torch.int32)
    names = ["k", "v", "k_cache", "v_cache", "slots"]
    args = dict(k=k, v=v, k_cache=case.k_cache, v_cache=case.v_cache, slots=slots)
    return names, args, dict(k_scale=case.kwargs["k_scale"], v_scale=case.kwargs["v_scale"])


def _store_run(names, args, kw):
    written = {n: t.clone() for n, t in {**args, **kw}.items()
               if n in ("k_cache", "v_cache", "k_scale", "v_scale") and isinstance(t, torch.Tensor)}
    if len({id(t) for t in {**args, **kw}.values()}) < len({**args, **kw}):  # one tensor passed twice
        written = {}
    args = {n: written.get(n, t) for n, t in args.items()}
    kw = {n: written.get(n, t) for n, t in kw.items()}
    store_kv(*[args[n] for n in names], **kw)
    return [written[n] for n in sorted(written)]


def _pp_good():
    case, kw = pp_case([0, 17, 40], [5, 1, 12], q_heads=2, kv_heads=2, head_dim=64, block_size=16, seed=6)
    names = ["q", "k", "v", "k_cache", "v_cache", "block_table", "query_start_loc", "seq_lens"]
    return names, case, dict(kw, out=torch.full_like(case["q"], float("nan")))


def _pp_run(names, args, kw):
    kw = dict(kw)
    if isinstance(kw.get("out"), torch.Tensor) and not any(
            isinstance(a, torch.Tensor) and a.data_ptr() == kw["out"].data_ptr() for a in args.values()):
        kw["out"] = kw["out"].clone()
    return [prefix_prefill(*[args[n] for n in names], **kw)]


def _gdn_good():
    args, kw = gdn_case(B=3, T=2, H=1, HV=2, K=64, V=64, seed=7)
    names = ["q", "k", "v", "g", "beta", "state", "state_indices"]
    q, v = args["q"], args["v"]
    return names, args, dict(kw, out=torch.full((*q.shape[:2], *v.shape[2:]), float("nan"), dtype=q.dtype))


def _gdn_run(names, args, kw):
    if isinstance(args["state"], torch.Tensor):
        args = dict(args, state=args["state"].clone())
    kw = dict(kw)
    if isinstance(kw.get("out"), torch.Tensor) and not any(
            isinstance(a, torch.Tensor) and a.data_ptr() == kw["out"].data_ptr() for a in args.values()):
        kw["out"] = kw["out"].clone()
    out = gdn_mod.gated_delta_decode(*[args[n] for n in names], **kw)
    return [out, args["state"]]


def _gdp_good():
    case = gdp_case([3, 5, 2], H=1, HV=2, K=64, V=64, padded=(2,), seed=8)
    names = ["q", "k", "v", "g", "beta", "state", "state_indices", "cu_seqlens"]
    return names, case, dict(out=torch.full_like(case["v"], float("nan")))


def _gdp_run(names, args, kw):
    if isinstance(args["state"], torch.Tensor):
        args = dict(args, state=args["state"].clone())
    kw = dict(kw)
    if isinstance(kw.get("out"), torch.Tensor) and not any(
            isinstance(a, torch.Tensor) and a.data_ptr() == kw["out"].data_ptr() for a in args.values()):
        kw["out"] = kw["out"].clone()
    out = gated_delta_prefill(*[args[n] for n in names], **kw)
    return [out, args["state"]]


OPS = {"decode": (_decode_good, _decode_run), "store_kv": (_store_good, _store_run),
       "prefix_prefill": (_pp_good, _pp_run), "gated_delta_decode": (_gdn_good, _gdn_run),
       "gated_delta_prefill": (_gdp_good, _gdp_run)}
# Dtypes an op documents as accepted (converted): the answer must then be the same.
ACCEPTED = {("gated_delta_prefill", "state_indices", "dtype=int64"), ("gated_delta_prefill", "cu_seqlens", "dtype=int64")}


# -- generated mutations of every tensor argument --------------------------------------------------------
def _strided(t):
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def _lower_rank(t):
    return t.reshape(-1) if t.dim() >= 2 else t[0]


GENERIC = {  # mutation -> (change, accepted with the same answer allowed)
    "dtype=float64": (lambda t: t.to(torch.float64), False),
    "dtype=int64": (lambda t: t.to(torch.int64), False),
    "dtype=bool": (lambda t: t.to(torch.bool), False),
    "rank+1": (lambda t: t[None], False),
    "rank-1": (_lower_rank, False),
    "device=meta": (lambda t: t.to("meta"), False),
    "not a tensor": (lambda t: t.tolist(), False),
    "last-dim stride 2": (_strided, True),
}


def _tensor_shapes(op) -> dict:
    names, args, kw = OPS[op][0]()
    return {n: t.shape for n, t in {**args, **kw}.items() if isinstance(t, torch.Tensor)}


_SHAPES = {op: _tensor_shapes(op) for op in OPS}
GENERATED = [(op, arg, m) for op in OPS for arg, shape in _SHAPES[op].items() for m in GENERIC
             if not (m == "last-dim stride 2" and (not shape or shape[-1] < 2))
             and not (m == "dtype=bool" and arg == "out")]


# -- each op's own value cases: (op, id, change(args, kw) in place, argument named, accepted allowed) ----
def _set(name, index, value):
    def change(args, kw):
        t = (args if name in args else kw)[name]
        t[index] = value
    return change


def _kw(**values):
    return lambda args, kw: kw.update(values)


def _alias(out_name, src):
    def change(args, kw):
        (args if out_name in args else kw)[out_name] = (args if src in args else kw)[src]
    return change


def _empty_batch(*names):
    def change(args, kw):
        for n in names:
            d = args if n in args else kw
            d[n] = d[n][:0]
    return change


VALUES = [
    # decode: lengths [5, 0, 17, 33], pages of 16, req_idx into a table of 6 rows, 3 pages wide
    ("decode", "seq_lens -1", _set("seq_lens", 1, -1), "seq_lens", False),
    ("decode", "seq_lens past the table", _set("seq_lens", 2, 3 * 16 + 1), "seq_lens", False),
    ("decode", "seq_lens int32 max", _set("seq_lens", 0, 2 ** 31 - 1), "seq_lens", False),
    ("decode", "req_idx -1", _set("req_idx", 0, -1), "req_idx", False),
    ("decode", "req_idx past the rows", _set("req_idx", 3, 6), "req_idx", False),
    ("decode", "page id -1", lambda a, k: a["table"].__setitem__((k["req_idx"][2], 0), -1), "table", False),
    ("decode", "page id past the cache",
     lambda a, k: a["table"].__setitem__((k["req_idx"][3], 2), a["k_cache"].shape[0]), "table", False),
    ("decode", "window 0", _kw(window=0), "window", False),
    ("decode", "window -1", _kw(window=-1), "window", False),
    ("decode", "window True", _kw(window=True), "window", False),
    ("decode", "window 1.5", _kw(window=1.5), "window", False),
    ("decode", "sm_scale nan", _kw(sm_scale=math.nan), "sm_scale", False),
    ("decode", "sm_scale inf", _kw(sm_scale=math.inf), "sm_scale", False),
    ("decode", "sm_scale str", _kw(sm_scale="0.1"), "sm_scale", False),
    ("decode", "num_splits 0", _kw(num_splits=0), "num_splits", False),
    ("decode", "num_splits 65", _kw(num_splits=65), "num_splits", False),
    ("decode", "kv_format int3", _kw(kv_format="int3"), "kv_format", False),
    ("decode", "kv_format int8 on bf16", _kw(kv_format="int8"), "k_cache", False),
    ("decode", "k_scale on bf16", lambda a, k: k.update(k_scale=torch.ones(1), v_scale=torch.ones(1)),
     "k_scale", False),
    ("decode", "sinks wrong length", _kw(sinks=torch.zeros(3)), "sinks", False),
    ("decode", "out is q", _alias("out", "q"), "out", True),
    ("decode", "out wrong shape", lambda a, k: k.update(out=k["out"][:, :1]), "out", False),
    ("decode", "empty batch", _empty_batch("q", "seq_lens", "req_idx", "out"), None, True),
    # store_kv: 6 tokens into an int8 cache of 4 pages of 4 slots
    ("store_kv", "slot -1", _set("slots", 0, -1), "slots", False),
    ("store_kv", "slot past the cache", lambda a, k: a["slots"].__setitem__(1, a["k_cache"].shape[0] * 4),
     "slots", False),
    ("store_kv", "slots int32 max", _set("slots", 2, 2 ** 31 - 1), "slots", False),
    ("store_kv", "v_cache is k_cache", _alias("v_cache", "k_cache"), "v_cache", False),
    ("store_kv", "v_scale is k_scale", _alias("v_scale", "k_scale"), "v_scale", False),
    ("store_kv", "scales missing", lambda a, k: k.update(k_scale=None, v_scale=None), "k_scale", False),
    ("store_kv", "kv_format bf16 on int8", _kw(kv_format="bf16"), "k_cache", False),
    ("store_kv", "empty batch", _empty_batch("k", "v", "slots"), None, True),
    # prefix_prefill: contexts [0, 17, 40], new tokens [5, 1, 12], blocks of 16
    ("prefix_prefill", "query_start_loc[0] 1", _set("query_start_loc", 0, 1), "query_start_loc", False),
    ("prefix_prefill", "query_start_loc decreasing", _set("query_start_loc", 2, 2), "query_start_loc", False),
    ("prefix_prefill", "query_start_loc past q", _set("query_start_loc", 3, 19), "query_start_loc", False),
    ("prefix_prefill", "seq_lens below new tokens", _set("seq_lens", 2, 3), "seq_lens", False),
    ("prefix_prefill", "seq_lens -1", _set("seq_lens", 0, -1), "seq_lens", False),
    ("prefix_prefill", "seq_lens past the table", _set("seq_lens", 2, 40 + 12 + 16 * 3), "seq_lens", False),
    ("prefix_prefill", "block id -1", _set("block_table", (2, 0), -1), "block_table", False),
    ("prefix_prefill", "block id past the cache",
     lambda a, k: a["block_table"].__setitem__((1, 1), a["k_cache"].shape[0]), "block_table", False),
    ("prefix_prefill", "window -1", _kw(window=-1), "window", False),
    ("prefix_prefill", "window 1.5", _kw(window=1.5), "window", False),
    ("prefix_prefill", "sm_scale nan", _kw(sm_scale=math.nan), "sm_scale", False),
    ("prefix_prefill", "kv_layout nchw", _kw(kv_layout="nchw"), "kv_layout", False),
    ("prefix_prefill", "k_scale on fp16", _kw(k_scale=torch.ones(1)), "k_scale", False),
    ("prefix_prefill", "out is q", _alias("out", "q"), "out", False),
    ("prefix_prefill", "out is k", _alias("out", "k"), "out", False),
    ("prefix_prefill", "out is v", _alias("out", "v"), "out", False),
    ("prefix_prefill", "empty batch",
     lambda a, k: a.update(q=a["q"][:0], k=a["k"][:0], v=a["v"][:0], block_table=a["block_table"][:0],
                           query_start_loc=a["query_start_loc"][:1], seq_lens=a["seq_lens"][:0])
     or k.update(out=k["out"][:0]), None, True),
    # gated_delta_decode: 3 requests (row 1 padded) over a pool of 9 slots
    ("gated_delta_decode", "state index past the pool", lambda a, k: a["state_indices"].__setitem__(0, 9),
     "state_indices", False),
    ("gated_delta_decode", "state index twice",
     lambda a, k: a["state_indices"].__setitem__(2, int(a["state_indices"][0])), "state_indices", False),
    ("gated_delta_decode", "scale nan", _kw(scale=math.nan), "scale", False),
    ("gated_delta_decode", "scale True", _kw(scale=True), "scale", False),
    ("gated_delta_decode", "state_layout", _kw(state_layout="hmajor"), "state_layout", False),
    ("gated_delta_decode", "qk_l2norm 1", _kw(qk_l2norm=1), "qk_l2norm", False),
    ("gated_delta_decode", "out is v", _alias("out", "v"), "out", True),
    # gated_delta_prefill: sequences of 3, 5 and 2 tokens (the last padded) over a pool of 6 slots
    ("gated_delta_prefill", "cu_seqlens[0] 1", _set("cu_seqlens", 0, 1), "cu_seqlens", False),
    ("gated_delta_prefill", "cu_seqlens decreasing", _set("cu_seqlens", 2, 1), "cu_seqlens", False),
    ("gated_delta_prefill", "cu_seqlens short of T", _set("cu_seqlens", 3, 9), "cu_seqlens", False),
    ("gated_delta_prefill", "cu_seqlens past T", _set("cu_seqlens", 3, 11), "cu_seqlens", False),
    ("gated_delta_prefill", "state index past the pool", _set("state_indices", 0, 6), "state_indices", False),
    ("gated_delta_prefill", "state index twice",
     lambda a, k: a["state_indices"].__setitem__(1, int(a["state_indices"][0])), "state_indices", False),
    ("gated_delta_prefill", "scale inf", _kw(scale=math.inf), "scale", False),
    ("gated_delta_prefill", "state_layout", _kw(state_layout="hmajor"), "state_layout", False),
    ("gated_delta_prefill", "qk_l2norm 1", _kw(qk_l2norm=1), "qk_l2norm", False),
    ("gated_delta_prefill", "out is v", _alias("out", "v"), "out", False),
    ("gated_delta_prefill", "empty batch",
     lambda a, k: a.update(q=a["q"][:, :0], k=a["k"][:, :0], v=a["v"][:, :0], g=a["g"][:, :0],
                           beta=a["beta"][:, :0], state_indices=a["state_indices"][:0],
                           cu_seqlens=a["cu_seqlens"][:1]) or k.update(out=k["out"][:, :0]), None, True),
    ("gated_delta_decode", "empty batch",
     _empty_batch("q", "k", "v", "g", "beta", "state_indices", "out"), None, True),
]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes and bytes (NaN equals NaN: the good calls' caches hold NaN poison)."""
    flat = [t.contiguous().reshape(-1) for t in (a, b)]
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(*[
        t.view(torch.uint8) if t.dtype != torch.bool else t for t in flat])


def _judge(op, change, arg, may_accept, launches, mention=None):
    good, run = OPS[op]
    names, args, kw = good()
    expected = None
    if may_accept:
        expected = run(names, *good()[1:])
    change(args, kw)
    before = launches[0]
    kept = {n: t.clone() for n, t in {**args, **kw}.items() if isinstance(t, torch.Tensor) and t.device.type == "cpu"}
    try:
        got = run(names, args, kw)
    except REFUSE as e:
        text = str(e)
        if arg is not None:
            named = re.search(rf"(?<![\w.]){re.escape(arg)}(?![\w])", text) or (mention and mention in text)
            assert named, f"{op}: the error does not name {arg}: {text}"
        assert launches[0] == before, f"{op}: launched a kernel before refusing: {text}"
        for n, t in kept.items():  # nothing written either (store_kv's caches, a state pool)
            assert same_bits({**args, **kw}[n], t), f"{op}: {n} was written before the refusal"
        return "refused"
    assert may_accept, f"{op}: accepted a bad {arg}"
    if arg is None:  # an empty batch: an empty answer
        assert all(t.numel() == 0 or t.shape == e.shape for t, e in zip(got, expected))
        return "accepted"
    for t, e in zip(got, expected):
        assert same_bits(t, e), f"{op}: accepted {arg} but the answer changed"
    return "accepted"


@pytest.mark.parametrize("op, arg, mutation", GENERATED, ids=[f"{o}-{a}-{m}" for o, a, m in GENERATED])
def test_generated_bad_tensor_is_refused_naming_it_before_any_launch(launches, op, arg, mutation):
    change, may_accept = GENERIC[mutation]
    may_accept = may_accept or (op, arg, mutation) in ACCEPTED

    def apply(args, kw):
        d = args if arg in args else kw
        d[arg] = change(d[arg])

    _judge(op, apply, arg, may_accept, launches, mention="meta" if mutation == "device=meta" else None)


@pytest.mark.parametrize("op, name, change, arg, may_accept", VALUES, ids=[f"{v[0]}-{v[1]}" for v in VALUES])
def test_bad_value_is_refused_naming_it_before_any_launch(launches, op, name, change, arg, may_accept):
    _judge(op, change, arg, may_accept, launches)


def test_the_good_calls_launch(launches):
    """The control: each good call passes its checks and launches (store_kv has no kernel)."""
    for op, (good, run) in OPS.items():
        before = launches[0]
        out = run(*good())[0]  # the op's output (state pools keep their NaN-poisoned spare slots)
        assert not out.is_floating_point() or torch.isfinite(out.float()).all(), op
        assert launches[0] > before or op == "store_kv", op


# -- NaN in, NaN out ---------------------------------------------------------------------------------------
NAN_CASES = [  # (op, input, index poisoned, output index reached, value)
    pytest.param("decode", "q", (2,), (2,), math.nan, id="decode-q-nan"),
    pytest.param("decode", "q", (3, 1), (3, 1), math.inf, id="decode-q-inf"),
    pytest.param("prefix_prefill", "q", (7,), (7,), math.nan, id="prefix_prefill-q-nan"), pytest.param("prefix_prefill", "v", (5, 0), (5, 0), math.inf, id="prefix_prefill-v-inf"),
    pytest.param("gated_delta_decode", "q", (0, 1), (0, 1), math.nan, id="gated_delta_decode-q-nan"), pytest.param("gated_delta_decode", "v", (2, 0), (2,), math.nan, id="gated_delta_decode-v-nan"),
    pytest.param("gated_delta_prefill", "q", (0, 4), (0, 4), math.nan, id="gated_delta_prefill-q-nan"),
]


@pytest.mark.parametrize("op, name, where, reached, value", NAN_CASES)
def test_nan_in_nan_out_and_no_other_row_changes(launches, op, name, where, reached, value):
    good, run = OPS[op]
    names, args, kw = good()
    expected = run(names, *good()[1:])[0]
    d = args if name in args else kw
    d[name] = d[name].clone()
    d[name][where] = value
    got = run(names, args, kw)[0]
    assert not torch.isfinite(got[reached].float()).any(), "a NaN/inf input gave a finite answer where it reaches"
    mask = torch.ones(got.shape[: len(reached)], dtype=torch.bool)
    mask[reached] = False
    assert torch.equal(got[mask], expected[mask])
    assert "NaN in, NaN out" in {"decode": decode, "prefix_prefill": prefix_prefill,  # said where a user reads it
                                 "gated_delta_decode": gdn_mod.gated_delta_decode,
                                 "gated_delta_prefill": gated_delta_prefill}[op].__doc__


def test_case_counts():
    per_op = {op: sum(c[0] == op for c in GENERATED) + sum(v[0] == op for v in VALUES) for op in OPS}
    print(f"\nbad-input cases per op: {per_op} (+{len(NAN_CASES)} NaN/inf cases)")
    assert all(n >= 20 for n in per_op.values())
