"""prefix_prefill's kv_align 4 binaries (int8 and fp8 e4m3 per token on vLLM's INT8/FP8_PER_TOKEN_HEAD
record, rows 4-byte aligned) compile to the same bytes through the AOT build's GENERIC level as through the
loader's JIT fallback at that level, on sm80 and sm90 (tests/cpu/aot/kv_align4_jit_sha.py, in a
process without the interpreter)."""
import os
import subprocess
import sys

import pytest

from .conftest import REPO


@pytest.mark.parametrize("arch", [80, 90])
def test_prefix_prefill_kv_align4_jit_equals_aot(arch, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-m", "tests.cpu.aot.kv_align4_jit_sha", str(arch)], capture_output=True,
                         text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.split("\n") if line.strip()]
    assert len(lines) == 4
    for line in lines:
        aot, jit = line.split()
        assert aot == jit
