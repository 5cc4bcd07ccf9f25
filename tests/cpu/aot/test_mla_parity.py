"""The MLA family's binaries compile to the same bytes through the AOT build as through Triton's
JIT for an aligned call (tests/cpu/aot/mla_jit_sha.py, in a process without the interpreter):
the latent split kernel (16 heads a program, bf16 and fp8; 32; 64 heads on sm90) and the merge at
d_v 512 (one tile, the 256-split tile over channel blocks, and the looping form past 256 splits),
for sm80 and sm90."""
import os
import subprocess
import sys

import pytest

from .conftest import REPO


@pytest.mark.parametrize("arch,pairs", [(80, 6), (90, 7)])
def test_mla_variants_jit_equals_aot(arch, pairs, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env["TRITON_DISABLE_LINE_INFO"] = "1"  # as the build and the loader's JIT fallback compile
    out = subprocess.run([sys.executable, "-m", "tests.cpu.aot.mla_jit_sha", str(arch)], capture_output=True,
                         text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.split("\n") if line.strip()]
    assert len(lines) == pairs
    for line in lines:
        aot, jit = line.split()
        assert aot == jit
