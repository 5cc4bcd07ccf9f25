"""PrefixPrefillPlan, GatedDeltaDecodePlan and GatedDeltaPrefillPlan on CPU tensors.

Through the interpreter (the plans' general path): a plan's runs over two layers write what the
eager op writes, bit for bit (outputs and states), and a run whose tensor differs from the plan's
in dtype, shape, strides, device or presence, overlaps another argument or requires grad raises
naming it before any launch (the NaN-poisoned output stays NaN). With prepared launches whose
driver calls are recorded (test_launch_fast_path's Recorder): runs take the one-call path and
pack each layer's pointers, the step's tensors and a GatedDeltaPrefillPlan's own workspaces
(the same addresses every run)."""
import pytest
import torch

from aotc import loader
from aotc.loader import dispatch
from aotc.loader.ops import gated_delta, gated_delta_prefill, plan, prefix_prefill
from tests.cpu.kernels.gated_delta.cases import make_case as gdn_case
from tests.cpu.kernels.gated_delta.chunk_cases import make_case as chunk_case
from tests.cpu.kernels.prefix_prefill.cases import make_case as pp_case
from tests.cpu.loader.ops.test_launch_fast_path import STREAM, Recorder

NAN = float("nan")


def _same(a, b) -> bool:
    return torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)


def _halved(c, names):
    """Another layer of the same step: `names`' values halved (NaN where the first layer's are)."""
    return dict(c, **{n: c[n] * 0.5 for n in names})


# -- the three plans and their eager ops ---------------------------------------------------------
def _pp():
    case, kw = pp_case([5, 17], [3, 4], q_heads=2, kv_heads=1, head_dim=32, block_size=16, seed=65)
    p = loader.PrefixPrefillPlan(case["block_table"], case["query_start_loc"], case["seq_lens"], q=case["q"],
                                 k=case["k"], v=case["v"], k_cache=case["k_cache"], v_cache=case["v_cache"], **kw)
    return p, case, kw


def _gdd(fused=False, dense=False):
    args, kw = gdn_case(B=3, T=2, H=1, HV=2, K=32, V=32, fused=fused, pads=() if dense else (1,),
                        slots=3 if dense else None, seed=66)
    if dense:
        args["state_indices"] = None
    p = loader.GatedDeltaDecodePlan(args["state_indices"], **{n: t for n, t in args.items() if n != "state_indices"},
                                    **kw)
    return p, args, kw


def _gdp(kda=False):
    c = chunk_case([5, 70], H=1, HV=2, K=32, V=32, dtype=torch.float32, kda=kda, seed=67)
    p = loader.GatedDeltaPrefillPlan(c["state_indices"], c["cu_seqlens"], q=c["q"], k=c["k"], v=c["v"], g=c["g"],
                                     beta=c["beta"], state=c["state"], qk_l2norm=True)
    return p, c


_GATES = ("A_log", "a", "dt_bias", "b")


