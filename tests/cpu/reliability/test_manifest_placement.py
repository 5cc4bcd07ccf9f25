"""Every manifest field stored every way a kernel table can store it, and the malformed names,
numbers and documents of issue 37 (class 1), asked of the four consumers of
test_hostile_artifacts.py: `aotc verify`, `aotc list`, `aotc pull` (the fake hub) and the loader.

Placements of one field of the tiny fixture's table (built for sm90):
  common      every entry's value stored once;         column     one value a row;
  both        common AND a column (any values);         duplicated two columns of one name.
A good value in `common` (where all rows agree) or in a `column` must be accepted by every
consumer and read back as the build wrote it; a bad value must be refused naming the field;
`both` and `duplicated` are refused whatever the values (the schema check once read one place and
the loader the other: checked must be used).
"""
from __future__ import annotations

import json
import re
import shutil

import pytest

from aotc.kernels.registry import get_spec
from aotc.loader import artifacts, dispatch, manifest_schema
from aotc.loader.manifest import MANIFEST_NAME, Entry, ManifestError, read_manifest

from .conftest import FakeTensor
from .test_hostile_artifacts import AXES, REPO, VICTIM, VICTIM_RE, run_cli

KERNEL = "tiny_axpy"
# A value each field's check refuses (entry_problem, or the table's index and path checks).
BAD = {"path": "../x.cubin", "sha256": "ab", "size": -1, "symbol": "", "param_names": "x", "signature": 99,
       "divisible_set": 99, "num_warps": 3, "num_stages": -1, "num_ctas": 0, "cluster_dims": [0, 1, 1],
       "shared": -1, "global_scratch_size": -1, "global_scratch_align": 3, "profile_scratch_size": -1,
       "profile_scratch_align": 3, "launch_cooperative_grid": 1, "launch_pdl": "no", "constexprs": [1],
       "provenance": "x"}
ITEMS = ("constexprs.BLOCK", "constexprs.SCALE_Y", "provenance.build_hash")  # one item of a group, by name
FIELDS = sorted(manifest_schema.STORED) + list(ITEMS)


def _why(field: str) -> str:
    if field in ("signature", "divisible_set"):
        return f"has {field} 99, not an index"
    if field == "path":
        return "path outside its folder"
    return re.escape(field)


def _rows(doc: dict) -> dict:
    return doc["kernels"][KERNEL]["entries"]


def _take(doc: dict, field: str) -> dict:
    """Remove `field` from the table wherever it is stored; returns every row's value of it."""
    table = doc["kernels"][KERNEL]
    common, columns, rows = table["common"], table["columns"], table["entries"]
    if field in manifest_schema.GROUPS:  # stored one item per name: gather each row's whole dict
        values = {k: {} for k in rows}
        for name in [n for n in common if n.startswith(field + ".")]:
            for k in rows:
                values[k][name.split(".", 1)[1]] = common[name]
            del common[name]
        for name in [n for n in columns if n.startswith(field + ".")]:
            column = _take(doc, name)
            for k in rows:
                values[k][name.split(".", 1)[1]] = column[k]
        return values
    if field in common:
        value = common.pop(field)
        return {k: value for k in rows}
    if field in columns:
        i = columns.index(field)
        columns.pop(i)
        return {k: r.pop(i) for k, r in rows.items()}
    if field == "path":
        sha = _take(doc, "sha256")
        _put_column(doc, "sha256", sha)
        return {k: manifest_schema.default_path(s) for k, s in sha.items()}
    return {k: doc["defaults"][field] for k in rows}


def _put_column(doc: dict, field: str, values: dict) -> None:
    table = doc["kernels"][KERNEL]
    table["columns"].append(field)
    for k, r in table["entries"].items():
        r.append(values[k])


def place(field: str, placement: str, victim_value=None):
    """A damage(doc) storing `field` by `placement`, the victim's value `victim_value` (None: its own)."""
    def damage(doc):
        values = _take(doc, field)
        mine = values[VICTIM] if victim_value is None else victim_value
        table = doc["kernels"][KERNEL]
        if placement == "common":
            table["common"][field] = mine
        elif placement == "column":
            _put_column(doc, field, {**values, VICTIM: mine})
        elif placement == "both":  # the other rows' value in common, the victim's own in a column
            table["common"][field] = next(v for k, v in values.items() if k != VICTIM)
            _put_column(doc, field, {**values, VICTIM: mine})
        elif placement == "duplicated":  # the good value first, the victim's last
            _put_column(doc, field, values)
            _put_column(doc, field, {**values, VICTIM: mine})
    return damage


def _all_equal(tiny_doc: dict, field: str) -> bool:
    doc = json.loads(json.dumps(tiny_doc))
    return len({json.dumps(v, sort_keys=True) for v in _take(doc, field).values()}) == 1


