"""gated_delta_prefill on a GPU (AOT binaries where built, else the JIT fallback) against the
float32 per-token reference at realistic sizes: lengths 1, 63, 64, 65, 1000 and 2500 packed with
a padded and an empty sequence, GVA, both pool layouts, GDN and KDA (strong gates), every head
dim; chunked == the recurrent decode op over the same sequence; the state pass's two value tiles
(bv 32 and 128) bit for bit alike; AOT output == JIT output bit for bit, at each tile; on sm90 the
warp-specialized Gluon state pass (the op's choice there) against the Triton one.

NaN-poisoned outputs and unused pool slots (chunk_cases.make_case); tolerance GPU_TOL: the CPU
suite's plus the tf32 rounding of the precompute's dots (max abs error over max |reference|).
"""
import warnings

import pytest
import torch

from aotc import loader
from aotc.kernels.gated_delta.reference import gated_delta_reference
from aotc.loader.fallback import AotcJitFallbackWarning
from aotc.loader.ops.gated_delta_prefill import gated_delta_prefill
from tests.cpu.kernels.gated_delta.chunk_cases import make_case, rel_err

pytestmark = pytest.mark.gpu
DEV = "cuda"
# fp32: tf32x3 dots and fp32 workspace, so about fp32's own rounding (chunk_cases.TOL[fp32] is 2e-4)
GPU_TOL = {torch.float16: 1e-2, torch.bfloat16: 3e-2, torch.float32: 5e-4}
LONG = [1, 63, 64, 65, 1000, 0, 2500, 40]


def run(case, **kw):
    pool = case["state"].clone()
    out = torch.full(case["v"].shape, float("nan"), dtype=case["q"].dtype, device=DEV)
    gated_delta_prefill(case["q"], case["k"], case["v"], case["g"], case["beta"], pool, case["state_indices"],
                        case["cu_seqlens"], out=out, **kw)
    torch.cuda.synchronize()
    return out, pool


def run_tile(case, bv, state_layout="vmajor"):
    """The op's launches (the state pass last) with the state pass at value tile `bv` (the op picks one by batch)."""
    from aotc.loader.dispatch import run_kernel
    from aotc.loader.ops.gated_delta_prefill import launch_plan

    pool = case["state"].clone()
    out = torch.full(case["v"].shape, float("nan"), dtype=case["q"].dtype, device=DEV)
    plan = launch_plan(case["q"], case["k"], case["v"], case["g"], case["beta"], pool, case["state_indices"],
                       case["cu_seqlens"], out, case["q"].shape[-1] ** -0.5, True, state_layout, bv=bv)
    assert plan[-1][1]["bv"] == bv
    for launch in plan:
        run_kernel(*launch)
    torch.cuda.synchronize()
    return out, pool


def check(case, out, pool, dtype, **kw):
    ref_out, ref_pool = gated_delta_reference(case["q"], case["k"], case["v"], case["g"], case["beta"],
                                              case["state"], case["state_indices"], case["cu_seqlens"], **kw)
    assert not out.isnan().any(), "an output element was not written"
    idx = case["state_indices"].long()
    cu = case["cu_seqlens"].tolist()
    for n, slot in enumerate(idx.tolist()):
        if slot < 0:
            assert (out[0, cu[n]:cu[n + 1]] == 0).all()
    err = rel_err(out, ref_out)
    assert err <= GPU_TOL[dtype], f"out: {err:.2e}"
    used = idx[idx >= 0]
    err = rel_err(pool[used], ref_pool[used])
    assert err <= GPU_TOL[dtype], f"states: {err:.2e}"
    untouched = torch.ones(pool.shape[0], dtype=torch.bool, device=DEV)
    untouched[used] = False
    assert torch.equal(pool[untouched].view(torch.int32), case["state"][untouched].view(torch.int32))


