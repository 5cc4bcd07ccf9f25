"""decode's new variants compile to the same bytes through the AOT build as through Triton's JIT:
aligned calls of the int8 per-channel split kernel, the merge kernel with its LSE output and a
bf16 "mod" split; GENERIC calls of the kv_align 4 and 8 int8 and fp8 per-token splits on vLLM's
inline-scale layout, and the int4_zp split (vLLM's INT4_PER_TOKEN_HEAD) aligned and GENERIC
(tests/cpu/aot/decode_jit_sha.py, in a process without the interpreter)."""
import os
import subprocess
import sys

import pytest

from .conftest import REPO


@pytest.mark.parametrize("arch", [90])
def test_new_decode_variants_jit_equals_aot(arch, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-m", "tests.cpu.aot.decode_jit_sha", str(arch)], capture_output=True,
                         text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split("\n")[:9]
    assert len(lines) == 9
    for line in lines:
        aot, jit = line.split()
        assert aot == jit
