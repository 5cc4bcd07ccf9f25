"""gated_delta_decode on a GPU against the float32 reference (the CPU suite's cases.py at model
sizes: K = V = 128 and 256, 256 rows), AOT == JIT bit for bit, misaligned inputs through the
generic binary, CUDA-graph capture and replay, and no out-of-range access under memcheck.

The reference loops over rows, heads and tokens on the GPU (cases.reference: on the test machine's
CPU the K = 256 cases ran for minutes beside other processes). Tolerances: cases.STATE_TOL /
OUT_TOL (same as on the CPU).
"""
import warnings

import pytest
import torch

from aotc import loader
from aotc.loader import fallback
from aotc.loader.fallback import AotcJitFallbackWarning
from tests.cpu.kernels.gated_delta.cases import OUT_TOL, STATE_TOL, assert_close, check_case, make_case, reference

pytestmark = pytest.mark.gpu
DEV = "cuda"
ORDER = ("q", "k", "v", "g", "beta", "state", "state_indices")
PADS = (0, 7, 100, 255)


@pytest.mark.parametrize("K", [128, 256])
@pytest.mark.parametrize("layout", ["vmajor", "kmajor"])
@pytest.mark.parametrize("kda,fused,l2", [(False, False, True), (False, True, True), (True, False, False),
                                          (True, True, True)])
def test_model_sizes_match_reference(K, layout, kda, fused, l2):
    T = 1 if K == 128 else 3
    args, kw = make_case(B=256, T=T, H=2, HV=4, K=K, V=K, dtype=torch.bfloat16, kda=kda, fused=fused, qk_l2norm=l2,
                         layout=layout, pads=PADS, slots=300, device=DEV, seed=K + 2 * kda + fused)
    check_case(loader.gated_delta_decode, args, kw)


@pytest.mark.parametrize("T", [1, 2, 8])
def test_bench_shape_and_speculative_lengths(T):
    # The benchmark's heads (H 16, HV 32) at fewer rows, fp16, gates in bf16.
    args, kw = make_case(B=24 if T == 1 else 8, T=T, H=16, HV=32, K=128, V=128, dtype=torch.float16,
                         gate_dtype=torch.bfloat16, qk_l2norm=True, pads=(3,), device=DEV, seed=T)
    check_case(loader.gated_delta_decode, args, kw)


@pytest.mark.parametrize("layout", ["vmajor", "kmajor"])
def test_fp32_and_head_sizes_off_the_tiles(layout):
    # K = 60, 100, 200 in the 64 / 128 / 256 tiles (masked), V off 16 too; fp32 computed in fp32.
    for K, V, dtype, kda in ((60, 60, torch.float32, False), (100, 100, torch.bfloat16, True),
                             (200, 72, torch.float32, True), (128, 128, torch.float32, False)):
        args, kw = make_case(B=64, T=3, H=2, HV=4, K=K, V=V, dtype=dtype, kda=kda, qk_l2norm=True, layout=layout,
                             pads=(1, 9), slots=80, device=DEV, seed=K + V)
        with warnings.catch_warnings():
            warnings.simplefilter("error", AotcJitFallbackWarning)  # every tile x dtype x layout is built
            out, _ = check_case(loader.gated_delta_decode, args, kw)
        assert out.dtype == dtype


def test_k64_and_value_tails():
    for V, layout in ((64, "vmajor"), (48, "kmajor"), (80, "kmajor"), (512, "vmajor")):
        args, kw = make_case(B=40, T=2, H=1, HV=2, K=64, V=V, layout=layout, kda=True, pads=(1,), device=DEV, seed=V)
        check_case(loader.gated_delta_decode, args, kw)


@pytest.fixture
def jit_only(tmp_path, monkeypatch):
    """Switch the loader to an empty artifacts folder: every call runs through Triton's JIT.
    The fallback warns once per key a process: forget earlier warnings so each test sees its own."""
    monkeypatch.setenv("AOTC_MISS_LOG", str(tmp_path / "misses.jsonl"))
    monkeypatch.setattr(fallback, "_warned", set())
    yield lambda on: loader.set_artifacts(tmp_path if on else None)
    loader.set_artifacts(None)


# Every binary the gate axis gives, V-major's packed one-token ones, the one-token K-major GDN
# steps (they run the kda binary), and the long GDN loops (T 8 V-major, 4 K-major).
@pytest.mark.parametrize("layout,kda,T,fused", [("vmajor", False, 2, True), ("vmajor", True, 2, True),
                                                ("vmajor", False, 1, False), ("vmajor", True, 1, True),
                                                ("kmajor", False, 1, False), ("kmajor", False, 1, True),
                                                ("kmajor", False, 2, True), ("kmajor", True, 2, True),
                                                ("vmajor", False, 8, True), ("kmajor", False, 4, False)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_aot_equals_jit_bit_for_bit(jit_only, layout, kda, T, fused, dtype):
    args, kw = make_case(B=256, T=T, H=16, HV=32, K=128, V=128, dtype=dtype, kda=kda, fused=fused,
                         qk_l2norm=True, layout=layout, pads=PADS, slots=260, device=DEV, seed=21)
    results = []
    for jit in (False, True):
        jit_only(jit)
        pool = args["state"].clone()
        out = torch.full((256, T, 32, 128), float("nan"), dtype=dtype, device=DEV)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader.gated_delta_decode(*[args[n] if n != "state" else pool for n in ORDER], **kw, out=out)
            torch.cuda.synchronize()
        fell_back = any(issubclass(w.category, AotcJitFallbackWarning) for w in caught)
        assert fell_back == jit, "the AOT call must find its binary (run `aotc build --arch sm90` first)" if not jit \
            else "the JIT call must miss"
        results.append((out, pool))
    (o1, s1), (o2, s2) = results
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16))
    assert torch.equal(s1.view(torch.int32), s2.view(torch.int32))


