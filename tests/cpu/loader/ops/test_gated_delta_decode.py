"""loader.gated_delta_decode as a public op: every bad argument raises (naming it) before any
launch, plans are reused per metadata, the torch.library op and its Meta implementation, and
torch.compile traces through it. Numerics are in tests/cpu/kernels/gated_delta/."""
import pytest
import torch

import aotc.loader.ops.gated_delta as G
from aotc import loader
from tests.cpu.kernels.gated_delta.cases import OUT_TOL, assert_close, check_case, make_case, reference

ORDER = ("q", "k", "v", "g", "beta", "state", "state_indices")


def _case(**kw):
    return make_case(B=3, T=2, H=1, HV=2, K=64, V=32, seed=11, **kw)


def _drop(d, *names):
    for n in names:
        d.pop(n)


# (id, edit of (args, kw), exception, message fragment). K = 64 != V = 32, so a pool of the other
# layout's shape is told apart.
BAD = [
    ("q type", lambda a, k: a.update(q=a["q"].tolist()), TypeError, "q must be a torch.Tensor"),
    ("q dtype", lambda a, k: a.update(q=a["q"].double()), TypeError, "q must be of dtype"),
    ("q dims", lambda a, k: a.update(q=a["q"][0]), ValueError, "q must be 4-D"),
    ("K size", lambda a, k: a.update(q=torch.randn(3, 2, 1, 264).bfloat16(), k=torch.randn(3, 2, 1, 264).bfloat16()),
     ValueError, "(K) must be in [1, 256]"),
    ("T past 8", lambda a, k: a.update(**{n: a[n].repeat(1, 5, *[1] * (a[n].dim() - 2))
                                          for n in ("q", "k", "v", "g", "beta")}),
     ValueError, "(T, tokens a row) must be in [1, 8]"),
    ("q stride", lambda a, k: a.update(q=torch.stack([a["q"], a["q"]], -1)[..., 0]), ValueError,
     "q must be contiguous in its last dim"),
    ("k dtype", lambda a, k: a.update(k=a["k"].half()), TypeError, "k must be of dtype torch.bfloat16"),
    ("k shape", lambda a, k: a.update(k=a["k"][:2]), ValueError, "k must be shaped like q"),
    ("k device", lambda a, k: a.update(k=a["k"].to("meta")), ValueError, "k must be on cpu"),
    ("v dtype", lambda a, k: a.update(v=a["v"].float()), TypeError, "v must be of dtype"),
    ("v rows", lambda a, k: a.update(v=a["v"][:, :1]), ValueError, "v must be [3, 2, HV, V]"),
    ("HV not a multiple of H", lambda a, k: a.update(q=a["q"].repeat(1, 1, 2, 1), k=a["k"].repeat(1, 1, 2, 1),
                                                     v=a["v"][:, :, :1]), ValueError, "HV, value heads"),
    ("V size", lambda a, k: a.update(v=torch.randn(3, 2, 2, 520).bfloat16()), ValueError, "(V) must be in [1, 512]"),
    ("v stride", lambda a, k: a.update(v=torch.stack([a["v"], a["v"]], -1)[..., 0]), ValueError,
     "v must be contiguous in its last dim"),
    ("g missing", lambda a, k: a.update(g=None), ValueError, "g and beta are required"),
    ("g dtype", lambda a, k: a.update(g=a["g"].double()), TypeError, "g must be of dtype"),
    ("g shape", lambda a, k: a.update(g=a["g"][:, :1]), ValueError, "g must be [3, 2, 2] (GDN) or"),
    ("g device", lambda a, k: a.update(g=a["g"].to("meta")), ValueError, "g must be on cpu"),
    ("beta dtype", lambda a, k: a.update(beta=a["beta"].to(torch.int32)), TypeError, "beta must be of dtype"),
    ("beta shape", lambda a, k: a.update(beta=a["beta"][..., None]), ValueError, "beta must be 3-D"),
    ("g and the fused form", lambda a, k: k.update(A_log=torch.zeros(2)), ValueError, "pass either g and beta"),
    ("state dtype", lambda a, k: a.update(state=a["state"].double()), TypeError,
     "state must be of dtype torch.float32"),
    ("state dims", lambda a, k: a.update(state=a["state"][0]), ValueError, "state must be 4-D"),
    ("state layout shape", lambda a, k: k.update(state_layout="kmajor"), ValueError,
     "[slots, HV, K, V] = [slots, 2, 64, 32] for state_layout='kmajor'"),
    ("state heads", lambda a, k: a.update(state=a["state"][:, :1]), ValueError, "state must be [slots, HV, V, K]"),
    ("state stride", lambda a, k: a.update(state=a["state"].transpose(2, 3).contiguous().transpose(2, 3)),
     ValueError, "state must be contiguous in its last dim"),
    ("state device", lambda a, k: a.update(state=a["state"].to("meta")), ValueError, "state must be on cpu"),
    ("state_layout name", lambda a, k: k.update(state_layout="V-major"), ValueError, "state_layout must be one of"),
    ("state_indices dtype", lambda a, k: a.update(state_indices=a["state_indices"].long()), TypeError,
     "state_indices must be of dtype torch.int32"),
    ("state_indices length", lambda a, k: a.update(state_indices=a["state_indices"][:2]), ValueError,
     "state_indices must be a contiguous [3] tensor"),
    ("state_indices stride", lambda a, k: a.update(state_indices=a["state_indices"].repeat_interleave(2)[::2]),
     ValueError, "state_indices must be a contiguous [3] tensor"),
    ("state_indices past the pool", lambda a, k: a["state_indices"].__setitem__(0, a["state"].shape[0]), ValueError,
     "state_indices[0] = 9 is past the pool's 9 slots"),
    ("state_indices twice", lambda a, k: a["state_indices"].copy_(torch.tensor([4, -1, 4])), ValueError,
     "names slot 4 twice (rows 0 and 2)"),
    ("dense state rows", lambda a, k: a.update(state_indices=None), ValueError,
     "state.shape[0] must be B = 3 (one state a request: state_indices is None), got 9"),
    ("final_state dtype", lambda a, k: k.update(final_state=a["state"].double()), TypeError,
     "final_state must be of dtype torch.float32"),
    ("final_state shape", lambda a, k: k.update(final_state=a["state"][1:].clone()), ValueError,
     "final_state must be shaped and strided like state"),
    ("final_state strides", lambda a, k: k.update(final_state=torch.empty_strided(
        a["state"].shape, (64, 9 * 64 * 32, 2 * 9 * 64, 1))), ValueError, "final_state must be shaped and strided"),
    ("final_state is state", lambda a, k: k.update(final_state=a["state"]), ValueError,
     "final_state overlaps state"),
    ("final_state device", lambda a, k: k.update(final_state=a["state"].to("meta")), ValueError,
     "final_state must be on cpu"),
    ("scale", lambda a, k: k.update(scale=float("nan")), ValueError, "scale must be a finite float"),
    ("scale type", lambda a, k: k.update(scale="0.1"), ValueError, "scale must be a finite float"),
    ("qk_l2norm type", lambda a, k: k.update(qk_l2norm=1), TypeError, "qk_l2norm must be a bool"),
    ("out dtype", lambda a, k: k.update(out=torch.empty(3, 2, 2, 32)), TypeError, "out must be of dtype"),
    ("out shape", lambda a, k: k.update(out=torch.empty(3, 2, 2, 64, dtype=torch.bfloat16)), ValueError,
     "out must be of shape (3, 2, 2, 32)"),
    ("out stride", lambda a, k: k.update(out=torch.full((3, 2, 32, 2), float("nan"),
                                                        dtype=torch.bfloat16).transpose(2, 3)),
     ValueError, "out must be contiguous in its last dim"),
]

