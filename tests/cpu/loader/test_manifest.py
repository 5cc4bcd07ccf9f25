"""The schema-2 manifest: round trip, defaults, what is stored once, refusals of old and malformed
manifests. No build needed: entries are made up (the build's own manifest is tests/cpu/aot)."""
import json
from dataclasses import asdict, replace

import pytest

from aotc.loader.manifest import Entry, Manifest, ManifestError, Target, read_manifest

NAMES = ["x", "y", "out", "n", "global_scratch", "profile_scratch"]


def _entry(kernel: str, i: int, level: str) -> Entry:
    sha = f"{i:02d}{kernel[:4].encode().hex()}".ljust(64, "0")  # aligned and generic share a binary
    return Entry(
        kernel=kernel, key=f"{kernel}(block={32 << i})@{level}", path=f"bin/{sha}.cubin", sha256=sha,
        size=1000 + i, symbol=f"{kernel}_kernel", params=["*fp16" if i % 2 else "*bf16", "*fp32", "*fp32", "i32",
                                                         "*i8", "*i8"],
        param_names=list(NAMES), divisible=["x", "out"] if level == "aligned" else [], num_warps=4, num_stages=2,
        num_ctas=1, cluster_dims=[1, 1, 1], shared=1024 * i, global_scratch_size=0, global_scratch_align=1,
        profile_scratch_size=0, profile_scratch_align=1, launch_cooperative_grid=False, launch_pdl=False,
        constexprs={"BLOCK": 32 << i, "EVEN": i % 2 == 0},
        provenance={"source_sha256": "5" * 64, "build_hash": f"b{i}", "triton_version": "3.6.0"})


def _entries() -> list[Entry]:
    return [_entry(k, i, level) for k in ("axpy", "scale") for i in range(4) for level in ("aligned", "generic")]


def _write(folder, entries) -> Manifest:
    m = Manifest(Target.from_name("sm90"), "0.1.0", "3.6.0", entries)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(m.to_json())
    return m


def _doc(folder) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _rewrite(folder, doc) -> None:
    (folder / "manifest.json").write_text(json.dumps(doc))


def test_round_trip_gives_back_the_same_entries(tmp_path):
    entries = _entries()
    entries[3] = replace(entries[3], num_ctas=2, cluster_dims=[2, 1, 1], launch_pdl=True, global_scratch_size=64,
                         path="bin/renamed.cubin")
    entries[5] = replace(entries[5], provenance={})  # another set of names: stored as one dict
    entries[6] = replace(entries[6], constexprs={"BLOCK": 1, "EXTRA": "x"})
    m = _write(tmp_path / "sm90", entries)
    back = read_manifest(tmp_path / "sm90", expect_target="sm90")
    assert back == m and back.schema_version == 2 and back.by_key() == {e.key: e for e in entries}
    assert back.to_json() == m.to_json() == (tmp_path / "sm90" / "manifest.json").read_text()  # byte for byte
    # Triton's metadata may hold tuples: written as the lists JSON reads back.
    tupled = [replace(e, cluster_dims=tuple(e.cluster_dims)) for e in entries]
    assert Manifest(m.target, "0.1.0", "3.6.0", tupled).to_json() == m.to_json()


def test_get_builds_only_the_entries_asked_for(tmp_path):
    entries = _entries()
    _write(tmp_path / "sm90", entries)
    m = read_manifest(tmp_path / "sm90")
    assert m.get(entries[2].key) == entries[2] and m.get("axpy(block=1)@nope") is None
    assert list(m._entries) == [entries[2].key]  # one Entry built
    assert m.keys() == sorted(e.key for e in entries) and m[entries[0].key] == entries[0]


def test_defaults_are_left_out_and_filled_back_in(tmp_path):
    entries = _entries()
    _write(tmp_path / "sm90", entries)
    text = (tmp_path / "sm90" / "manifest.json").read_text()
    doc = json.loads(text)
    for field in ("num_ctas", "cluster_dims", "global_scratch_size", "launch_pdl", "path"):
        for table in doc["kernels"].values():
            assert field not in table["common"] and field not in table["columns"]
    assert doc["defaults"]["cluster_dims"] == [1, 1, 1] and doc["defaults"]["launch_cooperative_grid"] is False
    e = read_manifest(tmp_path / "sm90").get(entries[0].key)
    assert (e.num_ctas, e.cluster_dims, e.global_scratch_size, e.global_scratch_align, e.launch_pdl) == (
        1, [1, 1, 1], 0, 1, False)
    assert e.path == f"bin/{e.sha256}.cubin" and e.shared == 0


def test_fields_shared_by_a_kernel_are_stored_once(tmp_path):
    entries = _entries()
    m = _write(tmp_path / "sm90", entries)
    text = (tmp_path / "sm90" / "manifest.json").read_text()
    doc = json.loads(text)
    assert text.count('"param_names"') == 2 and text.count("5" * 64) == 2  # once per kernel
    assert doc["signatures"] == [["*bf16", "*fp32", "*fp32", "i32", "*i8", "*i8"],
                                 ["*fp16", "*fp32", "*fp32", "i32", "*i8", "*i8"]]
    assert doc["divisible_sets"] == [["x", "out"], []]
    axpy = doc["kernels"]["axpy"]
    assert axpy["common"] == {"symbol": "axpy_kernel", "param_names": NAMES, "num_warps": 4, "num_stages": 2,
                              "provenance.source_sha256": "5" * 64, "provenance.triton_version": "3.6.0"}
    assert axpy["columns"] == ["sha256", "size", "signature", "divisible_set", "shared", "constexprs.BLOCK",
                               "constexprs.EVEN", "provenance.build_hash"]
    assert axpy["entries"]["axpy(block=64)@generic"] == [entries[3].sha256, 1001, 1, 1, 1024, 64, False, "b1"]
    schema_1 = json.dumps({"entries": [asdict(e) for e in entries]}, sort_keys=True, separators=(",", ":"))
    assert len(text) < len(schema_1) / 2 and ": " not in text and ", " not in text
    assert m.to_json() == text  # deterministic


