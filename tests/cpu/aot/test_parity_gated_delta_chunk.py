"""The AOT binaries of one gdn_chunk_state key (the chunked prefill's state pass) are byte-identical
to what Triton's JIT compiles for calls with that key's specialization (aligned call -> @aligned,
misaligned call -> @generic), as test_parity.py checks for the tiny kernel."""
import os
import subprocess
import sys

import pytest

from aotc.aot.build import build
from aotc.kernels.variants import VariantKey
from aotc.loader.manifest import read_manifest

from .conftest import REPO
from .jit_sha_gated_delta_chunk import AXES


@pytest.fixture(scope="module")
def chunk_artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("gdn-chunk-artifacts")
    key = VariantKey.make("gdn_chunk_state", AXES)
    report = build(out, ["sm80", "sm90"], kernels=["tiny_axpy"], misses=[(key, None)], jobs=2, progress=False)
    assert report.ok, report.failed
    return out


@pytest.mark.parametrize("target", ["sm80", "sm90"])
def test_jit_compiles_the_same_bytes_as_the_build(chunk_artifacts, target, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env["TRITON_DISABLE_LINE_INFO"] = "1"  # as the loader's JIT fallback compiles (aot_compile_options)
    out = subprocess.run([sys.executable, "-m", "tests.cpu.aot.jit_sha_gated_delta_chunk", target[2:]],
                         capture_output=True, text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    jit_aligned, jit_generic = out.stdout.split()
    entries = read_manifest(chunk_artifacts / target).by_key()
    key = VariantKey.make("gdn_chunk_state", AXES)
    assert entries[str(key)].sha256 == jit_aligned
    assert entries[str(key.with_level("generic"))].sha256 == jit_generic
    assert jit_aligned != jit_generic
