"""The loader's target choice on a real NVIDIA GPU: the device reads as NVIDIA (not Iluvatar, not
AMD), its own smXX comes first, and a folder holding another vendor's build is never opened."""

import pytest
import torch

from aotc.aot.build import build
from aotc.kernels.registry import get_spec
from aotc.loader import artifacts, dispatch, targets
from aotc.loader.manifest import Manifest, Target, read_manifest


def test_this_gpu_is_nvidia_and_gets_its_own_sm_target():
    device = targets.describe(torch.cuda.current_device())
    major, minor = torch.cuda.get_device_capability()
    if device.vendor != "nvidia":
        pytest.skip(f"not an NVIDIA GPU: {device.label}")
    assert targets.candidates(device)[0] == f"sm{major}{minor}"
    assert targets.device_target(device).warp_size == 32


def test_an_amd_folder_beside_the_sm_folder_is_never_opened(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTC_EXTRA_SPECS", "tests.cpu.fixtures.tiny.spec")
    major, minor = torch.cuda.get_device_capability()
    sm = f"sm{major}{minor}"
    report = build(tmp_path, [sm, "gfx942"], kernels=["tiny_axpy"], jobs=4, progress=False)
    assert report.ok, report.failed
    # A gfx942 build relabelled as this GPU's target: refused before any of its binaries loads.
    bad = tmp_path / "bad"
    m = read_manifest(tmp_path / "gfx942")
    (bad / sm).mkdir(parents=True)
    (bad / sm / "manifest.json").write_text(
        Manifest(Target(sm, "hip", "gfx942", 64), m.aotc_version, m.triton_version, m.entries).to_json())
    artifacts.set_artifacts(bad)
    dispatch.reset()
    try:
        with pytest.raises(Exception, match="refusing this manifest"):
            artifacts.load_target(dispatch.device_of(torch.cuda.current_device()))
    finally:
        artifacts.set_artifacts(None)
        dispatch.reset()
    # The real build: this GPU runs its sm folder and launches it.
    artifacts.set_artifacts(tmp_path)
    dispatch.reset()
    try:
        spec = get_spec("tiny_axpy")
        x = torch.randn(3, 256, device="cuda", dtype=torch.float16)
        y = torch.randn(3, 256, device="cuda", dtype=torch.float16)
        out = torch.full_like(y, float("nan"))
        dispatch.run_kernel(spec, {"block": 64, "dtype": "fp16"}, (3, 4, 1), [x, y, out, 256, 256, 3, 0.5])
        torch.cuda.synchronize()
        sel = dispatch._selections[(spec.name, (("block", 64), ("dtype", "fp16")), torch.cuda.current_device())]
        assert sel.target.name == sm and sel.info.backend == "cuda"
        torch.testing.assert_close(out, (0.5 * x.float() + y.float()).half(), rtol=1e-3, atol=1e-3)
    finally:
        artifacts.set_artifacts(None)
        dispatch.reset()