@pytest.mark.parametrize("kda", [False, True])
@pytest.mark.parametrize("state_layout", ["vmajor", "kmajor"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mixed_batch(kda, state_layout, dtype):
    case = make_case(LONG, H=2, HV=4, K=128, V=128, dtype=dtype, kda=kda, strong_gates=kda, padded=(7,),
                     state_layout=state_layout, device=DEV, seed=1)
    out, pool = run(case, qk_l2norm=True, state_layout=state_layout)
    check(case, out, pool, dtype, qk_l2norm=True, state_layout=state_layout)


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("kda", [False, True])
def test_head_dims(head_dim, kda):
    case = make_case([65, 300, 1], H=1, HV=2, K=head_dim, V=head_dim, kda=kda, l2norm_in_kernel=False,
                     device=DEV, seed=head_dim)
    out, pool = run(case, qk_l2norm=False, scale=0.2)
    check(case, out, pool, torch.bfloat16, qk_l2norm=False, scale=0.2)


@pytest.mark.parametrize("K,V,kda,dtype", [(60, 60, False, torch.float32), (100, 100, True, torch.float32),
                                           (128, 128, False, torch.float32), (100, 100, False, torch.bfloat16),
                                           (256, 256, True, torch.float32), (256, 256, False, torch.float32),
                                           (200, 200, False, torch.float32), (60, 60, False, torch.float16)])
def test_fp32_and_head_sizes_off_the_tiles(K, V, kda, dtype):
    # Built binaries at every pair here (K, V in one tile: 64, 128, 256), aligned and generic. The
    # V-major pool at odd K, the K-major at fp32 128. fp32 at the 256 tile faulted on the H100 at
    # 16 warps (BENCHMARKS.md, Kernel choices: head sizes and fp32).
    layout = "kmajor" if K == 128 else "vmajor"
    case = make_case([1, 63, 64, 65, 1000, 0, 300], H=2, HV=4, K=K, V=V, dtype=dtype, kda=kda, strong_gates=kda,
                     padded=(5,), state_layout=layout, device=DEV, seed=K + kda)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AotcJitFallbackWarning)  # built: no JIT here
        out, pool = run(case, qk_l2norm=True, state_layout=layout)
    assert out.dtype == dtype
    check(case, out, pool, dtype, qk_l2norm=True, state_layout=layout)


@pytest.mark.parametrize("K,kda,dtype", [(60, True, torch.float16), (60, True, torch.bfloat16),
                                         (100, True, torch.bfloat16), (60, False, torch.bfloat16)])
def test_16_bit_head_sizes_off_16_over_many_chunks(K, kda, dtype):
    # The generic state pass at 4 warps computed these wrong from a sequence's second chunk on
    # (BENCHMARKS.md, Kernel choices: head sizes and fp32); its 16-warp binary runs them.
    case = make_case([1, 65, 700], H=2, HV=4, K=K, V=K, dtype=dtype, kda=kda, strong_gates=kda, device=DEV, seed=K)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AotcJitFallbackWarning)  # built: no JIT here
        out, pool = run(case, qk_l2norm=True)  # unnormalized keys (|k|^2 ~ K) make the delta rule diverge
    check(case, out, pool, dtype, qk_l2norm=True)


def test_head_k_differs_from_head_v():
    # K = 128, V = 64: a pair that is not built (JIT fallback, with its warning).
    case = make_case([100, 7], H=1, HV=2, K=128, V=64, device=DEV, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AotcJitFallbackWarning)
        out, pool = run(case, qk_l2norm=True)
    check(case, out, pool, torch.bfloat16, qk_l2norm=True)


@pytest.mark.parametrize("kda", [False, True])
def test_chunked_equals_decode(kda):
    # 1000 tokens at once vs gated_delta_decode 8 tokens a call chaining the pool.
    case = make_case([1000], H=2, HV=4, K=128, V=128, kda=kda, strong_gates=kda, device=DEV, seed=4)
    whole, pool = run(case, qk_l2norm=True)
    steps_pool = case["state"].clone()
    steps = [loader.gated_delta_decode(case["q"][:, t:t + 8], case["k"][:, t:t + 8], case["v"][:, t:t + 8],
                                       case["g"][:, t:t + 8], case["beta"][:, t:t + 8], steps_pool,
                                       case["state_indices"], qk_l2norm=True) for t in range(0, 1000, 8)]
    by_token = torch.cat(steps, 1)
    slot = case["state_indices"].long()
    assert rel_err(whole, by_token) <= GPU_TOL[torch.bfloat16]
    assert rel_err(pool[slot], steps_pool[slot]) <= GPU_TOL[torch.bfloat16]


@pytest.mark.parametrize("state_layout,kda", [("vmajor", False), ("kmajor", True)])
def test_value_tiles_bit_identical(state_layout, kda):
    # H100 (Triton 3.6): every state-pass config that ran gave the same bits as BV 32's
    # (chunk_spec.state_block_v); the op picks BV by batch, so a batch's results must not depend on it.
    case = make_case(LONG, H=2, HV=4, K=128, V=128, kda=kda, strong_gates=kda, padded=(7,),
                     state_layout=state_layout, device=DEV, seed=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AotcJitFallbackWarning)
        narrow = run_tile(case, 32, state_layout)
        wide = run_tile(case, 128, state_layout)
    check(case, *wide, torch.bfloat16, qk_l2norm=True, state_layout=state_layout)
    assert torch.equal(narrow[0].view(torch.int16), wide[0].view(torch.int16))
    assert torch.equal(narrow[1].view(torch.int32), wide[1].view(torch.int32))


@pytest.mark.parametrize("bv,dtype,K", [(32, torch.bfloat16, 128), (128, torch.bfloat16, 128),
                                        (32, torch.float32, 100)])
