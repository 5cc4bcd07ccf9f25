import os
import sys
from pathlib import Path

import pytest

from aotc.aot.build import build

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory):
    """The tiny kernel built for sm80 and sm90 once per session."""
    out = tmp_path_factory.mktemp("artifacts")
    report = build(out, ["sm80", "sm90"], kernels=["tiny_axpy"], jobs=2, progress=False)
    assert report.ok, report.failed
    return out


def run_cli(*args, env=None, timeout=600):
    import subprocess

    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "aotc.aot.cli", *map(str, args)], capture_output=True,
                          text=True, env=full_env, cwd=REPO, timeout=timeout)


def jit_sha_pairs(module: str, *args, tmp_path, env=None) -> list[tuple[str, str]]:
    """Run the (AOT sha, JIT sha) script tests.cpu.aot.<module> in a process without the interpreter and
    with a Triton cache of its own; its output lines as pairs (a failed run fails the test)."""
    import subprocess

    full_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full_env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    full_env.update(env or {})
    out = subprocess.run([sys.executable, "-m", f"tests.cpu.aot.{module}", *map(str, args)], capture_output=True,
                         text=True, cwd=REPO, env=full_env)
    assert out.returncode == 0, out.stderr[-3000:]
    return [tuple(line.split()) for line in out.stdout.split("\n") if line.strip()]

