"""`aotc list` and `aotc verify`, including the damage verify must catch."""
import json
import shutil
from dataclasses import replace

from aotc.loader.manifest import Manifest, read_manifest

from .conftest import run_cli


def test_list_json_counts_variants_and_bytes(tiny_artifacts):
    r = run_cli("list", tiny_artifacts, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    for target in ("sm80", "sm90"):
        k = doc[target]["kernels"]["tiny_axpy"]
        assert k["variants"] == 4 and k["binaries"] == 8
        m = read_manifest(tiny_artifacts / target)
        assert k["bytes"] == sum({e.path: e.size for e in m.entries}.values())


def test_verify_passes_on_a_clean_build(tiny_artifacts):
    r = run_cli("verify", tiny_artifacts)
    assert r.returncode == 0 and "16 entries checked, 0 problems" in r.stdout


def test_verify_names_every_bad_entry(tiny_artifacts, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(tiny_artifacts, art)
    m90, m80 = read_manifest(art / "sm90"), read_manifest(art / "sm80")
    entries = m90.entries
    # 1: flip a byte of one sm90 binary.
    tampered = entries[0]
    path = art / "sm90" / tampered.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    # 2: put an sm80 cubin where an sm90 entry points, with a matching sha256 (wrong arch).
    donor = m80.entries[1]
    shutil.copy(art / "sm80" / donor.path, art / "sm90" / donor.path)
    entries[1] = replace(entries[1], path=donor.path, sha256=donor.sha256, size=donor.size)
    # 3: a symbol the cubin does not define.
    entries[2] = replace(entries[2], symbol="not_there")
    rewritten = Manifest(m90.target, m90.aotc_version, m90.triton_version, entries)
    (art / "sm90" / "manifest.json").write_text(rewritten.to_json())
    r = run_cli("verify", art)
    assert r.returncode == 1
    assert tampered.key in r.stderr and "sha256" in r.stderr
    assert entries[1].key in r.stderr and "is for sm80" in r.stderr
    assert entries[2].key in r.stderr and "not_there" in r.stderr


def test_verify_and_list_report_a_malformed_entry_instead_of_failing(tiny_artifacts, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(tiny_artifacts, art)
    doc = json.loads((art / "sm90" / "manifest.json").read_text())
    del doc["kernels"]["tiny_axpy"]["common"]["symbol"]  # read_manifest passes; building an Entry fails
    (art / "sm90" / "manifest.json").write_text(json.dumps(doc))
    r = run_cli("verify", art)
    assert r.returncode == 1 and "BAD" in r.stderr and "symbol" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("list", art, "--json")
    assert r.returncode == 1 and "symbol" in json.loads(r.stdout)["sm90"]["error"]  # named, then exit 1


def test_verify_refuses_an_incompatible_manifest(tiny_artifacts, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(tiny_artifacts, art)
    doc = json.loads((art / "sm90" / "manifest.json").read_text())
    doc["schema_version"] = 99
    (art / "sm90" / "manifest.json").write_text(json.dumps(doc))
    r = run_cli("verify", art)
    assert r.returncode == 1 and "schema 99" in r.stderr and "Triton 3.6" in r.stderr
