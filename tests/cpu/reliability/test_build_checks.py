"""`aotc build`, `verify` and `list` against a hostile user (issue 37, classes 5, 6 and 8):

- artifacts are written 0666 & ~umask, so a build by root is verified and loaded by another user,
  and an unreadable file is named (verify, list, the loader) instead of a raw PermissionError;
- a damaged binary of the right size is compiled again, not reused as "up to date";
- `-j 0` / `-j -1`, a target no GPU has (`sm10`), a miss log that is not UTF-8, holds a line that
  is not a record, or names an unknown kernel, axis, value or target: refused before anything
  compiles, naming the option (and the file and line); a build where nothing compiled writes no
  manifest, and `verify` flags an empty one;
- `verify` and `list` without a folder read AOTC_ARTIFACTS, as the loader does.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotc.aot import build as build_module
from aotc.aot.build import atomic_write, build
from aotc.aot.cli import cli
from aotc.loader.manifest import Manifest, Target, read_manifest, verify_files

from ..aot.conftest import REPO

NOBODY = 65534


def run_cli(*args, env=None):
    result = CliRunner().invoke(cli, [str(a) for a in args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# -- class 5: file modes ---------------------------------------------------------------------------
@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_atomic_write_gives_the_mode_open_would(tmp_path, mask):
    old = os.umask(mask)
    try:
        atomic_write(tmp_path / "f.bin", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.bin").stat().st_mode) == 0o666 & ~mask


def test_every_built_file_is_readable_under_the_umask(tiny_artifacts):
    expected = 0o666 & ~umask()
    files = [p for p in (tiny_artifacts / "sm90").rglob("*") if p.is_file() and p.name != ".lock"]
    assert any(p.suffix == ".cubin" for p in files) and any(p.parent.name == ".records" for p in files)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: expected for p in files}


@pytest.fixture
def shared_copy(tiny_artifacts):
    """The tiny build copied (modes kept) into a folder every user can reach."""
    root = Path(tempfile.mkdtemp(prefix="aotc-shared-", dir="/tmp"))
    try:
        os.chmod(root, 0o755)
        shutil.copytree(tiny_artifacts / "sm90", root / "art" / "sm90", ignore=shutil.ignore_patterns(".records"))
        os.chmod(root / "art", 0o755)
        yield root / "art"
    finally:
        shutil.rmtree(root, ignore_errors=True)


OTHER_USER = """
import os, sys, json
from aotc.aot.cli import cli
import aotc.aot.inspect, aotc.aot.elf, aotc.kernels.registry, aotc.loader.artifacts as artifacts
aotc.kernels.registry.all_specs()
if os.geteuid() == 0:  # everything imported above; from here on, another user
    os.setgroups([]); os.setgid({nobody}); os.setuid({nobody})
what, root = sys.argv[1], sys.argv[2]
if what == "load":
    artifacts.set_artifacts(root)
    try:
        t = artifacts.load_target((9, 0))
        for e in t.manifest.entries:
            t.read_binary(e)
        print("LOADED", len(t.manifest.entries))
    except Exception as e:
        print(type(e).__name__, e)
else:
    cli([what, root])
