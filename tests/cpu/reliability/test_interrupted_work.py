"""Interrupted and concurrent work: `aotc build` killed (SIGINT, as Ctrl-C sends it to the whole
process group, and SIGKILL) at stepped points, two builds and two pulls at once, a full disk.

After every interruption: the manifest on disk is the previous one byte for byte or a complete new
one (every entry's binary present with its sha256); no file at a binary's final name is partial
(each bin/<sha256>.cubin hashes to its name); every build record names a complete binary; and the
next run resumes (reuses those records) and ends with all 8 variants of the tiny family.

CPU cost: CI runs 4 kill points (each a `aotc build` process plus a resuming build); set
AOTC_RELIABILITY_FULL=1 for 12 (both signals at 6 points).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotc.aot import build as build_module
from aotc.aot.build import build
from aotc.aot.cli import cli
from aotc.loader.manifest import Entry, read_manifest, sha256_file, verify_files

from ..aot.conftest import REPO

ARGS = ["build", "--arch", "sm90", "--kernel", "tiny_axpy", "--quiet", "-j", "1"]
FULL = os.environ.get("AOTC_RELIABILITY_FULL") == "1"
# (signal, when): "t=S" S seconds after the start (imports, planning), "records=N" once N variants
# have compiled (N=8: every variant done, the manifest being merged and written).
POINTS = [(signal.SIGINT, "t=0.5"), (signal.SIGKILL, "records=1"), (signal.SIGINT, "records=4"),
          (signal.SIGKILL, "records=8")]
if FULL:
    POINTS = [(s, w) for s in (signal.SIGINT, signal.SIGKILL)
              for w in ("t=0.2", "t=1.0", "records=1", "records=3", "records=6", "records=8")]


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory):
    """One Triton cache for this module's builds: warm after the first, so a kill run costs little."""
    return tmp_path_factory.mktemp("triton-cache")


def fresh_copy(tiny_artifacts: Path, tmp_path: Path) -> Path:
    """The tiny build as the previous build, its records gone (as if the sources changed): every
    variant compiles again."""
    out = tmp_path / "art"
    shutil.copytree(tiny_artifacts / "sm90", out / "sm90")
    shutil.rmtree(out / "sm90" / ".records")
    return out