def test_prefix_prefill_plan_equals_the_op_per_layer():
    p, c0, kw = _pp()
    for c in (c0, _halved(c0, ("q", "k", "v", "k_cache", "v_cache"))):
        out = torch.full_like(c["q"], NAN)
        assert p.run(c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"], out) is out
        assert torch.equal(out, loader.prefix_prefill(**c, **kw))


@pytest.mark.parametrize("fused,dense", [(False, False), (True, False), (False, True), (True, True)])
def test_gated_delta_decode_plan_equals_the_op_per_layer(fused, dense):
    p, a0, kw = _gdd(fused, dense)
    for a in (a0, _halved(a0, ("q", "v", "state"))):
        state, out = a["state"].clone(), torch.full_like(a["v"], NAN)
        assert p.run(a["q"], a["k"], a["v"], a["g"], a["beta"], state, out, **{n: kw[n] for n in _GATES if n in kw}) \
            is out
        want = loader.gated_delta_decode(**a, **kw)
        assert torch.equal(out, want) and _same(state, a["state"])


@pytest.mark.parametrize("kda", [False, True])
def test_gated_delta_prefill_plan_equals_the_op_per_layer(kda):
    p, c0 = _gdp(kda)
    ws = [t.data_ptr() for t in p.workspace if t is not None]
    for c in (c0, _halved(c0, ("q", "v", "state"))):
        state, out = c["state"].clone(), torch.full_like(c["v"], NAN)
        p.run(c["q"], c["k"], c["v"], c["g"], c["beta"], state, out)
        want = loader.gated_delta_prefill(**c, qk_l2norm=True)
        assert torch.equal(out, want) and _same(state, c["state"])
    assert [t.data_ptr() for t in p.workspace if t is not None] == ws


# -- refusals, before any launch ----------------------------------------------------------------
def _restrided(t):
    """t's values with its second-to-last dim twice as far apart (same shape, other strides)."""
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    view = wide[..., :t.shape[-1]]
    view.copy_(t)
    return view


def _bad(name, first_input):
    """(what, change to the run's keyword arguments, exception, message) common to every plan."""
    return [
        ("dtype", lambda a: a.update({first_input: a[first_input].double()}), TypeError, f"{first_input} must be dtype"),
        ("shape", lambda a: a.update({first_input: a[first_input][:-1]}), ValueError, f"{first_input} must be"),
        ("strides", lambda a: a.update({first_input: _restrided(a[first_input])}), ValueError, "strides"),
        ("device", lambda a: a.update({first_input: torch.empty_like(a[first_input], device="meta")}), ValueError,
         "device meta"),
        ("not a tensor", lambda a: a.update({first_input: [1.0]}), TypeError, "a list"),
        ("out overlaps", lambda a: a.update(out=a["q"] if name == "PrefixPrefillPlan" else a["v"]), ValueError,
         "out overlaps"),
    ]


def _runs():
    p, c, kw = _pp()
    pp_args = dict(q=c["q"], k=c["k"], v=c["v"], k_cache=c["k_cache"], v_cache=c["v_cache"],
                   out=torch.full_like(c["q"], NAN))
    g, a, gkw = _gdd()
    gd_args = dict(q=a["q"], k=a["k"], v=a["v"], g=a["g"], beta=a["beta"], state=a["state"].clone(),
                   out=torch.full_like(a["v"], NAN))
    gp, cc = _gdp()
    gp_args = dict(q=cc["q"], k=cc["k"], v=cc["v"], g=cc["g"], beta=cc["beta"], state=cc["state"].clone(),
                   out=torch.full_like(cc["v"], NAN))
    return {"PrefixPrefillPlan": (p, pp_args), "GatedDeltaDecodePlan": (g, gd_args),
            "GatedDeltaPrefillPlan": (gp, gp_args)}


_CASES = [(plan_name, *bad) for plan_name in ("PrefixPrefillPlan", "GatedDeltaDecodePlan", "GatedDeltaPrefillPlan")
          for bad in _bad(plan_name, "q")]


@pytest.mark.parametrize("plan_name,what,change,exc,match", _CASES, ids=[f"{c[0]}-{c[1]}" for c in _CASES])
def test_run_refuses_an_argument_unlike_the_plan_naming_it(plan_name, what, change, exc, match):
    p, args = _runs()[plan_name]
    change(args)
    poisoned = args["out"]
    state = args.get("state")
    before = None if state is None else state.clone()
    with pytest.raises(exc, match=match) as e:
        p.run(**args)
    assert f"{plan_name}.run" in str(e.value)
    if isinstance(poisoned, torch.Tensor) and poisoned.dtype.is_floating_point and what != "out overlaps":
        assert poisoned.isnan().all()  # nothing launched
    if before is not None:
        assert _same(state, before)


def test_run_refuses_grad_and_an_argument_the_plan_was_made_without():
    p, args = _runs()["GatedDeltaDecodePlan"]
    with pytest.raises(ValueError, match=r"GatedDeltaDecodePlan.run: A_log must be None"):
        p.run(**args, A_log=torch.zeros(2))
    q = args["q"].clone().requires_grad_()
    with torch.enable_grad(), pytest.raises(NotImplementedError, match="q requires grad"):
        p.run(**dict(args, q=q))
    p, args = _runs()["PrefixPrefillPlan"]
    with pytest.raises(ValueError, match="k_scale must be None"):
        p.run(**args, k_scale=torch.ones(1))
    assert args["out"].isnan().all()


def test_plans_made_from_bad_arguments_raise_as_their_ops_do():
    c = chunk_case([5, 70], H=1, HV=2, K=32, V=32, dtype=torch.float32, seed=68)
    make = loader.GatedDeltaPrefillPlan
    base = dict(q=c["q"], k=c["k"], v=c["v"], g=c["g"], beta=c["beta"], state=c["state"])
    with pytest.raises(TypeError, match="GatedDeltaPrefillPlan: cu_seqlens must be a contiguous int32"):
        make(c["state_indices"], c["cu_seqlens"].long(), **base)
    with pytest.raises(TypeError, match="GatedDeltaPrefillPlan: g must be float32"):
        make(c["state_indices"], c["cu_seqlens"], **dict(base, g=c["g"].half()))
    bad = c["cu_seqlens"].clone()
    bad[-1] += 1
    with pytest.raises(ValueError, match=r"cu_seqlens\[-1\]"):  # the value checks, once
        make(c["state_indices"], bad, **base)
    make(c["state_indices"], bad, **base, validate=False)  # the caller's promise
    args, kw = gdn_case(B=3, T=2, H=1, HV=2, K=32, V=32, pads=(), seed=69)
    idx = args.pop("state_indices")
    idx[1] = idx[0]
    with pytest.raises(ValueError, match="names slot"):
        loader.GatedDeltaDecodePlan(idx, **args, **kw)
    case, kw = pp_case([5, 17], [3, 4], q_heads=2, kv_heads=1, head_dim=32, block_size=16, seed=70)
    with pytest.raises(ValueError, match="int4_rht"):
        loader.PrefixPrefillPlan(case["block_table"], case["query_start_loc"], case["seq_lens"], q=case["q"],
                                 k_cache=case["k_cache"], v_cache=case["v_cache"], kv_format="int4_rht")
    lens = case["seq_lens"].clone()
    lens[0] = 10 ** 6
    with pytest.raises(ValueError, match=r"seq_lens\[0\]"):
        loader.PrefixPrefillPlan(case["block_table"], case["query_start_loc"], lens, q=case["q"], k=case["k"],
                                 v=case["v"], k_cache=case["k_cache"], v_cache=case["v_cache"])


# -- prepared launches, recorded ----------------------------------------------------------------
@pytest.fixture
def rec(monkeypatch):
    """Prepared launches for CPU tensors: every plan takes the path a CUDA plan takes."""
    r = Recorder()

    def prepare(spec, axes, grid, ints, device, aligned_only=False):
        return r.prepare(spec, axes, grid, ints, device)

    monkeypatch.setattr(gated_delta, "prepare", prepare)
    monkeypatch.setattr(dispatch, "prepare", prepare)
    for module in (prefix_prefill, gated_delta_prefill):
        monkeypatch.setattr(module, "_prepares", lambda q: True)
    make = gated_delta._make_plan

    def prepared_make(*a):
        p = make(*a)
        if p.fast is None and p.grid[0]:
            p.fast = prepare(gated_delta.S.DECODE, p.axes, p.grid, p.ints, None)
        return p

    monkeypatch.setattr(gated_delta, "_make_plan", prepared_make)
    current, stream = (lambda: None), (lambda index: STREAM)  # a CPU tensor's device index is None
    from aotc.loader.ops import steady

    for module in (plan, steady):
        monkeypatch.setattr(module, "_current_device", current)
        monkeypatch.setattr(module, "_current_stream", stream)
    dispatch.reset()
    yield r
    dispatch.reset()


def _one_call_only(monkeypatch, p):
    def refuse(*a, **k):
        raise AssertionError("took the full check")

    monkeypatch.setattr(p, "run_checked", refuse)


def test_prefix_prefill_plan_packs_each_layers_pointers(rec, monkeypatch):
    p, c, kw = _pp()
    assert p.prepared
    _one_call_only(monkeypatch, p)
    q2, out = c["q"].clone(), torch.empty_like(c["q"])
    p.run(q2, c["k"], c["v"], c["k_cache"], c["v_cache"], out)
    (name, _, stream, slots), = rec.launches
    assert name == "prefix_prefill" and stream == STREAM
    want = [q2, c["k"], c["v"], c["k_cache"], c["v_cache"], out, c["block_table"], c["query_start_loc"], c["seq_lens"]]
    assert slots[:9] == [t.data_ptr() for t in want]


@pytest.mark.parametrize("fused,dense", [(False, False), (True, False), (False, True)])
def test_gated_delta_decode_plan_packs_each_layers_pointers(rec, monkeypatch, fused, dense):
    p, a, kw = _gdd(fused, dense)
    assert p.prepared
    _one_call_only(monkeypatch, p)
    q2, out = a["q"].clone(), torch.empty_like(a["v"])
    p.run(q2, a["k"], a["v"], a["g"], a["beta"], a["state"], out, **{n: kw[n] for n in _GATES if n in kw})
    (name, _, _, slots), = rec.launches
    idx = a["state"] if dense else a["state_indices"]  # dense: the index slots hold the state's address
    gates = [kw["a"], kw["b"], kw["A_log"], kw["dt_bias"]] if fused else [a["g"], a["beta"], idx, idx]
    want = [q2, a["k"], a["v"], out, a["state"], a["state"], *gates, idx]
    assert name == "gated_delta_decode" and slots[:11] == [t.data_ptr() for t in want]
    n = len(rec.launches)
    monkeypatch.delattr(p, "run_checked")  # the full check names the overlap
    with pytest.raises(ValueError, match="out overlaps"):
        p.run(q2, a["k"], a["v"], a["g"], a["beta"], a["state"], a["v"], **{n: kw[n] for n in _GATES if n in kw})
    assert len(rec.launches) == n


def test_gated_delta_prefill_plan_packs_its_own_workspace_every_run(rec, monkeypatch):
    p, c = _gdp()
    assert p.prepared
    _one_call_only(monkeypatch, p)
    w = p.workspace[0].data_ptr()
    qs = [c["q"].clone() for _ in range(2)]
    out = torch.empty_like(c["v"])
    for q2 in qs:
        p.run(q2, c["k"], c["v"], c["g"], c["beta"], c["state"], out)
    (prep, _, _, s1), (state, _, _, s2), (_, _, _, s3), (_, _, _, s4) = rec.launches
    assert prep == "gdn_chunk_prep" and state.startswith("gdn_chunk_state")
    assert (s1[0], s3[0]) == tuple(q.data_ptr() for q in qs)
    assert s1[5] == s3[5] == s2[0] == s4[0] == w  # W: the plan's, at one address every run
    assert s2[6] == out.data_ptr() and s2[9] == c["cu_seqlens"].data_ptr()
    q = c["q"]
    q.set_(torch.empty(1, q.shape[1] + 1, *q.shape[2:]))  # rebound in place: one token more
    monkeypatch.delattr(p, "run_checked")  # the full check names what differs
    n = len(rec.launches)
    with pytest.raises(ValueError, match="q must be"):
        p.run(q, c["k"], c["v"], c["g"], c["beta"], c["state"], out)
    assert len(rec.launches) == n