"""


def as_other_user(what: str, root: Path) -> subprocess.CompletedProcess:
    """`what` (verify, list or load) run by an unprivileged user (nobody, after the imports, when
    the tests run as root; the same user otherwise, where a chmod alone makes a file unreadable)."""
    return subprocess.run([sys.executable, "-c", OTHER_USER.format(nobody=NOBODY), what, str(root)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_a_build_by_root_is_verified_listed_and_loaded_by_another_user(shared_copy):
    for what, expect in (("verify", "8 entries checked, 0 problems"), ("list", "sm90: 8 binaries"),
                         ("load", "LOADED 8")):
        r = as_other_user(what, shared_copy)
        assert r.returncode == 0 and expect in r.stdout, (what, r.stdout, r.stderr)


def test_unreadable_files_are_named_not_a_traceback(shared_copy):
    folder = shared_copy / "sm90"
    entry = read_manifest(folder).entries[0]
    os.chmod(folder / entry.path, 0)
    if os.geteuid() != 0 and os.access(folder / entry.path, os.R_OK):
        pytest.skip("this user reads a file whatever its mode")
    r = as_other_user("verify", shared_copy)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{entry.path} cannot be read (Permission denied)" in r.stderr
    r = as_other_user("load", shared_copy)
    assert r.stdout.startswith("ManifestError") and "cannot be read (Permission denied)" in r.stdout, r.stdout
    os.chmod(folder / "manifest.json", 0o600)
    for what in ("verify", "list"):
        r = as_other_user(what, shared_copy)
        out = r.stdout + r.stderr
        assert r.returncode == 1 and "Traceback" not in out and "manifest.json cannot be read (Permission denied)" \
            in out, (what, out)
    r = as_other_user("load", shared_copy)
    assert r.stdout.startswith("ManifestError") and "cannot be read (Permission denied)" in r.stdout, r.stdout


# -- class 6: reuse by sha256 ----------------------------------------------------------------------
def test_a_damaged_binary_of_the_right_size_is_compiled_again(tiny_artifacts, tmp_path):
    out = tmp_path / "art"
    shutil.copytree(tiny_artifacts / "sm90", out / "sm90")
    entry = read_manifest(out / "sm90").entries[0]
    binary = out / "sm90" / entry.path
    data = bytearray(binary.read_bytes())
    data[len(data) // 2] ^= 0xFF
    binary.write_bytes(bytes(data))
    assert verify_files(out / "sm90") != []
    sharing = {e.key for e in read_manifest(out / "sm90").entries if e.path == entry.path}
    report = build(out, ["sm90"], kernels=["tiny_axpy"], jobs=1, progress=False)
    assert report.ok and {k.split(" ", 1)[1] for k in report.compiled} == sharing
    assert len(report.reused) == 8 - len(sharing)
    assert verify_files(out / "sm90") == [] and len(read_manifest(out / "sm90").entries) == 8


# -- class 8: options refused ----------------------------------------------------------------------
@pytest.mark.parametrize("jobs", ["0", "-1", "two"])
def test_jobs_below_one_are_refused(tmp_path, jobs):
    code, out = run_cli("build", "--arch", "sm90", "--kernel", "tiny_axpy", "--out", tmp_path / "art", "-j", jobs)
    assert code == 2 and "Invalid value for '--jobs' / '-j'" in out, out
    assert not (tmp_path / "art").exists()
    if jobs != "two":
        with pytest.raises(ValueError, match="jobs"):
            build(tmp_path / "art", ["sm90"], kernels=["tiny_axpy"], jobs=int(jobs), progress=False)


@pytest.mark.parametrize("arch", ["sm10", "sm91", "sm0", "gfx1100", "sm90 "])
def test_a_target_no_gpu_has_is_refused_before_anything_is_written(tmp_path, arch):
    code, out = run_cli("build", "--arch", arch, "--kernel", "tiny_axpy", "--out", tmp_path / "art")
    assert code == 2 and ("Nothing was compiled" in out or "unknown target" in out), out
    assert repr(arch) in out or f"target {arch}:" in out
    assert not (tmp_path / "art").exists()


def test_a_kernel_with_no_variant_for_the_target_is_refused(tmp_path):
    code, out = run_cli("build", "--arch", "sm80", "--kernel", "prefix_prefill_ws", "--out", tmp_path / "art")
    assert code == 2 and "no variant for target sm80" in out, out


def test_verify_flags_an_empty_manifest_of_a_target_with_variants(tiny_artifacts, tmp_path):
    folder = tmp_path / "art" / "sm90"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(Manifest(Target.from_name("sm90"), build_module.AOTC_VERSION, "3.6.0",
                                                   []).to_json())
    code, out = run_cli("verify", tmp_path / "art")
    assert code == 1 and "the manifest lists no binary" in out, out


FAILING_SITE = """
import aotc.aot.triton_compat as _tc
def _fail(*args, **kwargs):
    raise RuntimeError("simulated compiler failure")
