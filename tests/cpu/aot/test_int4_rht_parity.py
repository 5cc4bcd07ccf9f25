"""prefix_prefill's int4_zp binaries ("token_zp": vLLM's INT4_PER_TOKEN_HEAD codes) compile to the
same bytes through the AOT build as through Triton's JIT for an aligned call, on sm80 and sm90
(tests/cpu/aot/int4_rht_jit_sha.py, in a process without the interpreter). decode's int4_zp split
variants are in test_decode_parity.py."""
import os
import subprocess
import sys

import pytest

from .conftest import REPO


@pytest.mark.parametrize("arch", [80, 90])
def test_prefix_prefill_int4_zp_jit_equals_aot(arch, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-m", "tests.cpu.aot.int4_rht_jit_sha", str(arch)], capture_output=True,
                         text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.split("\n") if line.strip()]
    assert len(lines) == 2
    for line in lines:
        aot, jit = line.split()
        assert aot == jit
