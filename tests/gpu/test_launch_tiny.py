"""The launch path on a real GPU with the tiny fixture kernel: AOT result, aligned vs generic
binaries, JIT parity (same cubin, same output bits), CUDA graph capture and replay."""
import hashlib

import pytest
import torch

from aotc.aot.build import build
from aotc.kernels.registry import get_spec
from aotc.loader import artifacts, dispatch
from aotc.loader.fallback import aot_compile_options, jit_function

EXTRA = "tests.cpu.fixtures.tiny.spec"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # The tiny family is declared for this module only: left set, it would follow the process
    # into other test files (a pytest-xdist worker runs several).
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AOTC_EXTRA_SPECS", EXTRA)
        major, minor = torch.cuda.get_device_capability()
        out = tmp_path_factory.mktemp("tiny-artifacts")
        report = build(out, [f"sm{major}{minor}"], kernels=["tiny_axpy"], jobs=4, progress=False)
        assert report.ok, report.failed
        artifacts.set_artifacts(out)
        dispatch.reset()
        yield get_spec("tiny_axpy")
        artifacts.set_artifacts(None)
        dispatch.reset()


def run(spec, x, y, out, alpha=0.75, block=64):
    rows, n = y.shape
    grid = (rows, -(-n // block), 1)
    dispatch.run_kernel(spec, {"block": block, "dtype": "fp16"}, grid, [x, y, out, x.stride(0), n, rows, alpha])


def test_aot_result_and_levels(tiny):
    x = torch.randn(5, 320, device="cuda", dtype=torch.float16)  # row stride 320: divisible by 16
    y = torch.randn(5, 320, device="cuda", dtype=torch.float16)
    out = torch.full_like(y, float("nan"))
    run(tiny, x, y, out)
    torch.testing.assert_close(out.float(), 0.75 * x.float() + y.float(), atol=2e-3, rtol=2e-3)
    sel = dispatch._selections[("tiny_axpy", (("block", 64), ("dtype", "fp16")), torch.cuda.current_device())]
    assert list(sel.loaded) == ["aligned"]
    xm = torch.randn(5, 321, device="cuda", dtype=torch.float16)[:, 1:]  # odd stride, misaligned
    out2 = torch.full_like(y, float("nan"))
    run(tiny, xm, y, out2)
    torch.testing.assert_close(out2.float(), 0.75 * xm.float() + y.float(), atol=2e-3, rtol=2e-3)
    assert set(sel.loaded) == {"aligned", "generic"}


def test_jit_compiles_the_same_cubin_and_the_same_bits(tiny):
    x = torch.randn(7, 1000, device="cuda", dtype=torch.float16)
    y = torch.randn(7, 1000, device="cuda", dtype=torch.float16)
    aot, jit = torch.empty_like(y), torch.empty_like(y)
    run(tiny, x, y, aot)
    fn = jit_function(tiny)
    with aot_compile_options():
        fn[(7, 16, 1)](x, y, jit, x.stride(0), 1000, 7, 0.75, BLOCK=64, SCALE_Y=1, num_warps=4, num_stages=2)
    assert torch.equal(aot, jit)
    shas = {hashlib.sha256(k.asm["cubin"]).hexdigest() for c in fn.device_caches.values() for k in c[0].values()}
    target = artifacts.load_target(torch.cuda.get_device_capability())
    assert target.entries["tiny_axpy(block=64,dtype=fp16)@aligned"].sha256 in shas


def test_graph_capture_and_replay_with_changed_inputs(tiny):
    x = torch.randn(4, 256, device="cuda", dtype=torch.float16)
    y = torch.randn(4, 256, device="cuda", dtype=torch.float16)
    out = torch.empty_like(y)
    run(tiny, x, y, out)  # load outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run(tiny, x, y, out)
    x.copy_(torch.randn_like(x))
    y.copy_(torch.randn_like(y))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), 0.75 * x.float() + y.float(), atol=2e-3, rtol=2e-3)
