"""The AOT binary of a key is byte-identical to what Triton's JIT compiles for a call with that
key's specialization (aligned call -> @aligned, fully misaligned call -> @generic), NVIDIA cubins
and AMD code objects alike (Triton's HIP binder decides the specialization for gfx942)."""
import os
import subprocess
import sys

import pytest

from aotc.loader.manifest import read_manifest

from .conftest import REPO


@pytest.fixture(scope="module")
def gfx942_tiny(tmp_path_factory):
    from aotc.aot.build import build

    out = tmp_path_factory.mktemp("gfx942")
    report = build(out, ["gfx942"], kernels=["tiny_axpy"], jobs=1, progress=False)
    assert report.ok, report.failed
    return out


@pytest.mark.parametrize("target", ["sm80", "sm90", "gfx942"])
def test_jit_compiles_the_same_bytes_as_the_build(tiny_artifacts, gfx942_tiny, target, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-m", "tests.cpu.aot.jit_sha", target], capture_output=True,
                         text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr
    jit_aligned, jit_generic = out.stdout.split()
    root = gfx942_tiny if target == "gfx942" else tiny_artifacts
    entries = read_manifest(root / target).by_key()
    assert entries["tiny_axpy(block=64,dtype=fp16)@aligned"].sha256 == jit_aligned
    assert entries["tiny_axpy(block=64,dtype=fp16)@generic"].sha256 == jit_generic

