"""gated_delta_decode through Triton's interpreter against the float32 reference (cases.py):
both pool layouts, GDN and KDA gates, plain and fused-gate forms, L2 norm on and off, GVA, padded
rows, T from 1 to 8, V tails, gate dtypes, strided inputs. Every case poisons `out` with NaN and
checks the slots no row names bit for bit."""
import itertools

import pytest
import torch

from aotc.loader.ops.gated_delta import gated_delta_decode

from .cases import OUT_TOL, STATE_TOL, assert_close, check_case, make_case, reference, run


def _slots(args):
    """(the pool slots the rows name, a mask of the others)."""
    idx = args["state_indices"].long()
    named = idx[idx >= 0]
    others = torch.ones(args["state"].shape[0], dtype=torch.bool)
    others[named] = False
    return named, others


FORMS = list(itertools.product(("vmajor", "kmajor"), (False, True), (False, True), (False, True)))


@pytest.mark.parametrize("layout,kda,fused,l2", FORMS)
def test_forms_match_reference(layout, kda, fused, l2):
    n = FORMS.index((layout, kda, fused, l2))
    T = (1, 2, 5, 8)[n % 4]
    args, kw = make_case(B=3, T=T, H=1, HV=2, kda=kda, fused=fused, qk_l2norm=l2, layout=layout, pads=(1,), seed=n)
    check_case(gated_delta_decode, args, kw)


@pytest.mark.parametrize("layout", ["vmajor", "kmajor"])
@pytest.mark.parametrize("H,HV", [(2, 4), (1, 1), (2, 2)])
def test_grouped_value_heads(layout, H, HV):
    args, kw = make_case(B=2, T=3, H=H, HV=HV, layout=layout, pads=(), seed=H * 10 + HV)
    check_case(gated_delta_decode, args, kw)


