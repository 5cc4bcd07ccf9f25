"""Reproducible builds (issue 37, class 9): the worker's pins, the comparison, and the double
build (`aotc check-reproducible`): two builds in fresh Triton caches, other hash seeds, every
binary's sha256 compared. The `slow` case builds gdn_chunk_state, whose head-256 variants ptxas
compiled two ways (swapped spill slots) before the workers ran it without address randomization."""
import dataclasses
import os
import shutil
import subprocess
import sys

import pytest

from aotc.aot import workers
from aotc.aot.reproducible import compare_folders, double_build
from aotc.loader.manifest import Manifest, read_manifest

from .conftest import REPO, run_cli

PIN_CHECK = ("from aotc.aot import workers; import subprocess; ok = workers.no_address_randomization(); "
             "print(ok, subprocess.run(['cat', '/proc/self/personality'], capture_output=True, text=True).stdout)")


def pinned_here() -> bool:
    out = subprocess.run([sys.executable, "-c", PIN_CHECK], capture_output=True, text=True, cwd=REPO).stdout.split()
    return out[0] == "True"


def test_a_program_the_worker_starts_runs_without_address_randomization():
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux's personality flag")
    ok, personality = subprocess.run([sys.executable, "-c", PIN_CHECK], capture_output=True, text=True,
                                     cwd=REPO, check=True).stdout.split()
    if ok != "True":
        pytest.skip("this system refuses personality(ADDR_NO_RANDOMIZE) (a seccomp profile)")
    assert int(personality, 16) & workers.ADDR_NO_RANDOMIZE


def test_pin_environment_drops_what_changes_a_binary(monkeypatch):
    import tempfile

    monkeypatch.setattr(os, "environ", dict(os.environ))  # this process keeps TRITON_INTERPRET
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    for name in ("TRITON_PTXAS_PATH", "PTXAS_OPTIONS", "DISABLE_LLVM_OPT", "TRITON_DEFAULT_FP_FUSION", "TMPDIR"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere")
    dropped = workers.pin_environment()
    assert {"TRITON_PTXAS_PATH", "PTXAS_OPTIONS", "DISABLE_LLVM_OPT", "TRITON_DEFAULT_FP_FUSION"} <= set(dropped)
    assert os.environ["TRITON_CACHE_DIR"] == "/somewhere"  # where to cache is not what to compile
    assert not any(name in os.environ for name in dropped)


def test_the_callers_compile_switches_do_not_reach_the_build(tiny_artifacts, tmp_path):
    """A bogus ptxas option and fp fusion off in the caller's environment: the build ignores both
    and gives the tiny build's bytes."""
    env = {"PTXAS_OPTIONS": "--no-such-ptxas-option", "TRITON_DEFAULT_FP_FUSION": "0",
           "TRITON_PTXAS_PATH": "/nonexistent/ptxas"}
    r = run_cli("build", "--arch", "sm90", "--kernel", "tiny_axpy", "--out", tmp_path / "art", "--quiet", env=env)
    assert r.returncode == 0, r.stderr
    built = {e.key: e.sha256 for e in read_manifest(tmp_path / "art" / "sm90").entries}
    assert built == {e.key: e.sha256 for e in read_manifest(tiny_artifacts / "sm90").entries}


def test_compare_folders_names_a_differing_binary(tiny_artifacts, tmp_path):
    for run in ("a", "b"):
        shutil.copytree(tiny_artifacts / "sm90", tmp_path / run / "sm90")
    assert compare_folders(tmp_path / "a", tmp_path / "b", ["sm90"]).ok
    m = read_manifest(tmp_path / "b" / "sm90")
    entries = list(m.entries)
    entries[0] = dataclasses.replace(entries[0], sha256="0" * 64)
    (tmp_path / "b" / "sm90" / "manifest.json").write_text(
        Manifest(m.target, m.aotc_version, m.triton_version, entries).to_json())
    result = compare_folders(tmp_path / "a", tmp_path / "b", ["sm90"])
    assert result.compared == 8 and len(result.differ) == 1 and entries[0].key in result.differ[0]


def test_check_reproducible_builds_twice_and_compares(tmp_path):
    r = run_cli("check-reproducible", "--arch", "sm90", "--kernel", "tiny_axpy", "-j", "2")
    assert r.returncode == 0 and "8 binaries compared, 0 differ" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_gated_delta_chunk_state_builds_the_same_bytes_twice():
    if not pinned_here():
        pytest.skip("no ADDR_NO_RANDOMIZE here: ptxas may pick either spill-slot order at head size 256")
    from aotc.kernels.gated_delta import chunk_spec

    # the aligned and the generic binaries of the state pass (the head-256 ones are what varied)
    result = double_build(["sm90"], ["gdn_chunk_state", "gdn_chunk_state_generic"])
    assert not result.failed, result.failed
    want = len(chunk_spec.GDN_CHUNK_STATE.keys()) + len(chunk_spec.GDN_CHUNK_STATE_GENERIC.keys())
    assert result.compared == want == 26 and result.differ == [] and result.only_one == []