_tc.compile_variant = _fail
"""


def test_a_build_where_nothing_compiled_writes_no_manifest(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(FAILING_SITE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path / "site"),
                                                                    os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, "-m", "aotc.aot.cli", "build", "--arch", "sm90", "--kernel", "tiny_axpy",
                        "--out", str(tmp_path / "art"), "--quiet", "-j", "2"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "simulated compiler failure" in r.stderr, r.stderr
    assert "sm90: no variant was built, so no manifest was written" in r.stderr
    assert not (tmp_path / "art" / "sm90" / "manifest.json").exists()


# -- class 8: --from-misses ------------------------------------------------------------------------
GOOD = json.dumps({"key": "tiny_axpy(block=64,dtype=fp32)@generic", "target": "sm90"})
BAD_MISS_LOGS = {
    "not UTF-8": (GOOD.encode() + b"\n" + b'{"key": "tiny_axpy(block=64,dtype=\xff)@generic"}\n', 2, "not UTF-8"),
    "a list": (f"{GOOD}\n[1, 2]\n".encode(), 2, "not an object"),
    "a string": (f'{GOOD}\n"tiny_axpy(block=64,dtype=fp32)@generic"\n'.encode(), 2, "not an object"),
    "a number": (b"5\n", 1, "not an object"),
    "null": (b"null\n", 1, "not an object"),
    "a key that is a number": (b'{"key": 5}\n', 1, "string values"),
    "a target that is a number": (b'{"key": "tiny_axpy(block=64,dtype=fp32)@generic", "target": 90}\n', 1,
                                  "string values"),
    "not JSON": (b"{key\n", 1, "not a miss record"),
    "an unknown axis": (f'{GOOD}\n\n{{"key": "tiny_axpy(block=64,dtype=fp32,foo=1)@generic"}}\n'.encode(), 3,
                        "axes"),
    "a missing axis": (b'{"key": "tiny_axpy(block=64)@generic", "target": "sm90"}\n', 1, "axes"),
    "an unknown kernel": (b'{"key": "nope(block=64)@generic"}\n', 1, "no kernel 'nope'"),
    "an unknown value": (b'{"key": "tiny_axpy(block=64,dtype=fp7)@generic", "target": "sm90"}\n', 1, "fp7"),
    "an unknown target": (b'{"key": "tiny_axpy(block=64,dtype=fp32)@generic", "target": "sm0"}\n', 1,
                          "unknown target"),
}


@pytest.mark.parametrize("name", list(BAD_MISS_LOGS))
def test_a_bad_miss_log_is_refused_naming_file_and_line(tmp_path, name):
    data, line, message = BAD_MISS_LOGS[name]
    log = tmp_path / "misses.jsonl"
    log.write_bytes(data)
    code, out = run_cli("build", "--arch", "sm90", "--kernel", "tiny_axpy", "--out", tmp_path / "art",
                        "--from-misses", log)
    assert code == 2 and f"misses.jsonl:{line}:" in out and message in out, out
    assert "--from-misses" in out
    assert not (tmp_path / "art").exists()


# -- class 8: AOTC_ARTIFACTS -----------------------------------------------------------------------
def test_verify_and_list_without_a_folder_read_aotc_artifacts(tiny_artifacts, tmp_path):
    env = {"AOTC_ARTIFACTS": str(tiny_artifacts)}
    code, out = run_cli("verify", env=env)
    assert code == 0 and "16 entries checked, 0 problems" in out, out
    code, out = run_cli("list", env=env)
    assert code == 0 and "sm80: 8 binaries" in out and "sm90: 8 binaries" in out, out
    for source, message in ((str(tmp_path / "absent"), "is not a folder"), ("hf://org/name@main", "Hub revision")):
        for command in ("verify", "list"):
            code, out = run_cli(command, env={"AOTC_ARTIFACTS": source})
            assert code == 2 and message in out, out


def test_a_pulled_target_folder_is_readable_under_the_umask(hub, tiny_artifacts, tmp_path):
    """`aotc pull --out` copies into a temporary folder (mkdtemp: 0700) that becomes the target
    folder: it gets mkdir's mode instead."""
    from aotc.aot.hub_commands import pull_artifacts

    files = {f"sm90/{p.relative_to(tiny_artifacts / 'sm90')}": p.read_bytes()
             for p in (tiny_artifacts / "sm90").rglob("*") if p.is_file() and ".records" not in p.parts}
    hub.repos["org/modes"] = {"branches": {}, "commits": {}}
    sha = hub.commit("org/modes", "main", files, "build")
    folder = pull_artifacts("org/modes", sha, ("sm90",), tmp_path / "pulled")["sm90"]
    mask = umask()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~mask
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*") if p.is_file()} == {0o666 & ~mask}