FUSED_BAD = [
    ("dt_bias missing", lambda a, k: k.update(dt_bias=None), ValueError, "dt_bias is None"),
    ("A_log shape", lambda a, k: k.update(A_log=k["A_log"][:1]), ValueError, "A_log must be a contiguous [2] tensor"),
    ("A_log stride", lambda a, k: k.update(A_log=k["A_log"].repeat_interleave(2)[::2]), ValueError,
     "A_log must be a contiguous [2] tensor"),
    ("a dtype", lambda a, k: k.update(a=k["a"].to(torch.int32)), TypeError, "a must be of dtype"),
    ("a shape", lambda a, k: k.update(a=k["a"][:, :, :, :8]), ValueError, "a must be [3, 2, 2] (GDN) or"),
    ("dt_bias for GDN a", lambda a, k: k.update(a=k["a"][..., 0]), ValueError, "dt_bias must be [2] (a is GDN"),
    ("b shape", lambda a, k: k.update(b=k["b"][:, :1]), ValueError, "b must be [3, 2, 2]"),
    ("b device", lambda a, k: k.update(b=k["b"].to("meta")), ValueError, "b must be on cpu"),
    ("beta with the fused form", lambda a, k: a.update(beta=torch.zeros(3, 2, 2)), ValueError,
     "pass either g and beta"),
]


def _expect_raise(args, kw, exc, msg):
    pool, out = args["state"], kw.get("out")
    before = pool.clone() if pool.device.type == "cpu" else None
    with pytest.raises(exc) as info:
        loader.gated_delta_decode(*[args[n] for n in ORDER], **kw)
    assert msg in str(info.value), str(info.value)
    assert "gated_delta_decode" in str(info.value)
    if before is not None:  # nothing was launched
        assert torch.equal(pool, before)
    if out is not None and out.dtype == torch.bfloat16 and out.shape == (3, 2, 2, 32):
        assert out.isnan().all()


