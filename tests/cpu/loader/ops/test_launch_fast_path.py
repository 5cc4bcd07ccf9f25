"""The steady-state launch paths (DecodePlan.run, MLADecodePlan.run, and the eager steady states of
decode, mla_decode and gated_delta_decode) on CPU tensors, with prepared launches whose driver
calls are recorded instead of made (no GPU, no kernel runs): a call that matches takes the one-C-
call path and packs its own pointers; a tensor of another shape, dtype, device or strides, one
rebound in place (set_/resize_ on the same object), a view of the same storage with other
strides, or a tensor that requires grad never reaches a launch with the old plan: it raises
before any launch, or is checked and planned anew (its launch carries its own strides)."""
import ctypes

import pytest
import torch

from aotc import loader
from aotc.loader import dispatch, workspace
from aotc.loader.launch import Launch
from aotc.loader.ops import decode_plan, gated_delta, mla, mla_plan, rules, split_merge, steady
from aotc.loader.ops.split_merge import SplitMerge
from tests.cpu.kernels.decode.cases import make_case

STREAM = 77


class Recorder:
    """Stands in for the driver: each launch's function, stream and parameter slots (uint64)."""

    def __init__(self):
        self.launches = []

    def binary(self, spec, aligned: bool, n_params: int):
        rec = self

        class Entry:
            num_ctas, launch_cooperative_grid, launch_pdl, key = 1, False, False, spec.name

        class Binary:
            function, block, shared, needs_ex, entry = hash((spec.name, aligned)) & 0xFFFF, 128, 0, False, Entry

            def cu_launch(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
                slots = (ctypes.c_void_p * n_params).from_address(params)
                rec.launches.append((spec.name, aligned, stream,
                                     [ctypes.c_uint64.from_address(slots[i]).value for i in range(n_params)]))
                return 0

        return Binary()

    def prepare(self, spec, axes, grid, ints, device, aligned_only=False):  # dispatch.prepare's signature
        params = ["*i8" if a.kind == "ptr" else a.kind for a in spec.args] + ["*i8", "*i8"]
        binaries = [self.binary(spec, False, len(params)), self.binary(spec, True, len(params))]
        idx = tuple(spec.arg_index[n] for n in spec.divisible_args("aligned") if spec.arg_index[n] < spec.leading_ptrs)
        return Launch(lambda a: binaries[bool(a)], params, grid, ints, spec.leading_ptrs, True,
                      dispatch._misaligned_function(idx))


@pytest.fixture
def rec(monkeypatch):
    """Prepared launches for CPU tensors: CPU plans take the paths CUDA plans take."""
    r = Recorder()
    monkeypatch.setattr(split_merge, "prepare", r.prepare)
    monkeypatch.setattr(gated_delta, "prepare", r.prepare)
    init = SplitMerge.__init__

    def prepared_init(self, *a, **k):
        init(self, *a, **k)
        if self.fast_split is None and self.launches_anything():
            split_l, merge_l = self._prepare()
            merge_l.lock = split_l.lock
            self.fast_split, self.fast_merge = split_l, merge_l

    monkeypatch.setattr(SplitMerge, "__init__", prepared_init)
    make = gated_delta._make_plan

    def prepared_make(*a):
        plan = make(*a)
        if plan.fast is None and plan.grid[0]:
            plan.fast = r.prepare(gated_delta.S.DECODE, plan.axes, plan.grid, plan.ints, None)
        return plan

    monkeypatch.setattr(gated_delta, "_make_plan", prepared_make)
    current, stream = (lambda: None), (lambda index: STREAM)  # a CPU tensor's device index is None
    monkeypatch.setattr(torch._C, "_cuda_getDevice", current, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", stream, raising=False)
    for module in (decode_plan, mla_plan, steady):
        monkeypatch.setattr(module, "_current_device", current)
        monkeypatch.setattr(module, "_current_stream", stream)
    monkeypatch.setitem(workspace._buffers, (None, STREAM), torch.zeros(1 << 16))
    dispatch.reset()
    yield r
    dispatch.reset()


def _no_full_path(monkeypatch, cls):
    def refuse(*a, **k):
        raise AssertionError("took the full check")

    monkeypatch.setattr(cls, "_run_checked", refuse)


def _bf16_case():
    c = make_case([5, 40, 33], fmt="bf16", seed=61)
    return c, torch.empty_like(c.q)


# -- DecodePlan.run ------------------------------------------------------------------------------
def test_plan_run_takes_the_one_call_path_and_packs_the_layers_pointers(rec, monkeypatch):
    c, out = _bf16_case()
    plan = loader.DecodePlan(c.table, c.seq_lens, q=c.q, k_cache=c.k_cache, v_cache=c.v_cache, out=out)
    assert plan._match is not rules.never
    q2, k2, v2, out2 = c.q.clone(), c.k_cache.clone(), c.v_cache.clone(), torch.empty_like(out)
    _no_full_path(monkeypatch, decode_plan.DecodePlan)
    assert plan.run(q2, k2, v2, out2) is out2
    (split, _, s1, slots), (merge, _, s2, mslots) = rec.launches
    assert split == "decode_split" and merge.startswith("decode_merge") and s1 == s2 == STREAM
    assert slots[:3] == [q2.data_ptr(), k2.data_ptr(), v2.data_ptr()]
    assert slots[5] == c.table.data_ptr() and slots[7] == c.seq_lens.data_ptr()
    assert mslots[3] == out2.data_ptr()


def _rebound(t):
    """The same tensor object, set in place to a storage of one page fewer (another shape)."""
    smaller = torch.empty((t.shape[0] - 1, *t.shape[1:]), dtype=t.dtype)
    return t.set_(smaller)


def _bad_runs():
    """(what, change to the run's tensors, exception) for a bf16 plan."""
    return [
        ("q shape", lambda a: a.update(q=a["q"][:-1]), ValueError),
        ("q dtype", lambda a: a.update(q=a["q"].half()), TypeError),
        ("q device", lambda a: a.update(q=torch.empty_like(a["q"], device="meta")), ValueError),
        ("q strides, same storage", lambda a: a.update(q=a["q"].transpose(0, 1).contiguous().transpose(0, 1)),
         ValueError),
        ("k rebound in place", lambda a: _rebound(a["k_cache"]), ValueError),
        ("v resized in place", lambda a: a["v_cache"].resize_(a["v_cache"].shape[0] - 1, *a["v_cache"].shape[1:]),
         ValueError),
        ("out dtype", lambda a: a.update(out=a["out"].float()), TypeError),
        ("out overlaps q", lambda a: a.update(out=a["q"]), ValueError),
        ("not a tensor", lambda a: a.update(v_cache=[1]), TypeError),
        ("scales given", lambda a: a.update(k_scale=torch.ones(1), v_scale=torch.ones(1)), ValueError),
    ]


@pytest.mark.parametrize("what,change,exc", _bad_runs(), ids=[b[0] for b in _bad_runs()])
def test_plan_run_refuses_a_tensor_unlike_the_plan_before_any_launch(rec, what, change, exc):
    c, out = _bf16_case()
    plan = loader.DecodePlan(c.table, c.seq_lens, q=c.q, k_cache=c.k_cache, v_cache=c.v_cache, out=out)
    args = dict(q=c.q.clone(), k_cache=c.k_cache.clone(), v_cache=c.v_cache.clone(), out=torch.empty_like(out))
    plan.run(**args)  # the steady state, then the bad run
    n = len(rec.launches)
    change(args)
    with pytest.raises(exc):
        plan.run(**args)
    assert len(rec.launches) == n  # nothing launched


def test_plan_run_refuses_grad_and_a_misaligned_int8_cache(rec):
    c, out = _bf16_case()
    plan = loader.DecodePlan(c.table, c.seq_lens, q=c.q, k_cache=c.k_cache, v_cache=c.v_cache, out=out)
    q = c.q.clone().requires_grad_()
    with torch.enable_grad(), pytest.raises(NotImplementedError, match="q requires grad"):
        plan.run(q, c.k_cache, c.v_cache, out)
    c8 = make_case([5, 40], fmt="int8", quant_group=32, seed=62)
    ks, vs = c8.kwargs["k_scale"], c8.kwargs["v_scale"]
    p8 = loader.DecodePlan(c8.table, c8.seq_lens, q=c8.q, k_cache=c8.k_cache, v_cache=c8.v_cache, k_scale=ks,
                           v_scale=vs)
    out8 = torch.empty_like(c8.q)
    p8.run(c8.q, c8.k_cache, c8.v_cache, out8, ks, vs)
    n = len(rec.launches)
    odd = torch.zeros(c8.k_cache.numel() + 1, dtype=torch.int8)[1:].view(c8.k_cache.shape)
    with pytest.raises(ValueError, match="k_cache: an int8 cache is read two bytes"):
        p8.run(c8.q, odd, c8.v_cache, out8, ks, vs)
    assert len(rec.launches) == n


# -- eager decode --------------------------------------------------------------------------------
def _split_q_strides(launch):
    """(q.stride(0), q.stride(1)) as a decode split launch packed them (int32 slots)."""
    from aotc.kernels.decode import spec as S

    i = S.SPLIT.arg_index["stride_qb"]
    return launch[3][i] & 0xFFFFFFFF, launch[3][i + 1] & 0xFFFFFFFF


def test_eager_decode_steady_state_packs_each_calls_pointers(rec):
    c, out = _bf16_case()
    for _ in range(3):
        loader.decode(c.q, c.k_cache, c.v_cache, c.table, c.seq_lens, out=out, validate=False)
    assert len(loader.ops.decode._recent.entries) == 1
    q2 = c.q.clone()
    rec.launches.clear()
    loader.decode(q2, c.k_cache, c.v_cache, c.table, c.seq_lens, out=out, validate=False)
    (_, _, _, slots), (_, _, _, mslots) = rec.launches
    assert slots[0] == q2.data_ptr() and mslots[3] == out.data_ptr()


def test_eager_decode_never_serves_a_stale_plan(rec):
    c, out = _bf16_case()
    for _ in range(2):
        loader.decode(c.q, c.k_cache, c.v_cache, c.table, c.seq_lens, out=out, validate=False)
    # the same storage viewed with other strides: a q whose rows are farther apart
    wide = torch.empty(c.q.shape[0], c.q.shape[1], 2 * c.q.shape[2], dtype=c.q.dtype)
    q_view = wide[..., :c.q.shape[2]]
    q_view.copy_(c.q)
    rec.launches.clear()
    loader.decode(q_view, c.k_cache, c.v_cache, c.table, c.seq_lens, out=out, validate=False)
    assert _split_q_strides(rec.launches[0]) == q_view.stride()[:2] != c.q.stride()[:2]
    # the same object set in place to another shape: checked again, refused
    q_same = c.q.clone()
    loader.decode(q_same, c.k_cache, c.v_cache, c.table, c.seq_lens, out=out, validate=False)
    n = len(rec.launches)
    q_same.set_(torch.empty(c.q.shape[0], c.q.shape[1] // 2, c.q.shape[2], dtype=c.q.dtype))
    with pytest.raises(ValueError):
        loader.decode(q_same, c.k_cache, c.v_cache, c.table, c.seq_lens, out=out, validate=False)
    with pytest.raises(TypeError):  # another dtype over the same bytes
        loader.decode(c.q.view(torch.float16), c.k_cache, c.v_cache, c.table, c.seq_lens, out=out, validate=False)
    with pytest.raises(TypeError):  # a bool is not a number, though True == 1 hashes alike
        loader.decode(c.q, c.k_cache, c.v_cache, c.table, c.seq_lens, out=out, sm_scale=True, validate=False)
    with pytest.raises(ValueError, match="out overlaps"):
        loader.decode(c.q, c.k_cache, c.v_cache, c.table, c.seq_lens, out=c.q, validate=False)
    q_grad = c.q.clone().requires_grad_()
    with torch.enable_grad(), pytest.raises(NotImplementedError, match="q requires grad"):
        loader.decode(q_grad, c.k_cache, c.v_cache, c.table, c.seq_lens, out=out, validate=False)
    assert len(rec.launches) == n


def test_int4_rht_packs_the_rotation_signs_on_every_fast_path(rec):
    """int4_rht's split kernel reads the rotation's signs through the Alibi slot: the prepared eager
    launch, the eager steady state and DecodePlan.run each pack the cached signs there."""
    from aotc.kernels.decode import spec as S
    from aotc.loader.ops.decode_rht import signs
    from tests.cpu.kernels.decode.test_vllm_int4 import int4_cache, problem

    q, k, v, table, lens = problem([5, 70], 64, torch.bfloat16, seed=62)
    kc, vc, ks, vs, _, _ = int4_cache(k, v)
    out = torch.empty_like(q)
    rot = signs(64, q.device)[0]
    slot = S.SPLIT.arg_index["Alibi"]
    for _ in range(3):  # the prepared launch, then the steady state
        loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format="int4_rht", out=out, validate=False)
    plan = loader.DecodePlan(table, lens, q=q, k_cache=kc, v_cache=vc, k_scale=ks, v_scale=vs, out=out,
                             kv_format="int4_rht")
    plan.run(q, kc, vc, out, ks, vs)
    splits = [launch for launch in rec.launches if launch[0] == "decode_split"]
    assert len(splits) == 4 and all(launch[3][slot] == rot.data_ptr() for launch in splits)


# -- MLA -----------------------------------------------------------------------------------------
def _mla_case():
    g = torch.Generator().manual_seed(63)
    q = torch.randn(2, 8, 96, generator=g).to(torch.bfloat16)
    kv = torch.randn(10, 16, 1, 96, generator=g).to(torch.bfloat16)
    table = torch.randperm(10, generator=g).to(torch.int32)[:8].view(2, 4)
    lens = torch.tensor([17, 60], dtype=torch.int32)
    return q, kv, table, lens, torch.empty(2, 8, 64, dtype=torch.bfloat16)


def test_mla_plan_and_eager_steady_states(rec, monkeypatch):
    q, kv, table, lens, out = _mla_case()
    plan = loader.MLADecodePlan(table, lens, q=q, kv_cache=kv, v_head_dim=64, out=out)
    plan.run(q, kv, out)
    (_, _, _, slots), (_, _, _, mslots) = rec.launches
    assert slots[:3] == [q.data_ptr(), kv.data_ptr(), kv.data_ptr()] and mslots[3] == out.data_ptr()
    n = len(rec.launches)
    with pytest.raises(ValueError, match="out overlaps kv_cache"):
        plan.run(q, kv, kv.view(-1)[:out.numel()].view(out.shape))
    kv.set_(torch.empty(9, 16, 1, 96, dtype=kv.dtype))  # rebound in place: one page fewer
    with pytest.raises(ValueError, match="kv_cache"):
        plan.run(q, kv, out)
    assert len(rec.launches) == n
    q, kv, table, lens, out = _mla_case()
    for _ in range(2):
        loader.mla_decode(q, kv, table, lens, v_head_dim=64, out=out, validate=False)
    assert len(mla._recent.entries) == 1
    rec.launches.clear()
    q2 = q.clone()
    loader.mla_decode(q2, kv, table, lens, v_head_dim=64, out=out, validate=False)
    assert rec.launches[0][3][0] == q2.data_ptr()
    n = len(rec.launches)
    with pytest.raises(ValueError):  # v_head_dim is part of the match: 32 needs its own checks (out is 64 wide)
        loader.mla_decode(q, kv, table, lens, v_head_dim=32, out=out, validate=False)
    assert len(rec.launches) == n


# -- gated_delta_decode --------------------------------------------------------------------------
@pytest.mark.parametrize("fused", [False, True])
def test_gated_delta_decode_steady_state_and_stale_metadata(rec, fused):
    from tests.cpu.kernels.gated_delta.cases import make_case as gdn_case

    args, kw = gdn_case(B=2, T=1, H=2, HV=4, K=64, V=64, pads=(), slots=4, fused=fused)
    out = torch.empty_like(args["v"])
    for _ in range(2):
        loader.gated_delta_decode(**args, **kw, out=out, validate=False)
    assert len(gated_delta._recent.entries) == 1
    rec.launches.clear()
    q2 = args["q"].clone()
    loader.gated_delta_decode(**dict(args, q=q2), **kw, out=out, validate=False)
    (_, _, _, slots), = rec.launches
    gates = [kw["a"], kw["b"], kw["A_log"], kw["dt_bias"]] if fused else [args["g"], args["beta"]] + \
        [args["state_indices"]] * 2  # unfused: A_log's and dt_bias's slots never read
    # the state twice: read from State, written to State_out (in place)
    want = [q2, args["k"], args["v"], out, args["state"], args["state"], *gates, args["state_indices"]]
    assert slots[:11] == [t.data_ptr() for t in want]
    n = len(rec.launches)
    with pytest.raises(ValueError, match="out"):
        loader.gated_delta_decode(**args, **kw, out=args["v"], validate=False)  # out overlaps v
    if fused:  # a gate over state's bytes: matched (same metadata), refused by address
        with pytest.raises(ValueError, match="state"):
            loader.gated_delta_decode(**args, **dict(kw, b=args["state"].view(-1)[:kw["b"].numel()].view(
                kw["b"].shape)), out=out, validate=False)
    state = args["state"]
    state.set_(torch.empty(state.shape[0], state.shape[1], state.shape[2] + 1, state.shape[3]))
    with pytest.raises(ValueError, match="state"):
        loader.gated_delta_decode(**args, **kw, out=out, validate=False)
    assert len(rec.launches) == n


# -- the prefill ops' steady states (interpreter: CPU calls keep their checked metadata) -----------
def test_gated_delta_prefill_steady_state_equals_the_checked_call_and_refuses_overlap():
    from aotc.loader.ops import gated_delta_prefill as GP
    from tests.cpu.kernels.gated_delta.chunk_cases import make_case as chunk_case

    dispatch.reset()
    case = chunk_case([5, 70], H=1, HV=2, K=32, V=32, dtype=torch.float32)
    state0 = case["state"].clone()
    want = loader.gated_delta_prefill(**case, qk_l2norm=True)
    want_state = case["state"].clone()
    out = torch.full_like(want, float("nan"))
    for _ in range(2):
        case["state"].copy_(state0)
        loader.gated_delta_prefill(**case, qk_l2norm=True, out=out, validate=False)
    assert len(GP._recent.entries) == 1
    assert torch.equal(out, want) and torch.allclose(case["state"], want_state, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match="out overlaps"):
        loader.gated_delta_prefill(**case, qk_l2norm=True, out=case["v"], validate=False)
    q = case["q"]
    q.set_(torch.empty(1, q.shape[1] + 1, *q.shape[2:]))  # rebound in place: one token more
    with pytest.raises(ValueError):
        loader.gated_delta_prefill(**case, qk_l2norm=True, out=out, validate=False)
    dispatch.reset()


# -- vLLM's per-token-head record (kv_align 8: K 0 and V 4 mod 8) ---------------------------------
def _vllm_record_case():
    from tests.cpu.kernels.decode.test_vllm_caches import _problem, vllm_inline_cache

    q, k, v, table, lens = _problem([5, 17], 64, seed=64)
    kc, vc, ks, vs, _, _ = vllm_inline_cache(k, v, "int8")
    return q, kc, vc, ks, vs, table, lens


def _moved(t, residue: int):
    """t's values in a fresh buffer, t's data starting `residue` bytes past an 8-byte boundary,
    with t's shape, strides and dtype (every metadata check passes; only the address differs)."""
    size, offset = t.untyped_storage().nbytes(), t.storage_offset() * t.element_size()
    big = torch.zeros(size + 16, dtype=torch.uint8)
    by = (residue - big.data_ptr() - offset) % 8
    raw = big[by:by + size]
    raw.copy_(torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()))
    moved = torch.empty(0, dtype=t.dtype).set_(raw.untyped_storage(), (by + offset) // t.element_size(), t.shape,
                                               t.stride())
    assert moved.data_ptr() % 8 == residue and torch.equal(moved.view(torch.uint8), t.view(torch.uint8))
    return moved


def test_vllm_record_takes_the_fast_paths(rec, monkeypatch):
    q, kc, vc, ks, vs, table, lens = _vllm_record_case()
    assert kc.data_ptr() % 8 == 0 and vc.data_ptr() % 8 == 4
    out = torch.empty_like(q)
    plan = loader.DecodePlan(table, lens, q=q, k_cache=kc, v_cache=vc, k_scale=ks, v_scale=vs, kv_format="int8",
                             out=out)
    assert plan._plan.residues == (7, 0, 4)  # the kv_align 8 binaries
    for _ in range(2):  # the eager full path, then its steady state made
        loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format="int8", out=out, validate=False)
    assert len(loader.ops.decode._recent.entries) == 1
    _no_full_path(monkeypatch, decode_plan.DecodePlan)

    def no_key(*a, **k):
        raise AssertionError("took the full path")

    monkeypatch.setattr(loader.ops.decode.DECODE, "key", no_key)
    rec.launches.clear()
    plan.run(q, kc, vc, out, ks, vs)
    loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format="int8", out=out, validate=False)
    assert [(n, s[:3]) for n, _, _, s in rec.launches[::2]] == [("decode_split", [q.data_ptr(), kc.data_ptr(),
                                                                                  vc.data_ptr()])] * 2