@pytest.mark.parametrize("layout", ["vmajor", "kmajor"])
@pytest.mark.parametrize("V", [16, 48, 80, 128])
def test_value_sizes_and_tails(layout, V):
    # K = 64: BV 16 (V-major) tiles every V whole; BV 32 (K-major) leaves a partial tile at 16, 48 and 80.
    args, kw = make_case(B=2, T=2, H=1, HV=2, V=V, layout=layout, kda=V == 80, seed=V)
    check_case(gated_delta_decode, args, kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gate_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_input_and_gate_dtypes(dtype, gate_dtype):
    for fused in (False, True):
        args, kw = make_case(B=2, T=2, dtype=dtype, gate_dtype=gate_dtype, fused=fused, kda=fused, seed=3)
        check_case(gated_delta_decode, args, kw)


@pytest.mark.parametrize("layout", ["vmajor", "kmajor"])
@pytest.mark.parametrize("K,V", [(60, 100), (100, 60), (16, 33), (129, 48)])
def test_head_sizes_off_the_tiles(layout, K, V):
    # K runs in the next tile up (64, 128, 256) with the rest of the tile masked; V tails are
    # masked rows (V-major) or columns (K-major) of the last value tile. KDA gates and fp32 inputs
    # on half the cases: per-channel gates must skip the padded channels too.
    n = [(60, 100), (100, 60), (16, 33), (129, 48)].index((K, V))
    args, kw = make_case(B=3, T=3, H=1, HV=2, K=K, V=V, kda=n % 2 == 0, fused=n == 2, qk_l2norm=n < 2,
                         dtype=torch.float32 if n % 2 else torch.bfloat16, layout=layout, seed=40 + n)
    check_case(gated_delta_decode, args, kw)


@pytest.mark.parametrize("kda", [False, True])
def test_fp32_inputs_run_in_fp32(kda):
    # fp32 q/k/v give fp32 outputs within the state's tolerance of the float32 reference: nothing on
    # the way is rounded to a 16-bit type (bf16 rounding alone would be ~1e-2 off here).
    args, kw = make_case(B=2, T=8, H=2, HV=4, K=64, V=64, dtype=torch.float32, kda=kda, qk_l2norm=True, seed=50)
    out, _ = check_case(gated_delta_decode, args, kw)
    assert out.dtype == torch.float32


def test_head_size_128_and_custom_scale():
    args, kw = make_case(B=2, T=2, H=1, HV=1, K=128, V=128, qk_l2norm=True, pads=(0,), seed=5)
    check_case(gated_delta_decode, args, kw, scale=0.3)


def test_every_row_padded_touches_nothing():
    args, kw = make_case(B=3, T=4, pads=(0, 1, 2), seed=6)
    out, pool = run(gated_delta_decode, args, kw)
    assert (out == 0).all()
    assert torch.equal(pool, args["state"])


def test_index_past_the_pool_is_a_padded_row_without_validation():
    # validate=False skips the host check; the kernel still touches no state for such a row.
    args, kw = make_case(B=2, T=1, pads=(), slots=4, seed=7)
    args["state_indices"] = torch.tensor([4, 1], dtype=torch.int32)
    out, pool = run(gated_delta_decode, args, kw, validate=False)
    assert (out[0] == 0).all() and not out[1].isnan().any()
    assert torch.equal(pool[[0, 2, 3]], args["state"][[0, 2, 3]])


def test_strided_inputs_and_pool():
    """q/k/v as slices of one fused projection, gates as transposed views, the pool a slice of a
    wider buffer (slot stride past its size), out a slice: strides, not copies, are read."""
    B, T, H, HV, K, V = 3, 3, 1, 2, 64, 64
    for layout, kda in (("vmajor", True), ("kmajor", False)):
        args, kw = make_case(B=B, T=T, H=H, HV=HV, K=K, V=V, layout=layout, kda=kda, seed=8)
        qkv = torch.cat([args["q"].flatten(2), args["k"].flatten(2), args["v"].flatten(2)], dim=2)
        q = qkv[..., :H * K].unflatten(2, (H, K))
        k = qkv[..., H * K:2 * H * K].unflatten(2, (H, K))
        v = qkv[..., 2 * H * K:].unflatten(2, (HV, V))
        g = args["g"].transpose(0, 1).contiguous().transpose(0, 1)
        beta = args["beta"].transpose(1, 2).contiguous().transpose(1, 2)
        wide = torch.full((args["state"].shape[0], HV + 1, *args["state"].shape[2:]), float("nan"))
        wide[:, :HV] = args["state"]
        pool = wide[:, :HV]
        out_buf = torch.full((B, T, HV + 1, V), float("nan"), dtype=q.dtype)
        out = out_buf[:, :, 1:]
        assert not q.is_contiguous() and not pool.is_contiguous() and not g.is_contiguous()
        got = gated_delta_decode(q, k, v, g, beta, pool, args["state_indices"], out=out, **kw)
        ref_out, ref_pool = reference(args, kw)
        assert got is out
        assert_close(out, ref_out, OUT_TOL[q.dtype], "out")
        idx = args["state_indices"].long()
        named = idx[idx >= 0]
        assert_close(pool[named], ref_pool[named], STATE_TOL, "state")
        assert wide[:, HV].isnan().all(), "the pool's neighbouring head was written"
        assert out_buf[:, :, 0].isnan().all(), "out's neighbouring head was written"


def test_empty_batch():
    args, kw = make_case(B=0, T=1, pads=(), slots=3)
    out, pool = run(gated_delta_decode, args, kw)
    assert out.shape == (0, 1, 2, 64) and torch.equal(pool, args["state"])


@pytest.mark.parametrize("layout,T", [("vmajor", 1), ("vmajor", 3), ("kmajor", 1)])
def test_dense_states_and_final_state(layout, T):
    """fla's form: state_indices=None reads request b's state from state[b] (no index read), and
    final_state takes the updated states while state is only read; with a pool, final_state is
    written at the named slots only."""
    args, kw = make_case(B=3, T=T, H=1, HV=2, layout=layout, pads=(), seed=60 + T)
    idx = args["state_indices"].long()
    dense = args["state"][idx].clone()  # row b: request b's state
    ref_out, ref_pool = reference(args, kw)
    for final in (False, True):
        state = dense.clone()
        fin = torch.full_like(state, float("nan")) if final else None
        out = torch.full((3, T, 2, 64), float("nan"), dtype=torch.bfloat16)
        gated_delta_decode(args["q"], args["k"], args["v"], args["g"], args["beta"], state, None, **kw, out=out,
                           final_state=fin)
        assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
        assert_close(fin if final else state, ref_pool[idx], STATE_TOL, "state")
        if final:
            assert torch.equal(state, dense), "final_state given: state must be left as it was"
    # a pool read at state_indices, written to final_state at the same slots (padded rows: none)
    args, kw = make_case(B=3, T=T, H=1, HV=2, layout=layout, pads=(1,), seed=70 + T)
    ref_out, ref_pool = reference(args, kw)
    pool = args["state"].clone()
    fin = torch.full_like(pool, float("nan"))
    out = torch.full((3, T, 2, 64), float("nan"), dtype=torch.bfloat16)
    gated_delta_decode(*[args[n] if n != "state" else pool for n in ORDER], **kw, out=out, final_state=fin)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    named, others = _slots(args)
    assert_close(fin[named], ref_pool[named], STATE_TOL, "final_state")
    assert fin[others].isnan().all(), "final_state was written at a slot no row names"
    assert torch.equal(pool, args["state"]), "final_state given: the pool must be left as it was"


@pytest.mark.parametrize("T", [1, 2])
def test_padded_state_rows_take_the_strided_tile(T):
    """A V-major pool at a built K tile whose rows lie wider apart than K (and a V that is no
    multiple of a program's rows) runs the strided binary; whole rows run the packed one, and
    one token the packed one-token binary. Each matches the reference."""
    from aotc.loader.ops.gated_delta import launch_plan

    for pad, V, want in ((16, 64, "strided"), (0, 40, "strided"), (0, 64, "packed")):
        args, kw = make_case(B=3, T=T, H=1, HV=2, K=64, V=V, pads=(2,), seed=80 + pad + V)
        st = args["state"]
        wide = torch.full((*st.shape[:3], 64 + pad), float("nan"))
        wide[..., :64] = st
        args["state"] = wide[..., :64]
        out = torch.full((3, T, 2, V), float("nan"), dtype=torch.bfloat16)
        axes, _, _ = launch_plan(*[args[n] for n in ORDER], out, **kw)
        assert (axes["rows"], axes["tokens"]) == (want, "one" if (want, T) == ("packed", 1) else "any")
        ref_out, ref_pool = reference(args, kw)
        gated_delta_decode(*[args[n] for n in ORDER], **kw, out=out)  # the strided view itself, updated in place
        assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
        assert_close(wide[..., :64], ref_pool, STATE_TOL, "state")
        assert wide[..., 64:].isnan().all(), "a pad column between rows was written"


ORDER = ("q", "k", "v", "g", "beta", "state", "state_indices")


@pytest.mark.parametrize("T,fused,l2,H,HV", [(6, False, True, 1, 2), (7, True, False, 2, 4), (8, False, False, 1, 1)])
def test_split_rows_long_token_loop(T, fused, l2, H, HV):
    """The packed GDN "long" token loop at K = 128 holds each state row in two parts a thread (KS 2,
    rows on 16 lanes): it matches the reference, padded rows and the slots no row names included, in
    the pool and in fla's dense form."""
    from aotc.kernels.gated_delta import spec
    from aotc.loader.ops.gated_delta import launch_plan

    args, kw = make_case(B=3, T=T, H=H, HV=HV, K=128, V=128, fused=fused, qk_l2norm=l2, pads=(1,), seed=90 + T)
    out = torch.full((3, T, HV, 128), float("nan"), dtype=torch.bfloat16)
    axes, _, _ = launch_plan(*[args[n] for n in ORDER], out, **kw)
    assert axes["tokens"] == "long" and spec.constexprs(axes)["KS"] == 2
    check_case(gated_delta_decode, args, kw)
    args, kw = make_case(B=3, T=T, H=H, HV=HV, K=128, V=128, fused=fused, qk_l2norm=l2, pads=(), seed=95 + T)
    ref_out, ref_pool = reference(args, kw)
    idx = args["state_indices"].long()
    dense = args["state"][idx].clone()
    fin = torch.full_like(dense, float("nan"))
    out.fill_(float("nan"))
    gated_delta_decode(*[args[n] for n in ORDER[:5]], dense, None, **kw, out=out, final_state=fin)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    assert_close(fin, ref_pool[idx], STATE_TOL, "final_state")


@pytest.mark.parametrize("T,fused", [(3, False), (4, True)])
def test_kmajor_long_token_loop(T, fused):
    """K-major GDN at K = 128 runs its "long" binary (cap 72) from spec.LONG_FROM tokens on, the
    "any" one below; both match the reference."""
    from aotc.kernels.gated_delta import spec
    from aotc.loader.ops.gated_delta import launch_plan

    args, kw = make_case(B=2, T=T, H=1, HV=2, K=128, V=64, fused=fused, layout="kmajor", pads=(0,), seed=100 + T)
    out = torch.full((2, T, 2, 64), float("nan"), dtype=torch.bfloat16)
    axes, _, _ = launch_plan(*[args[n] for n in ORDER], out, **kw)
    assert axes["tokens"] == ("long" if T >= spec.LONG_FROM["kmajor"] else "any")
    check_case(gated_delta_decode, args, kw)


@pytest.mark.parametrize("T,fused", [(2, False), (3, True)])
def test_token_count_fixed_at_compile_time(T, fused):
    """NT = T (bench --sweep's two-token step): the kernel runs NT tokens without reading T (passed
    as 1 here) and matches the reference, padded rows and the slots no row names included."""
    from aotc.kernels.gated_delta import spec
    from aotc.kernels.gated_delta.recurrent import gated_delta_decode_kernel
    from aotc.loader.ops.gated_delta import launch_plan

    args, kw = make_case(B=3, T=T, H=1, HV=2, K=128, V=64, fused=fused, pads=(1,), seed=110 + T)
    pool = args["state"].clone()
    out = torch.full((3, T, 2, 64), float("nan"), dtype=torch.bfloat16)
    axes, grid, kargs = launch_plan(*[dict(args, state=pool)[n] for n in ORDER], out, **kw)
    assert (axes["rows"], axes["tokens"]) == ("packed", "any")
    kargs = list(kargs)
    kargs[[a.name for a in spec.ARGS].index("T")] = 1
    cx = dict(spec.constexprs(axes), NT=T)
    gated_delta_decode_kernel[grid](*kargs, **cx, num_warps=spec.launch(axes, 90).num_warps, num_stages=1)
    ref_out, ref_pool = reference(args, kw)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    named, others = _slots(args)
    assert_close(pool[named], ref_pool[named], STATE_TOL, "state")
    assert torch.equal(pool[others], args["state"][others]), "a slot no row names was written"
    assert (out[1] == 0).all(), "the padded row's outputs are not zeros"