@pytest.mark.parametrize("T", [1, 3])
def test_dense_final_state_and_padded_rows(jit_only, T):
    """fla's form (state_indices=None, final_state) at the bench's heads, AOT == JIT bit for bit and
    against the reference; and a pool with padded rows (the strided binary at K = 128)."""
    args, kw = make_case(B=96, T=T, H=16, HV=32, K=128, V=128, qk_l2norm=True, pads=(), slots=120, device=DEV,
                         seed=30 + T)
    ref_out, ref_pool = reference(args, kw)
    idx = args["state_indices"].long()
    h0 = args["state"][idx].contiguous()
    results = []
    for jit in (False, True):
        jit_only(jit)
        out = torch.full((96, T, 32, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
        ht = torch.full_like(h0, float("nan"))
        loader.gated_delta_decode(args["q"], args["k"], args["v"], args["g"], args["beta"], h0, None, **kw, out=out,
                                  final_state=ht)
        torch.cuda.synchronize()
        results.append((out, ht))
    jit_only(False)
    (o1, s1), (o2, s2) = results
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16)) and torch.equal(s1, s2)
    assert_close(o1, ref_out, OUT_TOL[torch.bfloat16], "out")
    assert_close(s1, ref_pool[idx], STATE_TOL, "final_state")
    assert torch.equal(h0, args["state"][idx]), "state must be left as it was"
    wide = torch.full((*args["state"].shape[:3], 144), float("nan"), device=DEV)
    wide[..., :128] = args["state"]
    out = torch.full((96, T, 32, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
    loader.gated_delta_decode(*[args[n] if n != "state" else wide[..., :128] for n in ORDER], **kw, out=out)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    assert_close(wide[..., :128], ref_pool, STATE_TOL, "state")
    assert wide[..., 128:].isnan().all()


def test_misaligned_inputs_take_the_generic_binary():
    args, kw = make_case(B=64, T=2, H=2, HV=4, K=128, V=128, qk_l2norm=True, device=DEV, seed=22)
    # q, k, v and the pool one element past a 16-byte boundary: the ALIGNED binary's assumptions
    # fail and the GENERIC one runs.
    shifted = {}
    for n in ("q", "k", "v", "state"):
        t = args[n]
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=DEV)
        view = buf[1:].view(t.shape)
        view.copy_(t)
        assert view.data_ptr() % 16
        shifted[n] = view
    out = torch.full((64, 2, 4, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
    loader.gated_delta_decode(*[shifted.get(n, args[n]) for n in ORDER], **kw, out=out)
    ref_out, ref_pool = reference(args, kw)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    assert_close(shifted["state"], ref_pool, STATE_TOL, "state")


def test_cuda_graph_capture_and_replay():
    args, kw = make_case(B=32, T=1, H=2, HV=4, K=128, V=128, kda=True, fused=True, qk_l2norm=True, pads=(5,),
                         device=DEV, seed=23)
    pool = args["state"].clone()
    out = torch.empty(32, 1, 4, 128, dtype=torch.bfloat16, device=DEV)
    call = [args[n] if n != "state" else pool for n in ORDER]
    loader.gated_delta_decode(*call, **kw, out=out)  # warm: plan, binary loaded
    torch.cuda.synchronize()
    start = args["state"].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loader.gated_delta_decode(*call, **kw, out=out)
    # New values in the captured buffers: the replay follows them.
    args["q"].copy_(torch.randn_like(args["q"]))
    args["state_indices"].copy_(torch.randperm(start.shape[0], device=DEV)[:32].to(torch.int32))
    args["state_indices"][9] = -1
    pool.copy_(start)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_pool = reference(dict(args, state=start), kw)
    assert_close(out, ref_out, OUT_TOL[torch.bfloat16], "out")
    assert_close(pool, ref_pool, STATE_TOL, "state")


_MEMCHECK = """
import torch
from aotc import loader
from tests.cpu.kernels.gated_delta.cases import make_case
order = ("q", "k", "v", "g", "beta", "state", "state_indices")
for layout, V, T in (("vmajor", 128, 3), ("vmajor", 128, 1), ("kmajor", 80, 3)):
    args, kw = make_case(B=16, T=T, H=1, HV=2, K=128, V=V, layout=layout, slots=20, device="cuda", kda=True,
                         fused=True)
    # Padded rows, and indices past the pool that validate=False lets through: no state access.
    args["state_indices"][:4] = torch.tensor([-1, 20, 1 << 30, -(1 << 30)], dtype=torch.int32)
    loader.gated_delta_decode(*[args[n] for n in order], **kw, validate=False)
    # the dense form with final_state: exactly B states read and written
    h0 = args["state"][:16].clone()
    loader.gated_delta_decode(*[args[n] for n in order[:5]], h0, None, **kw, final_state=torch.empty_like(h0))
    torch.cuda.synchronize()
"""


def test_no_out_of_bounds_access_under_memcheck():
    import os
    import shutil
    import subprocess
    import sys

    tool = shutil.which("compute-sanitizer")
    if tool is None:
        pytest.skip("compute-sanitizer is not on PATH")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")  # one allocation per tensor: exact bounds
    res = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-c", _MEMCHECK],
                         cwd=root, env=env, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "ERROR SUMMARY: 0 errors" in res.stdout
