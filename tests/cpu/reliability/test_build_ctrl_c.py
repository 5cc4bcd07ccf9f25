"""Ctrl-C and `aotc build` (issue 37, class 2): one SIGINT to the build's process group (what a
terminal sends) stops it within seconds: no queued variant starts, the workers are gone, the
manifest lists exactly the variants that finished (each verified), exit status 130, one short
message and no traceback. A second SIGINT during the stop changes none of that; a SIGINT to the
parent alone stops the workers too.

Every compile is slowed by 2 s (a sitecustomize that wraps compile_variant in each process), so
the interruption always lands while variants are running and others are queued.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aotc.loader.manifest import Entry, read_manifest, verify_files

from ..aot.conftest import REPO

SLOW_S = 2.0
STOP_BOUND_S = 15.0  # generous: the stop takes well under a second here
SITECUSTOMIZE = f"""
import time
import aotc.aot.triton_compat as _tc
_real = _tc.compile_variant
def _slow(*args, **kwargs):
    time.sleep({SLOW_S})
    return _real(*args, **kwargs)
_tc.compile_variant = _slow
"""


@pytest.fixture(scope="module")
def slow_env(tmp_path_factory):
    site = tmp_path_factory.mktemp("slow-site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, TRITON_CACHE_DIR=str(tmp_path_factory.mktemp("triton-cache")))


def _terminal_sigint() -> None:
    # A build started from a shell has SIGINT at its default; one ignored by the test process
    # (an in-process CLI test's exit path ignores it) would be inherited across exec and hide Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(out: Path, env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "aotc.aot.cli", "build", "--arch", "sm90", "--kernel", "tiny_axpy", "-j", "2",
           "--out", str(out)]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_terminal_sigint)


def records(out: Path) -> dict[str, Entry]:
    found = {}
    for path in (out / "sm90" / ".records").glob("*.json"):
        entry = Entry(**json.loads(path.read_text()))
        found[entry.key] = entry
    return found


def wait_records(proc: subprocess.Popen, out: Path, n: int) -> None:
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None and len(records(out)) < n:
        time.sleep(0.02)
    assert proc.poll() is None, "the build ended before the interruption"
    assert len(records(out)) >= n


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def assert_stopped_cleanly(proc: subprocess.Popen, out: Path, sent_at: float) -> None:
    _, err = proc.communicate(timeout=STOP_BOUND_S + 60)
    took = time.time() - sent_at
    assert took < STOP_BOUND_S, f"the build took {took:.1f}s to stop"
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert "interrupted" in err and "run the same command to resume" in err
    assert "\r" not in err  # stderr is a pipe here: progress comes as lines
    time.sleep(SLOW_S + 1)  # a worker that survived would finish its variant by now
    assert not group_alive(proc.pid), "a worker outlived the build"
    finished = records(out)
    assert 1 <= len(finished) < 8, "the queued variants should not have run"
    manifest = {e.key: e for e in read_manifest(out / "sm90").entries}
    assert set(manifest) == set(finished)  # exactly what finished
    assert all(manifest[k].sha256 == finished[k].sha256 for k in manifest)
    assert verify_files(out / "sm90") == []
    assert not list((out / "sm90" / ".records").glob("*.running"))


def test_one_ctrl_c_stops_the_build_and_writes_what_finished(tmp_path, slow_env):
    out = tmp_path / "art"
    proc = start(out, slow_env)
    wait_records(proc, out, 2)
    os.killpg(proc.pid, signal.SIGINT)
    assert_stopped_cleanly(proc, out, time.time())
    # The same command resumes: what finished is reused, the rest compiled.
    done = len(records(out))
    again = subprocess.run([sys.executable, "-m", "aotc.aot.cli", "build", "--arch", "sm90", "--kernel", "tiny_axpy",
                            "--out", str(out), "--quiet", "-j", "2"], cwd=REPO, env=slow_env, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{8 - done} compiled, {done} up to date" in again.stdout
    assert len(read_manifest(out / "sm90").entries) == 8 and verify_files(out / "sm90") == []


def test_a_second_ctrl_c_neither_hangs_nor_prints_a_traceback(tmp_path, slow_env):
    out = tmp_path / "art"
    proc = start(out, slow_env)
    wait_records(proc, out, 1)
    sent = time.time()
    os.killpg(proc.pid, signal.SIGINT)
    for _ in range(3):  # an impatient user
        time.sleep(0.1)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
    assert_stopped_cleanly(proc, out, sent)


def test_sigint_to_the_parent_alone_stops_its_workers(tmp_path, slow_env):
    out = tmp_path / "art"
    proc = start(out, slow_env)
    wait_records(proc, out, 1)
    os.kill(proc.pid, signal.SIGINT)  # `kill -INT <pid>`: the workers get nothing from outside
    assert_stopped_cleanly(proc, out, time.time())
