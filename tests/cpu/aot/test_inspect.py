"""`aotc list` and `aotc verify`, including the damage verify must catch."""
import json
import shutil

from aotc.loader.manifest import read_manifest

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
    m90 = json.loads((art / "sm90" / "manifest.json").read_text())
    m80 = json.loads((art / "sm80" / "manifest.json").read_text())
    # 1: flip a byte of one sm90 binary.
    tampered = m90["entries"][0]
    path = art / "sm90" / tampered["path"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    # 2: put an sm80 cubin where an sm90 entry points, with a matching sha256 (wrong arch).
    wrong = m90["entries"][1]
    donor = m80["entries"][1]
    shutil.copy(art / "sm80" / donor["path"], art / "sm90" / donor["path"])
    wrong.update(path=donor["path"], sha256=donor["sha256"], size=donor["size"])
    # 3: a symbol the cubin does not define.
    m90["entries"][2]["symbol"] = "not_there"
    (art / "sm90" / "manifest.json").write_text(json.dumps(m90))
    r = run_cli("verify", art)
    assert r.returncode == 1
    assert tampered["key"] in r.stderr and "sha256" in r.stderr
    assert wrong["key"] in r.stderr and "is for sm80" in r.stderr
    assert m90["entries"][2]["key"] in r.stderr and "not_there" in r.stderr


def test_verify_refuses_an_incompatible_manifest(tiny_artifacts, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(tiny_artifacts, art)
    doc = json.loads((art / "sm90" / "manifest.json").read_text())
    doc["schema_version"] = 99
    (art / "sm90" / "manifest.json").write_text(json.dumps(doc))
    r = run_cli("verify", art)
    assert r.returncode == 1 and "schema 99" in r.stderr and "Triton 3.6" in r.stderr
