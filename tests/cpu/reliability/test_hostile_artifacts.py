"""Hostile artifacts: one table of damaged manifests and binaries, four consumers.

Every case starts from a real build of the tiny fixture family (sm90), damages one thing, then
asks `aotc verify`, `aotc list`, `aotc pull` (through the fake hub) and the loader (a Selection
launching through the fake driver) for the damaged entry. Each must refuse with a message that
names the entry (or the manifest file, for damage to the whole document), exit 1 without a
traceback (the CLI), and load nothing (no load_function call reaches the fake driver).

`aotc list` reads manifests only: it is asked about the manifest cases, not about the binaries'
bytes (that is `aotc verify`'s job). A hub repo cannot hold a symlink, a FIFO or a folder in a
file's place, so `aotc pull` is asked about the cases a repo can carry.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotc.aot.cli import cli
from aotc.kernels.registry import get_spec
from aotc.loader import artifacts, dispatch, launch, manifest_schema
from aotc.loader.manifest import MANIFEST_NAME, ManifestError

from .conftest import FakeTensor

VICTIM = "tiny_axpy(block=64,dtype=fp16)@aligned"
AXES = {"block": 64, "dtype": "fp16"}
VICTIM_RE = re.escape(VICTIM)
FILE_RE = re.escape(MANIFEST_NAME)
REPO = "org/hostile"


# -- damage ------------------------------------------------------------------------------------
def set_field(doc: dict, key: str, field: str, value) -> None:
    """Give one entry its own stored value of `field` (made a column of its kernel's table)."""
    table = next(t for t in doc["kernels"].values() if key in t["entries"])
    stored = {"params": "signature", "divisible": "divisible_set"}.get(field, field)
    if stored != field:  # an index into a top-level table: add the bad list there
        table_name = {"signature": "signatures", "divisible_set": "divisible_sets"}[stored]
        doc[table_name].append(value)
        value = len(doc[table_name]) - 1
    columns, rows = table["columns"], table["entries"]
    if stored not in columns:
        if stored == "path":  # every other row keeps the path it had
            shas = ([r[columns.index("sha256")] for r in rows.values()] if "sha256" in columns
                    else [table["common"]["sha256"]] * len(rows))
            others = [f"bin/{sha}.cubin" for sha in shas]
        elif stored not in ("constexprs", "provenance"):  # a common value becomes every row's own
            others = [table["common"].pop(stored, doc["defaults"].get(stored))] * len(rows)
        else:  # a group stored one item per name (constexprs.BLOCK) becomes one dict column, whole in every row
            items = {n: v for n, v in table["common"].items() if n.startswith(stored + ".")}
            for n in items:
                del table["common"][n]
            whole = {n.split(".", 1)[1]: v for n, v in items.items()}
            others = [dict(whole) for _ in rows]
            for n in [c for c in columns if c.startswith(stored + ".")]:
                i = columns.index(n)
                for row, other in zip(rows.values(), others):
                    other[n.split(".", 1)[1]] = row.pop(i)
                columns.pop(i)
        columns.append(stored)
        for row, other in zip(rows.values(), others):
            row.append(other)
    rows[key][columns.index(stored)] = value


def field_case(field, value, why):
    shown = repr(value) if len(repr(value)) < 40 else f"{repr(value)[:20]}...{repr(value)[-16:]}"
    return pytest.param("doc", lambda d, f=field, v=value: set_field(d, VICTIM, f, v),
                        VICTIM_RE + ".*" + why, id=f"{field}={shown}")


# Wrong types, negative and huge values for every numeric launch field.
NUMERIC = ("num_warps", "num_stages", "num_ctas", "shared", "global_scratch_size", "global_scratch_align",
           "profile_scratch_size", "profile_scratch_align", "size")
BAD_NUMBERS = {"string": "4", "float": 4.0, "bool": True, "null": None, "negative": -1, "huge": 2 ** 64,
               "nan": float("nan"), "list": [4]}
NUMERIC_CASES = [field_case(f, v, re.escape(f)) for f in NUMERIC for v in BAD_NUMBERS.values()]
OTHER_FIELD_CASES = [
    field_case("num_warps", 3, "num_warps 3 outside 1..32 or not a power of two"),
    field_case("num_warps", 64, "num_warps 64 outside"),
    field_case("num_warps", 0, "num_warps 0 outside"),
    field_case("shared", manifest_schema.MAX_SHARED + 1, "shared"),
    field_case("global_scratch_size", 2 ** 40, "global_scratch_size"),
    field_case("global_scratch_align", 48, "global_scratch_align 48 .*power of two"),
    field_case("num_ctas", 0, "num_ctas 0"),
    field_case("cluster_dims", [0, 1, 1], "cluster_dims not three integers"),
    field_case("cluster_dims", [1, 1], "cluster_dims"),
    field_case("cluster_dims", [1, 1, 2 ** 40], "cluster_dims"),
    field_case("cluster_dims", "1,1,1", "cluster_dims"),
    field_case("launch_pdl", 1, "launch_pdl not a bool"),
    field_case("launch_pdl", "false", "launch_pdl"),
    field_case("launch_cooperative_grid", None, "launch_cooperative_grid"),
    field_case("params", ["*fp16", "*fp16", "*fp16", "i32", "i32", "i32", "fp32", "*i8", "i128"],
               r"unknown parameter types \['i128'\]"),
    field_case("params", ["*fp16", "*fp16", "*fp16", "i32", "i32", "i32", "fp32", "*i8", "*../x"],
               "unknown parameter types"),
    field_case("params", ["*fp16", "i32"], "2 params but 9 param_names"),
    field_case("params", [1, 2, 3], "params not a list of names"),
    field_case("param_names", "x", "param_names not a list"),
    field_case("param_names", ["x"] * 3, "9 params but 3 param_names"),
    field_case("divisible", ["x", "nowhere"], r"divisible names \['nowhere'\], which are not parameters"),
    field_case("divisible", [7], "divisible not a list of names"),
    field_case("symbol", "", "symbol not a symbol name"),
    field_case("symbol", "tiny axpy", "symbol not a symbol name"),
    field_case("symbol", "tiny\u0000axpy", "symbol"),
    field_case("symbol", 5, "symbol"),
    field_case("symbol", "x" * 5000, "symbol"),
    field_case("sha256", "Z" * 64, "sha256 not 64 lowercase hex"),
    field_case("sha256", "ab", "sha256"),
    field_case("sha256", 12, "sha256"),
    field_case("constexprs", [1], "constexprs not a dict"),
    field_case("provenance", "x", "provenance not a dict"),
]


def _path_case(path, why, id_):
    return pytest.param("doc", lambda d: set_field(d, VICTIM, "path", path), VICTIM_RE + ".*" + why, id=id_)


PATH_CASES = [
    _path_case("bin/../../x.cubin", "path outside its folder", "path with .."),
    _path_case("../sm80/bin/x.cubin", "path outside its folder", "path into a sibling target"),
    _path_case("/etc/passwd", "path outside its folder: '/etc/passwd'", "absolute path"),
    _path_case(7, "not a string", "path not a string"),
    pytest.param("doc", lambda d: set_field(d, VICTIM, "sha256", "../../../etc/evil"),
                 VICTIM_RE + ".*path outside its folder", id="sha256 that leaves bin"),
]


def _schema(version):
    return lambda d: d.update(schema_version=version)


def _drop(name):
    return lambda d: d.pop(name)


DOC_CASES = [
    pytest.param("doc", _schema(1), "manifest schema 1", id="schema 1"),
    pytest.param("doc", _schema(3), "manifest schema 3", id="schema 3"),
    pytest.param("doc", _schema("2"), "manifest schema '2'", id="schema as a string"),
    pytest.param("doc", _drop("schema_version"), "manifest schema None", id="no schema"),
    pytest.param("doc", lambda d: d.update(launch_abi=99), "launch ABI 99", id="launch abi 99"),
    pytest.param("doc", lambda d: d.update(target={"name": "sm80", "backend": "cuda", "arch": 80, "warp_size": 32}),
                 "(manifest is for target sm80, expected sm90|manifest target is sm80|it is for target sm80)",
                 id="another target's manifest"),
    pytest.param("doc", lambda d: d.update(target="sm90"), "malformed manifest", id="target not an object"),
    pytest.param("doc", lambda d: d.update(kernels=[]), "has no dict 'kernels'", id="kernels a list"),
    pytest.param("doc", lambda d: d.update(signatures=[["*fp16"], "x"]), "signatures must hold only lists",
                 id="signature not a list"),
    pytest.param("doc", lambda d: d["kernels"]["tiny_axpy"]["entries"][VICTIM].append(1),
                 VICTIM_RE + " does not have one value per column", id="row too long"),
    pytest.param("doc", lambda d: d["kernels"]["tiny_axpy"]["entries"].update({VICTIM: "row"}),
                 VICTIM_RE + " does not have one value per column", id="row not a list"),
]


def _duplicate_row(text: str) -> str:
    """The victim's row twice in its table, the second pointing at another binary."""
    row = re.search(re.escape(json.dumps(VICTIM)) + r":\[[^\]]*\]", text).group(0)
    other = row.replace(json.loads(row.split(":", 1)[1])[0], "0" * 64)
    return text.replace(row, row + "," + other, 1)


def _duplicate_kernel(text: str) -> str:
    doc = json.loads(text)
    table = json.dumps(doc["kernels"]["tiny_axpy"])
    return text.replace('"kernels":{', '"kernels":{"tiny_axpy":' + table + ",", 1)


def _deep(text: str) -> str:
    return text[:-2] + ',"x":' + "[" * 100_000 + "]" * 100_000 + "}\n"


def _huge(text: str) -> str:
    """A 50 MB manifest: the real one plus a kernel table of made-up rows."""
    doc = json.loads(text)
    table = doc["kernels"]["tiny_axpy"]
    row = next(iter(table["entries"].values()))
    filler = dict(table, entries={f"pad({i})@aligned": row for i in range(50 * 2 ** 20 // len(json.dumps(row)))})
    doc["kernels"]["pad"] = filler
    return json.dumps(doc)


TEXT_CASES = [
    pytest.param("text", _duplicate_row, VICTIM_RE + "' appears twice", id="duplicate entry key"),
    pytest.param("text", _duplicate_kernel, "'tiny_axpy' appears twice", id="duplicate kernel table"),
    pytest.param("text", lambda t: t.replace('"schema_version":2', '"schema_version":2,"schema_version":1'),
                 "'schema_version' appears twice", id="duplicate schema_version"),
    pytest.param("text", lambda t: t[: len(t) // 2], "is not valid JSON", id="truncated manifest"),
    pytest.param("text", lambda t: "", "is not valid JSON", id="empty manifest"),
    pytest.param("text", lambda t: "[1, 2]", "expected a JSON object", id="manifest a list"),
    pytest.param("text", lambda t: "\ufeff" + t, "is not valid JSON", id="byte order mark"),
    pytest.param("bytes", lambda t: b"\xff\xfe" + t.encode(), "is not valid JSON", id="not utf-8"),
    pytest.param("text", _deep, "is not valid JSON: RecursionError", id="nested 100000 deep"),
    pytest.param("text", _huge, "not a manifest aotc wrote", id="50 MB manifest"),
]


def _victim_file(folder: Path) -> Path:
    from aotc.loader.manifest import read_manifest

    return folder / read_manifest(folder).get(VICTIM).path


def _flip(folder):
    p = _victim_file(folder)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x40
    p.write_bytes(bytes(data))


def _truncate(folder):
    p = _victim_file(folder)
    p.write_bytes(p.read_bytes()[:-100])


def _empty(folder):
    _victim_file(folder).write_bytes(b"")


def _append(folder):
    p = _victim_file(folder)
    p.write_bytes(p.read_bytes() + b"\0")


def _remove(folder):
    _victim_file(folder).unlink()


def _symlink(transform):
    def damage(folder):
        p = _victim_file(folder)
        outside = folder.parent.parent / "outside.cubin"
        outside.write_bytes(transform(p.read_bytes()))
        p.unlink()
        p.symlink_to(outside)
    return damage


def _symlink_to(target):
    def damage(folder):
        p = _victim_file(folder)
        p.unlink()
        p.symlink_to(target)
    return damage


def _loop(folder):
    p = _victim_file(folder)
    p.unlink()
    p.symlink_to(p.with_name("loop.cubin"))
    p.with_name("loop.cubin").symlink_to(p)


def _fifo(folder):
    p = _victim_file(folder)
    p.unlink()
    os.mkfifo(p)


def _folder_in_place(folder):
    p = _victim_file(folder)
    p.unlink()
    p.mkdir()


def _symlinked_bin(folder):
    """The whole bin/ folder a symlink to a copy outside the target folder."""
    outside = folder.parent.parent / "outside-bin"
    shutil.copytree(folder / "bin", outside)
    shutil.rmtree(folder / "bin")
    (folder / "bin").symlink_to(outside)


FILE_CASES = [
    pytest.param("file", _flip, VICTIM_RE + ".*sha256", id="sha256 mismatch"),
    pytest.param("file", _truncate, VICTIM_RE + ".*bytes", id="truncated binary"),
    pytest.param("file", _empty, VICTIM_RE + ".*bytes", id="empty binary"),
    pytest.param("file", _append, VICTIM_RE + ".*bytes", id="binary one byte longer"),
    pytest.param("file", _remove, VICTIM_RE + ".*missing", id="missing binary"),
    pytest.param("local", _symlink(lambda b: b), VICTIM_RE + ".*(leads outside)", id="symlink out, same bytes"),
    pytest.param("local", _symlink(lambda b: b[::-1]), VICTIM_RE + ".*(leads outside)",
                 id="symlink out, other bytes"),
    pytest.param("local", _symlink_to("/dev/zero"), VICTIM_RE + ".*(leads outside)", id="symlink to /dev/zero"),
    pytest.param("local", _symlink_to("../../../outside-nothing"), VICTIM_RE + ".*(leads outside)",
                 id="dangling symlink out"),
    pytest.param("local", _loop, VICTIM_RE + ".*(not a regular file|cannot be read)", id="symlink loop"),
    pytest.param("local", _fifo, VICTIM_RE + ".*not a regular file", id="fifo in place of a binary"),
    pytest.param("local", _folder_in_place, VICTIM_RE + ".*not a regular file", id="folder in place of a binary"),
    pytest.param("local", _symlinked_bin, VICTIM_RE + ".*leads outside", id="bin folder a symlink out"),
]

ALL_CASES = NUMERIC_CASES + OTHER_FIELD_CASES + PATH_CASES + DOC_CASES + TEXT_CASES + FILE_CASES
MANIFEST_KINDS = ("doc", "text", "bytes")


def damaged_root(tiny_artifacts: Path, tmp_path: Path, kind: str, damage) -> Path:
    root = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts / "sm90", root / "sm90")
    folder = root / "sm90"
    path = folder / MANIFEST_NAME
    if kind == "doc":
        doc = json.loads(path.read_text())
        damage(doc)
        path.write_text(json.dumps(doc, separators=(",", ":")))
    elif kind == "text":
        path.write_text(damage(path.read_text()))
    elif kind == "bytes":
        path.write_bytes(damage(path.read_text()))
    else:
        damage(folder)
    return root


def run_cli(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    # A refusal is sys.exit(1) or a ClickException (exit 1); anything else escaped as a traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, result.output


# -- consumers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, damage, message", ALL_CASES)
def test_verify_refuses_naming_the_entry(tiny_artifacts, tmp_path, kind, damage, message):
    root = damaged_root(tiny_artifacts, tmp_path, kind, damage)
    code, out = run_cli("verify", root)
    assert code == 1 and re.search(message, out, re.S), out


@pytest.mark.parametrize("kind, damage, message", [c for c in ALL_CASES if c.values[0] in MANIFEST_KINDS])
def test_list_refuses_naming_the_entry(tiny_artifacts, tmp_path, kind, damage, message):
    root = damaged_root(tiny_artifacts, tmp_path, kind, damage)
    for extra in ((), ("--json",)):
        code, out = run_cli("list", root, *extra)
        assert code == 1 and re.search(message, out.replace("\\", "") if extra else out, re.S), out


@pytest.mark.parametrize("kind, damage, message", ALL_CASES)
def test_loader_refuses_and_loads_nothing(tiny_artifacts, tmp_path, fake_driver, kind, damage, message):
    root = damaged_root(tiny_artifacts, tmp_path, kind, damage)
    artifacts.set_artifacts(root)
    try:
        with pytest.raises(ManifestError, match=message):
            target = artifacts.load_target((9, 0))
            sel = dispatch.Selection(get_spec("tiny_axpy"), AXES, 0, target, (9, 0))
            sel.launch((1, 1, 1), [FakeTensor(0x1000), FakeTensor(0x2000), FakeTensor(0x3000), 16, 1, 1, 1.0], 0)
    finally:
        artifacts.set_artifacts(None)
    assert fake_driver.loaded == [] and fake_driver.launches == []


PULL_CASES = [c for c in ALL_CASES if c.values[0] != "local"
              and not (c.id.startswith(NUMERIC) and c.id.split("=")[1] not in ("'4'", "-1"))]


@pytest.mark.parametrize("kind, damage, message", PULL_CASES)
def test_pull_refuses_naming_the_entry(hub, tiny_artifacts, tmp_path, kind, damage, message):
    root = damaged_root(tiny_artifacts, tmp_path, kind, damage)
    files = {f"sm90/{p.relative_to(root / 'sm90')}": p.read_bytes() for p in (root / "sm90").rglob("*")
             if p.is_file()}
    hub.repos[REPO] = {"branches": {}, "commits": {}}
    sha = hub.commit(REPO, "main", files, "hostile")
    out_dir = tmp_path / "pulled"
    code, out = run_cli("pull", "--repo", REPO, "--revision", sha, "--arch", "sm90", "--out", out_dir)
    assert code == 1 and re.search(message, out, re.S), out
    assert not (out_dir / "sm90").exists()  # nothing half-copied where the loader would look


def test_verify_names_every_malformed_entry_and_checks_the_rest(tiny_artifacts, tmp_path):
    """Three damaged entries of one target: `aotc verify` names all three (not only the first it
    meets) and still checks the good entries' files."""
    def damage(doc):
        keys = sorted(k for t in doc["kernels"].values() for k in t["entries"])
        others = [k for k in keys if k != VICTIM]
        set_field(doc, VICTIM, "num_warps", 3)
        set_field(doc, others[0], "symbol", "")
        set_field(doc, others[-1], "sha256", "ab")
        damage.named = (VICTIM, others[0], others[-1])
    root = damaged_root(tiny_artifacts, tmp_path, "doc", damage)
    code, out = run_cli("verify", root)
    assert code == 1 and "3 problems" in out, out
    for key in damage.named:
        assert f"malformed manifest entry {key}" in out, (key, out)


# -- the table itself --------------------------------------------------------------------------
def test_the_good_build_passes_every_consumer(tiny_artifacts, tmp_path, fake_driver):
    """The control: the undamaged copy is accepted by all four, so each refusal above is the damage's."""
    root = damaged_root(tiny_artifacts, tmp_path, "doc", lambda d: None)
    assert run_cli("verify", root)[0] == 0 and run_cli("list", root)[0] == 0
    artifacts.set_artifacts(root)
    try:
        sel = dispatch.Selection(get_spec("tiny_axpy"), AXES, 0, artifacts.load_target((9, 0)), (9, 0))
        sel.launch((1, 1, 1), [FakeTensor(0x1000), FakeTensor(0x2000), FakeTensor(0x3000), 16, 1, 1, 1.0], 0)
    finally:
        artifacts.set_artifacts(None)
    assert len(fake_driver.loaded) == 1 and len(fake_driver.launches) == 1


def test_the_manifest_knows_every_parameter_type_the_launcher_packs():
    assert set(manifest_schema.SCALAR_PARAMS) == set(launch._SLOT_FORMAT)


def test_case_counts():
    """The figures README's RELIABILITY section quotes."""
    assert len(ALL_CASES) == len({c.id for c in ALL_CASES})
    print(f"\nhostile artifact cases: {len(ALL_CASES)} (launch fields {len(NUMERIC_CASES) + len(OTHER_FIELD_CASES)}, "
          f"paths {len(PATH_CASES)}, documents {len(DOC_CASES) + len(TEXT_CASES)}, binaries {len(FILE_CASES)}); "
          f"pull {len(PULL_CASES)}")
