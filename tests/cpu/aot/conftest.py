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