GOOD = [(f, p) for f in FIELDS for p in ("common", "column")]
REFUSED = ([pytest.param(place(f, p, BAD[f]), ("" if p == "common" else VICTIM_RE + ".*") + _why(f),
                         id=f"{f} bad in {p}") for f in sorted(BAD) for p in ("common", "column")]
           + [pytest.param(place(f, "both"), f"field {re.escape(repr(f))} is both common and a column",
                           id=f"{f} both") for f in FIELDS]
           + [pytest.param(place(f, "duplicated"), f"column {re.escape(repr(f))} is listed twice",
                           id=f"{f} duplicated") for f in FIELDS])


# -- the malformed classes ---------------------------------------------------------------------
def _column_named(name, value=1):
    def damage(doc):
        _put_column(doc, name, {k: value for k in _rows(doc)})
    return damage


def _victim_path(path):
    def damage(doc):
        values = _take(doc, "path")
        _put_column(doc, "path", {**values, VICTIM: path})
    return damage


def _victim_index(field, value):
    def damage(doc):
        values = _take(doc, field)
        _put_column(doc, field, {**values, VICTIM: value})
    return damage


def _rename_victim(key):
    def damage(doc):
        rows = _rows(doc)
        rows[key] = rows.pop(VICTIM)
    return damage


def _rename_kernel(name):
    return lambda doc: doc["kernels"].update({name: doc["kernels"].pop(KERNEL)})


def _top(**fields):
    return lambda doc: doc.update(fields)


def _target(**fields):
    return lambda doc: doc["target"].update(fields)


MALFORMED = [
    pytest.param(_column_named(5), "column name not a string: 5", id="column name an int"),
    pytest.param(_column_named(None), "column name not a string: None", id="column name null"),
    pytest.param(_column_named("bogus"), "not a field of an entry: 'bogus'", id="unknown column"),
    pytest.param(_column_named("kernel", "other"), "not a field of an entry: 'kernel'", id="column 'kernel'"),
    pytest.param(_column_named("key", "other"), "not a field of an entry: 'key'", id="column 'key'"),
    pytest.param(_column_named("constexprs."), "not a field of an entry", id="column of an empty item"),
    pytest.param(lambda d: d["kernels"][KERNEL]["common"].update(bogus=1), "not a field of an entry: 'bogus'",
                 id="unknown common field"),
    pytest.param(lambda d: d["kernels"][KERNEL].update(extra=1), "unknown table fields", id="unknown table field"),
    pytest.param(lambda d: d["kernels"][KERNEL]["common"].update(constexprs={"BLOCK": 1}),
                 "'constexprs' is stored both whole and one item per name", id="group whole and by item"),
    pytest.param(_victim_path("bin/x\u0000.cubin"), VICTIM_RE + ".*unprintable", id="path with NUL"),
    pytest.param(_victim_path("bin/\ud800.cubin"), VICTIM_RE + ".*unprintable", id="path with a lone surrogate"),
    pytest.param(_victim_path("bin/x\n.cubin"), VICTIM_RE + ".*unprintable", id="path with a newline"),
    pytest.param(_victim_path("bin/" + "a" * 4996), VICTIM_RE + ".*5000 characters", id="path of 5000 characters"),
    pytest.param(_victim_path("bin/" + "a" * 300 + ".cubin"), VICTIM_RE + ".*over 255 bytes",
                 id="path component of 300 characters"),
    pytest.param(_victim_path("bin//x.cubin"), VICTIM_RE + ".*path outside its folder", id="path with //"),
    pytest.param(_victim_path("./bin/x.cubin"), VICTIM_RE + ".*path outside its folder", id="path with ./"),
    pytest.param(_victim_path(""), VICTIM_RE + ".*0 characters", id="empty path"),
    pytest.param(_victim_index("signature", 1.0), VICTIM_RE + ".*has signature 1.0, not an index",
                 id="signature index 1.0"),
    pytest.param(_victim_index("signature", True), VICTIM_RE + ".*has signature True, not an index",
                 id="signature index true"),
    pytest.param(_victim_index("divisible_set", -1), VICTIM_RE + ".*has divisible_set -1", id="divisible_set -1"),
    pytest.param(_victim_index("divisible_set", 2 ** 70), VICTIM_RE + ".*has divisible_set", id="divisible_set 2**70"),
    pytest.param(_victim_index("signature", None), VICTIM_RE + ".*has signature None", id="signature null"),
    pytest.param(_rename_victim("tiny\u0000axpy@aligned"), r"entry key unprintable.*\\x00", id="entry key with NUL"),
    pytest.param(_rename_victim("tiny\ud800@aligned"), r"entry key unprintable.*\\ud800",
                 id="entry key with a lone surrogate"),
    pytest.param(_rename_victim("k" * 5000), "entry key 5000 characters", id="entry key of 5000 characters"),
    pytest.param(_rename_kernel("tiny\ud800"), r"kernel name unprintable.*\\ud800", id="kernel name with a surrogate"),
    pytest.param(_top(schema_version=2.0), "manifest schema 2.0", id="schema_version 2.0"),
    pytest.param(_top(schema_version=True), "manifest schema True", id="schema_version true"),
    pytest.param(_top(launch_abi=True), "launch ABI True", id="launch_abi true"),
    pytest.param(_top(launch_abi=1.0), "launch ABI 1.0", id="launch_abi 1.0"),
    pytest.param(_top(extra={"x": 1}), "unknown top-level fields 'extra'", id="unknown top-level field"),
    pytest.param(_top(aotc_version=7), "aotc_version not a string", id="aotc_version an int"),
    pytest.param(_top(triton_version="3.6\u0000"), "triton_version unprintable", id="triton_version with NUL"),
    pytest.param(_target(arch=90.0), "target arch 90.0 is not a int or str", id="target arch 90.0"),
    pytest.param(_target(warp_size=True), "target warp_size True is not a int", id="target warp_size true"),
    pytest.param(_target(extra=1), "target must be an object of name, backend, arch and warp_size",
                 id="target with an extra field"),
]
CASES = REFUSED + MALFORMED


