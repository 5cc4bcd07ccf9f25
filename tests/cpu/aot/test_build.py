"""`aotc build`: manifest contents, sha256, ELF arch, incremental no-op, interruption,
reproducibility, failures reported by key, concurrent builds, --from-misses."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from aotc.aot.build import build
from aotc.aot.elf import cubin_info
from aotc.loader.manifest import read_manifest, sha256_file, verify_files

from .conftest import REPO, run_cli


def test_manifest_records_everything_the_loader_needs(tiny_artifacts):
    for target, arch in (("sm80", 80), ("sm90", 90)):
        m = read_manifest(tiny_artifacts / target, expect_target=target)
        assert m.target.arch == arch and m.target.backend == "cuda" and m.target.warp_size == 32
        import importlib.metadata

        assert m.triton_version == importlib.metadata.version("triton")
        assert len(m.entries) == 8  # 2 dtypes x 2 blocks x {aligned, generic}
        for e in m.entries:
            path = tiny_artifacts / target / e.path
            assert e.path == f"bin/{e.sha256}.cubin"
            assert sha256_file(path) == e.sha256 and path.stat().st_size == e.size
            sm, symbols = cubin_info(path.read_bytes())
            assert sm == arch and e.symbol in symbols
            assert e.params[-2:] == ["*i8", "*i8"]
            assert e.param_names[:7] == ["x", "y", "out", "stride_x", "n", "rows", "alpha"]
            assert e.divisible == (["x", "out", "stride_x"] if e.key.endswith("@aligned") else [])
            assert e.num_warps == (4 if arch == 90 else 2)
            assert e.provenance["source_sha256"] and e.provenance["triton_hash"]
        assert verify_files(tiny_artifacts / target) == []


def test_manifest_is_schema_2_with_kernel_fields_once(tiny_artifacts):
    text = (tiny_artifacts / "sm90" / "manifest.json").read_text()
    doc = json.loads(text)
    assert doc["schema_version"] == 2 and list(doc["kernels"]) == ["tiny_axpy"]
    table = doc["kernels"]["tiny_axpy"]
    assert {"symbol", "param_names", "num_warps", "provenance.source_sha256"} <= table["common"].keys()
    assert table["columns"][0] == "sha256" and "path" not in table["columns"] + list(table["common"])
    assert len(table["entries"]) == 8 and text.count('"param_names"') == 1
    assert doc["divisible_sets"] == [["x", "out", "stride_x"], []]
    # Reading and writing again gives the same bytes: nothing is lost or reordered.
    assert read_manifest(tiny_artifacts / "sm90").to_json() == text


def test_second_build_compiles_nothing_and_never_imports_triton(tiny_artifacts):
    code = ("import sys, time; t=time.perf_counter(); from aotc.aot.build import build; "
            f"r = build({str(tiny_artifacts)!r}, ['sm80', 'sm90'], kernels=['tiny_axpy'], progress=False); "
            "print(len(r.compiled), len(r.reused), 'triton' in sys.modules, time.perf_counter()-t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    compiled, reused, imported, seconds = out.stdout.split()
    assert (compiled, reused, imported) == ("0", "16", "False"), out.stdout
    print(f"no-op build took {float(seconds):.2f}s")


def test_same_sources_give_the_same_bytes(tiny_artifacts, tmp_path, monkeypatch):
    # A fresh Triton cache: the second build really compiles.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    report = build(tmp_path / "again", ["sm90"], kernels=["tiny_axpy"], jobs=2, progress=False)
    assert report.ok and len(report.compiled) == 8
    first = {e.key: e.sha256 for e in read_manifest(tiny_artifacts / "sm90").entries}
    second = {e.key: e.sha256 for e in read_manifest(tmp_path / "again" / "sm90").entries}
    assert first == second


def test_failing_variant_is_reported_by_key_and_the_rest_still_build(tmp_path):
    out = tmp_path / "art"
    r = run_cli("build", "--arch", "sm90", "--out", out, "--kernel", "tiny_axpy", "--quiet",
                env={"AOTC_TEST_BROKEN": "1"})
    assert r.returncode == 1
    assert "FAILED sm90 tiny_axpy(block=100,dtype=fp16)@aligned" in r.stderr
    assert "arange" in r.stderr  # the compiler's own message
    keys = {e.key for e in read_manifest(out / "sm90").entries}
    assert len(keys) == 8 and not any("block=100" in k for k in keys)


def test_interrupted_build_leaves_the_previous_manifest_valid_and_resumes(tiny_artifacts, tmp_path):
    out = tmp_path / "art"
    shutil.copytree(tiny_artifacts, out)
    before = (out / "sm90" / "manifest.json").read_bytes()
    for target in ("sm80", "sm90"):  # as if the sources changed: every variant must compile again
        shutil.rmtree(out / target / ".records")
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cold-cache"))
    proc = subprocess.Popen([sys.executable, "-m", "aotc.aot.cli", "build", "--arch", "sm80", "--arch", "sm90",
                             "--out", str(out), "--kernel", "tiny_axpy", "--quiet", "-j", "1"],
                            cwd=REPO, env=env, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not any(list((out / t / ".records").glob("*.json")) for t in ("sm80", "sm90")):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (out / "sm90" / "manifest.json").read_bytes() == before
    assert verify_files(out / "sm90") == [] and verify_files(out / "sm80") == []
    assert not list((out / "sm90").glob("*.tmp")) and not list((out / "sm90" / "bin").glob(".*.tmp"))
    report = build(out, ["sm80", "sm90"], kernels=["tiny_axpy"], jobs=2, progress=False)
    assert report.ok and len(report.reused) >= 1 and len(report.compiled) + len(report.reused) == 16


def test_two_concurrent_builds_into_one_folder(tmp_path):
    out = tmp_path / "art"
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    cmds = [[sys.executable, "-m", "aotc.aot.cli", "build", "--arch", arch, "--arch", "sm90", "--out", str(out),
             "--kernel", "tiny_axpy", "--quiet", "-j", "1"] for arch in ("sm80", "sm90")]
    procs = [subprocess.Popen(c, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for c in cmds]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    for target in ("sm80", "sm90"):
        assert len(read_manifest(out / target).entries) == 8
        assert verify_files(out / target) == []


def test_from_misses_builds_the_logged_keys(tmp_path):
    log = tmp_path / "misses.jsonl"
    log.write_text(json.dumps({"key": "tiny_axpy(block=256,dtype=fp32)@generic", "target": "sm90"}) + "\n"
                   + json.dumps({"key": "tiny_axpy(block=32,dtype=fp32)@generic", "target": "sm80"}) + "\n")
    out = tmp_path / "art"
    r = run_cli("build", "--arch", "sm90", "--out", out, "--kernel", "tiny_axpy", "--from-misses", log, "--quiet")
    assert r.returncode == 0, r.stderr
    keys = {e.key for e in read_manifest(out / "sm90").entries}
    assert {"tiny_axpy(block=256,dtype=fp32)@aligned", "tiny_axpy(block=256,dtype=fp32)@generic"} <= keys
    assert not any("block=32" in k for k in keys)  # that miss was on another target