@pytest.mark.parametrize("edit,exc,msg", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_argument_raises_before_launch(edit, exc, msg):
    args, kw = _case()
    kw["out"] = torch.full((3, 2, 2, 32), float("nan"), dtype=torch.bfloat16)
    edit(args, kw)
    _expect_raise(args, kw, exc, msg)


@pytest.mark.parametrize("edit,exc,msg", [b[1:] for b in FUSED_BAD], ids=[b[0] for b in FUSED_BAD])
def test_bad_fused_gate_argument_raises(edit, exc, msg):
    args, kw = _case(fused=True, kda=True)
    edit(args, kw)
    _expect_raise(args, kw, exc, msg)


def test_the_good_case_runs():
    args, kw = _case()
    check_case(loader.gated_delta_decode, args, kw)


def test_repeat_calls_reuse_one_plan_and_follow_new_values():
    G._plans.clear()
    args, kw = _case(kda=True)
    check_case(G.gated_delta_decode, args, kw)
    assert len(G._plans) == 1
    args["q"].copy_(torch.randn_like(args["q"]))
    args["state_indices"].copy_(torch.tensor([-1, 7, 2]))
    check_case(G.gated_delta_decode, args, kw)
    assert len(G._plans) == 1
    with pytest.raises(TypeError, match="g must be of dtype"):  # new metadata: checked again
        G.gated_delta_decode(*[args[n] if n != "g" else args["g"].double() for n in ORDER], **kw)
    # validation of index values runs on every call, the plan's too
    args["state_indices"].copy_(torch.tensor([1, 1, -1]))
    with pytest.raises(ValueError, match="twice"):
        G.gated_delta_decode(*[args[n] for n in ORDER], **kw)
    assert len(G._plans) == 1


def test_library_op_and_meta_implementation():
    args, kw = _case(fused=True)
    out = torch.full((3, 2, 2, 32), float("nan"), dtype=torch.bfloat16)
    pool = args["state"].clone()
    torch.ops.aotc.gated_delta_decode(args["q"], args["k"], args["v"], None, None, pool, args["state_indices"],
                                      kw["A_log"], kw["a"], kw["dt_bias"], kw["b"], None, False, "vmajor", out)
    ref_out, _ = reference(args, kw)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    meta = {n: (t.to("meta") if isinstance(t, torch.Tensor) else t) for n, t in args.items()}
    mkw = {n: (t.to("meta") if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    mout = torch.empty(3, 2, 2, 32, dtype=torch.bfloat16, device="meta")
    call = (meta["q"], meta["k"], meta["v"], None, None, meta["state"], meta["state_indices"], mkw["A_log"],
            mkw["a"], mkw["dt_bias"], mkw["b"], 0.5, True, "vmajor")
    torch.ops.aotc.gated_delta_decode(*call, mout)  # shapes only
    with pytest.raises(ValueError, match="out must be of shape"):
        torch.ops.aotc.gated_delta_decode(*call, mout[:, :1])
    plain, pkw = _case()
    torch.library.opcheck(torch.ops.aotc.gated_delta_decode.default,
                          (*[plain[n] for n in ORDER], None, None, None, None, None, False, "vmajor",
                           torch.empty(3, 2, 2, 32, dtype=torch.bfloat16)),
                          test_utils=("test_schema", "test_faketensor"))


def test_fullgraph_compile_traces_the_op():
    args, kw = _case(kda=True)

    def step(q, k, v, g, beta, state, idx):
        return loader.gated_delta_decode(q, k, v, g, beta, state, idx, **kw) * 2

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    a1 = [args[n].clone() for n in ORDER]
    a2 = [args[n].clone() for n in ORDER]
    got = compiled(*a1)
    want = step(*a2)
    assert torch.equal(got, want)
    assert torch.equal(a1[5], a2[5]) and not torch.equal(a1[5], args["state"])  # the pool was updated in place


def test_state_head_past_int32_offsets_is_refused():
    # The kernel's offsets inside a head are int32: a pool whose rows are its outermost dim (every
    # stride an int32, no element shared) but whose head spans past 2**31 elements is refused by
    # name (a meta pool: such a view needs no memory there).
    args, kw = _case()
    meta = {n: t.to("meta") for n, t in args.items()}
    meta["state"] = torch.empty_strided((9, 2, 32, 64), (64, 576, 70_000_000, 1), device="meta")
    with pytest.raises(ValueError, match=r"state must be a head's rows within 2\*\*31 elements") as info:
        loader.gated_delta_decode(*[meta[n] for n in ORDER], **kw, validate=False)
    assert "stride(2) 70000000 over 32 rows" in str(info.value)


@pytest.mark.parametrize("B,HV,msg", [(65536, 2, r"q.shape\[0\] \(B\) must be at most 65535"),
                                      (3, 65536, r"v.shape\[2\] \(HV\) must be at most 65535")])
def test_grid_axes_past_65535_are_refused(B, HV, msg):
    # The grid is (V tiles, HV, B), and CUDA takes at most 65535 on its second and third axes: a
    # larger batch or head count is refused by name before any launch (meta tensors: no memory).
    args, kw = _case()
    shapes = {"q": (B, 2, 1, 64), "k": (B, 2, 1, 64), "v": (B, 2, HV, 32), "g": (B, 2, HV), "beta": (B, 2, HV),
              "state": (B + 6, HV, 32, 64), "state_indices": (B,)}
    meta = {n: torch.empty(shapes[n], dtype=args[n].dtype, device="meta") for n in ORDER}
    with pytest.raises(ValueError, match=msg):
        loader.gated_delta_decode(*[meta[n] for n in ORDER], **kw, validate=False)
