"""DecodePlan on CPU tensors (interpreter): run() per layer equals decode() bit for bit and the
float32 reference (cases.assert_close tolerances), and run() refuses a layer whose q, caches,
scales, out or lse differ from the plan's dtype, shape, strides or device, before any launch
(the poisoned output stays NaN)."""
import pytest
import torch

from aotc import loader
from aotc.loader.ops.decode import decode
from tests.cpu.kernels.decode.cases import assert_close, make_case

LENS = [0, 1, 63, 64, 65, 130]


def layers(n, **kw):
    """n layers' caches of one shape (different values), sharing the first layer's table and lengths."""
    first = make_case(LENS, seed=50, **kw)
    out = [first]
    for i in range(1, n):
        c = make_case(LENS, seed=50 + i, **kw)
        c.table, c.seq_lens = first.table, first.seq_lens
        if "req_idx" in first.kwargs:
            c.kwargs["req_idx"] = first.kwargs["req_idx"]
        out.append(c)
    return out


def scales(case):
    return case.kwargs.get("k_scale"), case.kwargs.get("v_scale")


def make_plan(case, **kw):
    ks, vs = scales(case)
    extra = {k: case.kwargs[k] for k in ("req_idx", "kv_format", "scale_layout") if k in case.kwargs}
    return loader.DecodePlan(case.table, case.seq_lens, q=case.q, k_cache=case.k_cache, v_cache=case.v_cache,
                             k_scale=ks, v_scale=vs, **extra, **kw)


@pytest.mark.parametrize("kw", [dict(fmt="bf16"), dict(fmt="int8", quant_group=32), dict(fmt="int4", quant_group=64),
                                dict(fmt="fp8_e4m3"), dict(fmt="int8", head_dim=128, quant_group=128, req_idx=True),
                                dict(fmt="fp16", token_level=True), dict(fmt="int4", head_major=True, quant_group=32)],
                         ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_run_per_layer_equals_decode_and_reference(kw):
    cases = layers(2, **kw)
    plan = make_plan(cases[0], num_splits=3)
    for c in cases:
        out = torch.full_like(c.q, float("nan"))
        got = plan.run(c.q, c.k_cache, c.v_cache, out, *scales(c))
        assert got is out
        assert_close(out, c.reference(), str(kw))
        want = decode(c.q, c.k_cache, c.v_cache, c.table, c.seq_lens, num_splits=3, **c.kwargs)
        assert torch.equal(out, want)


def test_run_with_lse_window_and_sinks():
    cases = layers(2, fmt="int8", quant_group=32)
    sinks = torch.randn(cases[0].q.shape[1])
    plan = make_plan(cases[0], window=70, sinks=sinks, return_lse=True, num_splits=2)
    for c in cases:
        out = torch.full_like(c.q, float("nan"))
        lse = torch.full(c.q.shape[:2], float("nan"))
        got_out, got_lse = plan.run(c.q, c.k_cache, c.v_cache, out, *scales(c), lse=lse)
        assert got_out is out and got_lse is lse
        ref, ref_lse = c.reference(window=70, sinks=sinks, return_lse=True)
        assert_close(out, ref, "plan window sinks")
        assert (lse - ref_lse).abs().max() < 5e-3
        _, lse2 = plan.run(c.q, c.k_cache, c.v_cache, out, *scales(c))  # allocated when not given
        assert torch.equal(lse2, lse)


def test_plan_checks_values_once_when_made():
    case = make_case([5, 70], fmt="bf16", seed=52)
    case.seq_lens[1] = case.table.shape[1] * 16 + 1
    with pytest.raises(ValueError, match=r"seq_lens\[1\]"):
        make_plan(case)
    case.seq_lens[1] = 70
    case.table[1, 0] = case.k_cache.shape[0]
    with pytest.raises(ValueError, match=r"table\[1, 0\]"):
        make_plan(case)
    make_plan(case, validate=False)  # the caller's promise


def _bad_layers():
    """(what, change to the run's arguments, exception, message) for a bf16 plan."""
    return [
        ("q dtype", lambda a: a.update(q=a["q"].half()), TypeError, "q: dtype torch.float16"),
        ("q shape", lambda a: a.update(q=a["q"][:-1]), ValueError, "q: .*shape"),
        ("q strides", lambda a: a.update(q=torch.cat([a["q"], a["q"]], 2)[..., :a["q"].shape[2]]), ValueError, "q: "),
        ("k pages", lambda a: a.update(k_cache=a["k_cache"][:-1]), ValueError, "k_cache: "),
        ("v head-major", lambda a: a.update(v_cache=a["v_cache"].transpose(1, 2).contiguous().transpose(1, 2)),
         ValueError, "v_cache: "),
        ("out dtype", lambda a: a.update(out=a["out"].float()), TypeError, "out: dtype"),
        ("out shape", lambda a: a.update(out=a["out"][:, :-1]), ValueError, "out: "),
        ("not a tensor", lambda a: a.update(k_cache=[1, 2]), TypeError, "k_cache: a list"),
        ("scales given", lambda a: a.update(k_scale=torch.ones(1), v_scale=torch.ones(1)), ValueError, "k_scale"),
        ("lse given", lambda a: a.update(lse=torch.empty(6, 8)), ValueError, "lse"),
    ]


@pytest.mark.parametrize("what,change,exc,match", _bad_layers(), ids=[b[0] for b in _bad_layers()])
def test_run_refuses_a_layer_unlike_the_plan(what, change, exc, match):
    case = make_case(LENS, fmt="bf16", seed=53)
    plan = make_plan(case)
    args = dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, out=torch.full_like(case.q, float("nan")))
    change(args)
    poisoned = args["out"]
    with pytest.raises(exc, match=match):
        plan.run(**args)
    if isinstance(poisoned, torch.Tensor):
        assert poisoned.isnan().all()  # nothing launched


def test_run_refuses_scales_unlike_the_plan():
    case = make_case(LENS, fmt="int8", quant_group=32, seed=54)
    plan = make_plan(case)
    ks, vs = scales(case)
    out = torch.full_like(case.q, float("nan"))
    with pytest.raises(ValueError, match="k_scale"):
        plan.run(case.q, case.k_cache, case.v_cache, out)  # missing
    with pytest.raises(ValueError, match="k_scale"):
        plan.run(case.q, case.k_cache, case.v_cache, out, ks[..., :1], vs)  # per-token, not groups of 32
    with pytest.raises(ValueError, match="v_scale"):
        plan.run(case.q, case.k_cache, case.v_cache, out, ks, vs.float())
    with pytest.raises(ValueError, match="k_cache: an int8 cache is read two bytes"):
        odd = torch.zeros(case.k_cache.numel() + 1, dtype=torch.int8)[1:].view(case.k_cache.shape)
        plan.run(case.q, odd, case.v_cache, out, ks, vs)
    assert out.isnan().all()
    rl = make_plan(case, return_lse=True)
    with pytest.raises(ValueError, match="lse"):
        rl.run(case.q, case.k_cache, case.v_cache, out, ks, vs, lse=torch.empty(len(LENS), 7))


def test_plan_made_from_bad_inputs_raises_as_decode_does():
    case = make_case([5], fmt="bf16", seed=55)
    with pytest.raises(TypeError, match="seq_lens"):
        loader.DecodePlan(case.table, case.seq_lens.long(), q=case.q, k_cache=case.k_cache, v_cache=case.v_cache)
    with pytest.raises(ValueError, match="return_lse"):
        loader.DecodePlan(case.table, case.seq_lens, q=case.q, k_cache=case.k_cache, v_cache=case.v_cache,
                          lse=torch.empty(1, 8))