@pytest.mark.parametrize("kda", [False, True])
def test_aot_equals_jit_bit_for_bit(kda, bv, dtype, K, tmp_path, monkeypatch):
    case = make_case([1, 64, 65, 700], H=2, HV=4, K=K, V=K, dtype=dtype, kda=kda, device=DEV, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AotcJitFallbackWarning)  # the AOT run must not fall back
        try:
            aot_out, aot_pool = run_tile(case, bv)
        except AotcJitFallbackWarning:
            pytest.skip("gdn_chunk_* not built for this GPU: run `aotc build --arch sm90` first")
    monkeypatch.setenv("AOTC_MISS_LOG", str(tmp_path / "misses.jsonl"))
    loader.set_artifacts(tmp_path)  # an empty folder: every launch through Triton's JIT
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AotcJitFallbackWarning)
            jit_out, jit_pool = run_tile(case, bv)
    finally:
        loader.set_artifacts(None)
    assert torch.equal(aot_out.view(torch.int16), jit_out.view(torch.int16))
    assert torch.equal(aot_pool.view(torch.int32), jit_pool.view(torch.int32))


def test_no_out_of_bounds_access_under_memcheck():
    import os
    import shutil
    import subprocess
    import sys

    tool = shutil.which("compute-sanitizer")
    if tool is None:
        pytest.skip("compute-sanitizer is not on PATH")
    script = """
import torch
from tests.cpu.kernels.gated_delta.chunk_cases import make_case
from aotc.loader.dispatch import run_kernel
from aotc.loader.ops.gated_delta_prefill import gated_delta_prefill, launch_plan
for kda in (False, True):
    for K, dt in ((100, torch.float32), (60, torch.bfloat16)):  # masked tiles
        c = make_case([1, 63, 64, 65, 0, 130], H=1, HV=2, K=K, V=K, dtype=dt, kda=kda, padded=(2,), device="cuda")
        gated_delta_prefill(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"], c["state_indices"],
                            c["cu_seqlens"], qk_l2norm=True)
    c = make_case([1, 63, 64, 65, 0, 130], H=1, HV=2, K=128, V=128, kda=kda, padded=(2,), device="cuda")
    gated_delta_prefill(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"], c["state_indices"],
                        c["cu_seqlens"], qk_l2norm=True)
    out = torch.empty_like(c["v"])  # the wide state tile, which this small batch would not pick
    for launch in launch_plan(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"], c["state_indices"],
                              c["cu_seqlens"], out, 128 ** -0.5, True, "vmajor", bv=128):
        run_kernel(*launch)
torch.cuda.synchronize()
"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    res = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-c", script],
                         cwd=root, env=env, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "ERROR SUMMARY: 0 errors" in res.stdout


@pytest.mark.parametrize("bv", [32, 128])
@pytest.mark.parametrize("dtype,kda,state_layout", [(torch.bfloat16, False, "vmajor"), (torch.bfloat16, True, "kmajor"),
                                                    (torch.float16, False, "kmajor"), (torch.float16, True, "vmajor")])
def test_gluon_state_pass_against_triton(bv, dtype, kda, state_layout, monkeypatch):
    # sm90 runs chunk_state_ws.py (state_ws_spec.ws_serves); AOTC_GDN_STATE_WS=0 the Triton state pass
    # on the same precompute. The same products in the same dtypes and order (the output Aqk V'
    # accumulated onto q h fq, as Triton's dot-plus-add): final states and outputs bit-identical.
    from aotc.kernels.gated_delta import state_ws_spec
    from aotc.loader.ops.gated_delta_prefill import aligned_state_spec

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon state pass serves sm90 only")
    case = make_case(LONG, H=2, HV=4, K=128, V=128, dtype=dtype, kda=kda, strong_gates=kda, padded=(7,),
                     state_layout=state_layout, device=DEV, seed=20 + bv)
    axes = {"dtype": {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype], "head_k": 128, "head_v": 128, "bv": bv}
    assert aligned_state_spec(axes, case["q"]) is state_ws_spec.GDN_CHUNK_STATE_WS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AotcJitFallbackWarning)
        out, pool = run_tile(case, bv, state_layout)
        monkeypatch.setenv(state_ws_spec.ENV_WS, "0")
        assert aligned_state_spec(axes, case["q"]).name == "gdn_chunk_state"
        t_out, t_pool = run_tile(case, bv, state_layout)
    check(case, out, pool, dtype, qk_l2norm=True, state_layout=state_layout)
    used = case["state_indices"].long()
    used = used[used >= 0]
    assert torch.equal(pool[used].view(torch.int32), t_pool[used].view(torch.int32))
    assert torch.equal(out.view(torch.int16), t_out.view(torch.int16))