# -- the consumers -----------------------------------------------------------------------------
def _root(tiny_artifacts, tmp_path, damage):
    root = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts / "sm90", root / "sm90")
    path = root / "sm90" / MANIFEST_NAME
    doc = json.loads(path.read_text())
    damage(doc)
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return root


def _launch_victim(root):
    artifacts.set_artifacts(root)
    try:
        target = artifacts.load_target((9, 0))
        sel = dispatch.Selection(get_spec(KERNEL), AXES, 0, target, (9, 0))
        sel.launch((1, 1, 1), [FakeTensor(0x1000), FakeTensor(0x2000), FakeTensor(0x3000), 16, 1, 1, 1.0], 0)
        return target.manifest.get(VICTIM)
    finally:
        artifacts.set_artifacts(None)


@pytest.fixture(scope="module")
def tiny_doc(tiny_artifacts):
    return json.loads((tiny_artifacts / "sm90" / MANIFEST_NAME).read_text())


@pytest.mark.parametrize("field, placement", GOOD, ids=[f"{f} in {p}" for f, p in GOOD])
def test_a_good_value_is_read_back_wherever_it_is_stored(tiny_artifacts, tiny_doc, tmp_path, fake_driver, field,
                                                         placement):
    if placement == "common" and not _all_equal(tiny_doc, field):
        pytest.skip(f"the build's entries differ in {field}: one common value would be a different manifest")
    root = _root(tiny_artifacts, tmp_path, place(field, placement))
    assert run_cli("verify", root)[0] == 0 and run_cli("list", root)[0] == 0
    want: Entry = read_manifest(tiny_artifacts / "sm90").get(VICTIM)
    assert _launch_victim(root) == want
    assert len(fake_driver.loaded) == 1 and len(fake_driver.launches) == 1


@pytest.mark.parametrize("damage, message", CASES)
def test_verify_and_list_refuse_naming_the_field(tiny_artifacts, tmp_path, damage, message):
    root = _root(tiny_artifacts, tmp_path, damage)
    code, out = run_cli("verify", root)
    assert code == 1 and re.search(message, out, re.S), out
    for extra in ((), ("--json",)):
        code, out = run_cli("list", root, *extra)
        assert code == 1 and re.search(message, out.replace("\\\\", "\\") if extra else out, re.S), out


@pytest.mark.parametrize("damage, message", CASES)
def test_the_loader_refuses_and_loads_nothing(tiny_artifacts, tmp_path, fake_driver, damage, message):
    root = _root(tiny_artifacts, tmp_path, damage)
    with pytest.raises(ManifestError, match=message):
        _launch_victim(root)
    assert fake_driver.loaded == [] and fake_driver.launches == []


@pytest.mark.parametrize("damage, message", CASES)
def test_pull_refuses_naming_the_field(hub, tiny_artifacts, tmp_path, damage, message):
    root = _root(tiny_artifacts, tmp_path, damage)
    files = {f"sm90/{p.relative_to(root / 'sm90')}": p.read_bytes() for p in (root / "sm90").rglob("*")
             if p.is_file()}
    hub.repos[REPO] = {"branches": {}, "commits": {}}
    sha = hub.commit(REPO, "main", files, "placement")
    out_dir = tmp_path / "pulled"
    code, out = run_cli("pull", "--repo", REPO, "--revision", sha, "--arch", "sm90", "--out", out_dir)
    assert code == 1 and re.search(message, out, re.S), out
    assert not (out_dir / "sm90").exists()


def test_every_stored_field_has_a_bad_value_and_is_an_entry_field():
    """A field added to Entry must get a case here, and STORED must follow Entry."""
    assert set(BAD) == manifest_schema.STORED
    fields = set(Entry.__dataclass_fields__) - {"kernel", "key", "params", "divisible"}
    assert manifest_schema.STORED == fields | {"signature", "divisible_set"}


def test_case_counts():
    print(f"\nmanifest placement cases: {len(GOOD)} good, {len(REFUSED)} refused placements, "
          f"{len(MALFORMED)} malformed")
