"""The AOT binary of a key is byte-identical to what Triton's JIT compiles for a call with that
key's specialization (aligned call -> @aligned, fully misaligned call -> @generic)."""
import os
import subprocess
import sys

import pytest

from aotc.loader.manifest import read_manifest

from .conftest import REPO


@pytest.mark.parametrize("target", ["sm80", "sm90"])
def test_jit_compiles_the_same_bytes_as_the_build(tiny_artifacts, target, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env["TRITON_DISABLE_LINE_INFO"] = "1"  # as the loader's JIT fallback compiles (aot_compile_options)
    out = subprocess.run([sys.executable, "-m", "tests.cpu.aot.jit_sha", target[2:]], capture_output=True,
                         text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr
    jit_aligned, jit_generic = out.stdout.split()
    entries = read_manifest(tiny_artifacts / target).by_key()
    assert entries["tiny_axpy(block=64,dtype=fp16)@aligned"].sha256 == jit_aligned
    assert entries["tiny_axpy(block=64,dtype=fp16)@generic"].sha256 == jit_generic