def start(out: Path, triton_cache: Path, extra_env=None) -> subprocess.Popen:
    env = dict(os.environ, TRITON_CACHE_DIR=str(triton_cache), **(extra_env or {}))
    return subprocess.Popen([sys.executable, "-m", "aotc.aot.cli", *ARGS, "--out", str(out)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def records(out: Path) -> list[Path]:
    return list((out / "sm90" / ".records").glob("*.json"))


def wait_point(proc: subprocess.Popen, out: Path, when: str) -> None:
    what, value = when.split("=")
    deadline = time.time() + 120
    if what == "t":
        deadline = time.time() + float(value)
    while time.time() < deadline and proc.poll() is None:
        if what == "records" and len(records(out)) >= int(value):
            return
        time.sleep(0.005)


def assert_nothing_partial_is_trusted(out: Path, before: bytes | None) -> None:
    folder = out / "sm90"
    now = (folder / "manifest.json").read_bytes() if (folder / "manifest.json").exists() else None
    if now != before:  # a new manifest: complete and every file of it intact
        assert verify_files(folder) == []
    for binary in (folder / "bin").glob("*.cubin"):  # temporary names start with "."
        assert sha256_file(binary) == binary.stem, f"partial binary at its final name: {binary}"
    for record in records(out):
        entry = Entry(**json.loads(record.read_text()))
        assert sha256_file(folder / entry.path) == entry.sha256, record


def assert_complete(out: Path) -> None:
    assert len(read_manifest(out / "sm90").entries) == 8
    assert verify_files(out / "sm90") == []


@pytest.mark.parametrize("sig, when", POINTS, ids=[f"{s.name}@{w}" for s, w in POINTS])
def test_killed_build_keeps_the_previous_manifest_and_the_next_resumes(tiny_artifacts, tmp_path, triton_cache,
                                                                       sig, when):
    out = fresh_copy(tiny_artifacts, tmp_path)
    before = (out / "sm90" / "manifest.json").read_bytes()
    proc = start(out, triton_cache)
    wait_point(proc, out, when)
    killed = proc.poll() is None
    if killed:
        os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=60)  # a Ctrl-C must end the build, not hang it on its workers
    # Only the last point may come after the build finished (its manifest write takes milliseconds).
    assert killed or when == "records=8", "the build ended before the kill point"
    if killed:
        print(f"{sig.name} at {when}: exit {proc.returncode}, {len(records(out))} records")
    if sig == signal.SIGINT:
        assert "Traceback" not in err, err
    assert_nothing_partial_is_trusted(out, before)
    done = len(records(out))
    report = build(out, ["sm90"], kernels=["tiny_axpy"], jobs=1, progress=False)
    assert report.ok and len(report.reused) >= done and len(report.compiled) + len(report.reused) == 8
    assert_complete(out)


def test_a_kill_during_every_manifest_write_leaves_a_whole_manifest(tiny_artifacts, tmp_path, monkeypatch):
    """The manifest write itself interrupted (the step a timed kill rarely hits): the rename
    never happens, the previous manifest stays and no temporary file is read as one."""
    out = tmp_path / "art"
    shutil.copytree(tiny_artifacts / "sm90", out / "sm90")
    before = (out / "sm90" / "manifest.json").read_bytes()
    real_replace = os.replace

    def interrupted(src, dst):
        if str(dst).endswith("manifest.json"):
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(build_module.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build(out, ["sm90"], kernels=["tiny_axpy"], jobs=1, progress=False)
    assert (out / "sm90" / "manifest.json").read_bytes() == before
    assert not list((out / "sm90").glob(".manifest.json.*"))  # the temporary is removed


def test_two_identical_builds_at_once_into_one_folder(tmp_path, triton_cache):
    out = tmp_path / "art"
    procs = [start(out, triton_cache) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert_complete(out)
    assert_nothing_partial_is_trusted(out, None)


def test_a_build_killed_while_another_runs_leaves_the_other_whole(tiny_artifacts, tmp_path, triton_cache):
    out = fresh_copy(tiny_artifacts, tmp_path)
    victim, survivor = start(out, triton_cache), start(out, triton_cache)
    wait_point(victim, out, "records=1")
    if victim.poll() is None:
        os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=60)
    _, err = survivor.communicate(timeout=300)
    assert survivor.returncode == 0, err
    assert_complete(out)
    assert_nothing_partial_is_trusted(out, None)


# -- a full disk -----------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 64 KB tmpfs (root only; skipped elsewhere, the simulated test below runs everywhere)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                                           capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_fails_the_build_cleanly_and_the_next_run_resumes(tiny_artifacts, small_disk, triton_cache):
    out = small_disk / "art"
    shutil.copytree(tiny_artifacts / "sm90", out / "sm90", ignore=shutil.ignore_patterns(".records"))
    before = (out / "sm90" / "manifest.json").read_bytes()
    ballast = small_disk / "ballast"
    free = shutil.disk_usage(small_disk).free
    ballast.write_bytes(b"\0" * max(0, free - 12 * 1024))  # room for two or three more files
    proc = start(out, triton_cache)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert "No space left on device" in err
    assert_nothing_partial_is_trusted(out, before)
    done = len(records(out))
    ballast.unlink()
    report = build(out, ["sm90"], kernels=["tiny_axpy"], jobs=1, progress=False)
    assert report.ok and len(report.reused) >= done and len(report.compiled) + len(report.reused) == 8
    assert_complete(out)


def test_a_failed_manifest_write_keeps_the_previous_one_and_says_so(tiny_artifacts, tmp_path, monkeypatch):
    """Simulated ENOSPC (runs without root): the manifest's write fails after half its bytes."""
    out = tmp_path / "art"
    shutil.copytree(tiny_artifacts / "sm90", out / "sm90")
    before = (out / "sm90" / "manifest.json").read_bytes()
    real_fdopen = os.fdopen

    class HalfFull:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.f, name)

    def fdopen(fd, *args, **kwargs):
        f = real_fdopen(fd, *args, **kwargs)
        return HalfFull(f) if ".manifest.json." in os.readlink(f"/proc/self/fd/{fd}") else f

    monkeypatch.setattr(build_module.os, "fdopen", fdopen)
    result = CliRunner().invoke(cli, [*ARGS, "--out", str(out)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert "No space left on device" in result.output and "Traceback" not in result.output
    assert (out / "sm90" / "manifest.json").read_bytes() == before
    assert not list((out / "sm90").glob(".manifest.json.*"))


# -- two pulls at once -----------------------------------------------------------------------------
def test_two_pulls_at_once_into_one_folder(hub, tiny_artifacts, tmp_path):
    from aotc.aot.hub_commands import pull_artifacts

    files = {f"sm90/{p.relative_to(tiny_artifacts / 'sm90')}": p.read_bytes()
             for p in (tiny_artifacts / "sm90").rglob("*") if p.is_file() and ".records" not in p.parts}
    hub.repos["org/two"] = {"branches": {}, "commits": {}}
    sha = hub.commit("org/two", "main", files, "build")
    hub.get_delay = 0.05  # the two pulls overlap
    out = tmp_path / "pulled"
    errors: list[BaseException] = []

    def pull():
        try:
            pull_artifacts("org/two", sha, ("sm90",), out)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    for _ in range(3):  # rounds: the second and third replace a complete folder while the other copies
        threads = [threading.Thread(target=pull) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["sm90"]
        assert verify_files(out / "sm90") == [] and len(read_manifest(out / "sm90").entries) == 8