def test_a_schema_1_manifest_is_refused_naming_both_sides(tmp_path):
    folder = tmp_path / "sm90"
    folder.mkdir()
    doc = {"schema_version": 1, "launch_abi": 1, "target": asdict(Target.from_name("sm90")),
           "aotc_version": "0.0.9", "triton_version": "3.5.1", "entries": [asdict(e) for e in _entries()]}
    _rewrite(folder, doc)
    with pytest.raises(ManifestError, match=r"manifest schema 1 \(written by aotc 0\.0\.9 with Triton 3\.5\.1\); "
                                            r"this loader reads schema 2\. Rebuild or pull artifacts"):
        read_manifest(folder)


A32, S64 = "axpy(block=32)@aligned", "scale(block=64)@generic"


@pytest.mark.parametrize("damage, message", [
    pytest.param(lambda d: d["kernels"]["axpy"].pop("columns"), "kernel axpy has no list 'columns'",
                 id="kernel table without columns"),
    pytest.param(lambda d: d["kernels"].update(axpy=["a", "list"]), "kernel axpy: expected an object",
                 id="kernel table not an object"),
    pytest.param(lambda d: d.pop("signatures"), "has no list 'signatures'", id="no signatures"),
    pytest.param(lambda d: _set(d, A32, "signature", 7),
                 r"entry axpy\(block=32\)@aligned has signature 7, not an index into signatures \(2 lists\)",
                 id="signature index past the table"),
    pytest.param(lambda d: _set(d, A32, "signature", "0"), "has signature '0', not an index",
                 id="signature index a string"),
    pytest.param(lambda d: _set(d, S64, "divisible_set", -1), r"scale\(block=64\)@generic has divisible_set -1",
                 id="negative divisible_set"),
    pytest.param(lambda d: _set(d, A32, "sha256", "../../../etc/evil"),
                 r"entry axpy\(block=32\)@aligned has a path outside its folder: 'bin/\.\./\.\./\.\./etc/evil\.cubin'",
                 id="sha256 that leaves bin"),
    pytest.param(lambda d: _add_path(d, A32, "/etc/passwd"), "has a path outside its folder: '/etc/passwd'",
                 id="absolute path"),
    pytest.param(lambda d: _add_path(d, A32, "bin/../../x.cubin"), "path outside its folder", id="dotdot path"),
    pytest.param(lambda d: d["kernels"]["axpy"]["entries"][A32].pop(), "does not have one value per column",
                 id="short row"),
    pytest.param(lambda d: _list_twice(d, A32, "scale"), r"axpy\(block=32\)@aligned is listed under kernel axpy "
                 "and kernel scale", id="key under two kernels"),
    pytest.param(lambda d: d["defaults"].update(path="/etc/passwd"), "defaults may name only", id="default path"),
])
def test_a_malformed_manifest_is_refused_naming_the_problem(tmp_path, damage, message):
    folder = tmp_path / "sm90"
    _write(folder, _entries())
    doc = _doc(folder)
    damage(doc)
    _rewrite(folder, doc)
    with pytest.raises(ManifestError, match=message) as err:
        read_manifest(folder)
    assert str(folder / "manifest.json") in str(err.value)


def test_a_missing_field_is_named_when_its_entry_is_built(tmp_path):
    folder = tmp_path / "sm90"
    _write(folder, _entries())
    doc = _doc(folder)
    del doc["kernels"]["scale"]["common"]["symbol"]
    _rewrite(folder, doc)
    m = read_manifest(folder)  # the checks up front cover shape, indexes and paths, not every field
    assert m.get("axpy(block=32)@aligned").symbol == "axpy_kernel"
    with pytest.raises(ManifestError, match=r"malformed manifest entry scale\(block=32\)@aligned: .*'symbol'"):
        m.get("scale(block=32)@aligned")


def _set(doc, key, field, value):
    """Give one entry its own stored value of `field` (a column of its kernel's table)."""
    table = next(t for t in doc["kernels"].values() if key in t["entries"])
    if field not in table["columns"]:
        shared = table["common"].pop(field)
        table["columns"].append(field)
        for row in table["entries"].values():
            row.append(shared)
    table["entries"][key][table["columns"].index(field)] = value


def _add_path(doc, key, path):
    table = next(t for t in doc["kernels"].values() if key in t["entries"])
    sha = table["columns"].index("sha256")
    table["columns"].append("path")
    for row in table["entries"].values():
        row.append(f"bin/{row[sha]}.cubin")
    table["entries"][key][-1] = path


def _list_twice(doc, key, kernel):
    rows = doc["kernels"][kernel]["entries"]
    rows[key] = next(iter(rows.values()))
