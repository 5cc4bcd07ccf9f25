"""The ALIGNED binaries read K and V in 16-byte vectors, which the GENERIC one cannot assume, and
every format compiles for sm80 too (fp8 e4m3 is read as bytes: Triton has no e4m3 type there).
The merge kernel waits for the split grid (griddepcontrol.wait) on sm90, where it is launched as
a programmatic dependent launch, and holds no such sm90-only instruction on sm80."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]


def probe(arch: int, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    run = subprocess.run([sys.executable, "-m", "tests.cpu.kernels.decode.ptx_probe", str(arch)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", [90, 80])
def test_aligned_binaries_read_kv_in_16_byte_vectors(arch, tmp_path):
    got = probe(arch, tmp_path)
    assert got["bf16@aligned"]["v4"] > 0, got
    assert got["bf16@generic"]["v4"] == got["bf16@generic"]["v2"] == 0, got
    for kv in ("int8", "fp8_e4m3"):
        assert got[f"{kv}@aligned"]["v4"] > 0, got
    assert got["merge_grid_waits"] == (1 if arch >= 90 else 0), got