@pytest.mark.parametrize("which", ["k", "v"])
def test_vllm_record_refuses_another_residue_before_any_launch(rec, which):
    q, kc, vc, ks, vs, table, lens = _vllm_record_case()
    out = torch.empty_like(q)
    plan = loader.DecodePlan(table, lens, q=q, k_cache=kc, v_cache=vc, k_scale=ks, v_scale=vs, kv_format="int8",
                             out=out)
    for _ in range(2):
        plan.run(q, kc, vc, out, ks, vs)
        loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format="int8", out=out, validate=False)
    k2, v2 = (_moved(kc, 4), vc) if which == "k" else (kc, _moved(vc, 0))  # K at 4 mod 8, or V at 0 mod 8
    assert (k2.stride(), v2.stride()) == (kc.stride(), vc.stride())
    n = len(rec.launches)
    with pytest.raises(ValueError, match="kv_align 8"):
        plan.run(q, k2, v2, out, ks, vs)
    with pytest.raises(ValueError, match="kv_align 8"):
        loader.decode(q, k2, v2, table, lens, k_scale=ks, v_scale=vs, kv_format="int8", out=out, validate=False)
    assert len(rec.launches) == n


# -- prefix_prefill ------------------------------------------------------------------------------
def test_prefix_prefill_steady_state_packs_its_pointers_and_refuses_overlap(rec, monkeypatch):
    from aotc.kernels.prefix_prefill import spec as PS
    from aotc.loader.ops import prefix_prefill as PP
    from tests.cpu.kernels.prefix_prefill.cases import make_case as pp_case

    monkeypatch.setattr(dispatch, "prepare", rec.prepare)
    monkeypatch.setattr(PP, "_prepares", lambda q: True)  # CPU calls make steady states (recorded launches)
    case, kw = pp_case([5, 17], [3, 4], q_heads=2, kv_heads=1, head_dim=32, block_size=16, seed=65)
    case.update(kw)
    out = torch.empty_like(case["q"])
    loader.prefix_prefill(**case, out=out, validate=False)  # the full path (interpreter), then a steady state
    assert len(PP._recent.entries) == 1 and not rec.launches
    q2 = case["q"].clone()
    loader.prefix_prefill(**dict(case, q=q2), out=out, validate=False)
    (name, _, stream, slots), = rec.launches
    want = [q2, case["k"], case["v"], case["k_cache"], case["v_cache"], out, case["block_table"],
            case["query_start_loc"], case["seq_lens"]]
    assert name == PS.PREFIX_PREFILL.name and stream == STREAM
    assert slots[:9] == [t.data_ptr() for t in want]
    assert slots[9:13] == [PP._dummy_f32(out.device).data_ptr()] * 4  # no scales, out_scale or sinks
    with pytest.raises(ValueError, match="out"):  # another object over q's bytes: matched, then refused by address
        loader.prefix_prefill(**case, out=case["q"].view(case["q"].shape), validate=False)
    assert len(rec.launches) == 1
