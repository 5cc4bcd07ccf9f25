"""The artifact manifest: its schema, reading it safely, and checking files against it.

`DIR/<target>/manifest.json` lists every binary of one target with what the loader needs to
launch it. JSON only, never pickle. The build (aotc.aot) writes it through `Manifest.to_json`;
the loader, `aotc verify` and the hub code read it through `read_manifest`. Schema 2 stores the
entries as one table per kernel (layout in manifest_schema.py); `Entry` objects are built only
for the keys asked for.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import manifest_schema, targets

SCHEMA_VERSION = 2  # 2: one table per kernel, fields shared by its entries stored once
# Bumped whenever the way a binary is launched changes (parameter list, scratch pointers...).
# Triton 3.6: declared runtime args, then the global and profile scratch pointers.
LAUNCH_ABI = 1
MANIFEST_NAME = "manifest.json"
# Everything a schema-2 document holds; anything else is refused, not ignored.
TOP_LEVEL = frozenset({"schema_version", "launch_abi", "target", "aotc_version", "triton_version", "defaults",
                       "signatures", "divisible_sets", "kernels"})
# A full two-target build's manifest is about 100 KB a target; a file 160x that is not ours, and
# parsing it would cost the loader's first call seconds and hundreds of MB.
MAX_MANIFEST_BYTES = 16 << 20


class ManifestError(ValueError):
    """A manifest that is missing, malformed or built for something this loader cannot run."""


@dataclass(frozen=True)
class Target:
    """A manifest's record of its target: the row of loader/targets.py it was built for."""

    name: str  # folder name, e.g. "sm90", "gfx942"
    backend: str  # "cuda", "hip", "corex"
    arch: int | str  # Triton's GPUTarget arch: 90, "gfx942"
    warp_size: int = 32

    @staticmethod
    def from_name(name: str) -> "Target":
        info = targets.get(name)
        return Target(info.name, info.backend, info.arch, info.warp_size)

    @property
    def info(self) -> targets.TargetInfo:
        return targets.get(self.name)

    def mismatch(self) -> str | None:
        """Why this record is not the table's target of its name (a manifest for one target
        relabelled as another), or None."""
        try:
            want = Target.from_name(self.name)
        except ValueError as e:
            return str(e)
        if self != want:
            return (f"it records target {self.name} as backend {self.backend!r}, arch {self.arch!r}, warp size "
                    f"{self.warp_size}; {self.name} is backend {want.backend!r}, arch {want.arch!r}, warp size "
                    f"{want.warp_size}")
        return None


@dataclass(frozen=True)
class Entry:
    """One binary and everything needed to launch it."""

    kernel: str
    key: str  # VariantKey string
    path: str  # relative to the target folder
    sha256: str
    size: int
    symbol: str
    params: list  # Triton types of the cubin's params in order, scratch pointers included
    param_names: list
    divisible: list  # param names compiled with tt.divisibility=16
    num_warps: int
    num_stages: int
    num_ctas: int
    cluster_dims: list
    shared: int
    global_scratch_size: int
    global_scratch_align: int
    profile_scratch_size: int
    profile_scratch_align: int
    launch_cooperative_grid: bool
    launch_pdl: bool
    constexprs: dict
    provenance: dict = field(default_factory=dict)  # source hash, build hash, Triton's own hash


class Manifest:
    """A target's manifest. Entries are built lazily: `get(key)` builds one `Entry`, so the
    loader's first call pays for the JSON parse only, not for every entry of every kernel."""

    def __init__(self, target: Target, aotc_version: str, triton_version: str, entries=None,
                 schema_version: int = SCHEMA_VERSION, launch_abi: int = LAUNCH_ABI,
                 tables: manifest_schema.KernelTables | None = None):
        self.target = target
        self.aotc_version = aotc_version
        self.triton_version = triton_version
        self.schema_version = schema_version
        self.launch_abi = launch_abi
        self._tables = tables  # rows of a read manifest not yet turned into Entry objects
        self._entries: dict[str, Entry] = {e.key: e for e in entries or ()}

    def get(self, key: str) -> Entry | None:
        e = self._entries.get(key)
        if e is None and self._tables is not None:
            fields = self._tables.fields(key)
            if fields is not None:
                why = manifest_schema.entry_problem(fields)
                if why is not None:
                    raise ManifestError(f"malformed manifest entry {key}: {why}")
                try:
                    e = self._entries[key] = Entry(**fields)
                except TypeError as err:
                    raise ManifestError(f"malformed manifest entry {key}: {err}") from None
        return e

    def __eq__(self, other) -> bool:
        if not isinstance(other, Manifest):
            return NotImplemented
        return (self.target, self.aotc_version, self.triton_version, self.schema_version, self.launch_abi,
                self.entries) == (other.target, other.aotc_version, other.triton_version,
                                  other.schema_version, other.launch_abi, other.entries)

    def __getitem__(self, key: str) -> Entry:
        e = self.get(key)
        if e is None:
            raise KeyError(key)
        return e

    def keys(self) -> list[str]:
        return sorted(self._entries.keys() | (self._tables.where.keys() if self._tables else set()))

    @property
    def entries(self) -> list[Entry]:
        return [self.get(k) for k in self.keys()]

    def checked_entries(self) -> tuple[list[Entry], list[str]]:
        """(every well-formed entry, one message per malformed one): for `aotc verify`, which names
        every bad entry; `entries` stops at the first."""
        good, bad = [], []
        for k in self.keys():
            try:
                good.append(self.get(k))
            except ManifestError as e:
                bad.append(str(e))
        return good, bad

    def by_key(self) -> dict[str, Entry]:
        return {e.key: e for e in self.entries}

    def to_json(self) -> str:
        doc = {
            "schema_version": self.schema_version,
            "launch_abi": self.launch_abi,
            "target": asdict(self.target),
            "aotc_version": self.aotc_version,
            "triton_version": self.triton_version,
            **manifest_schema.encode([asdict(e) for e in self.entries]),
        }
        # Compact: the loader parses this on its first call (280-entry sm90 build: read_manifest + two
        # gets ~0.8 ms in a fresh process, schema 1 took 3.6-5.8 ms).
        return json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n"


def read_manifest(target_dir: str | os.PathLike, expect_target: str | None = None) -> Manifest:
    """Read and check `target_dir/manifest.json`; refuse what this loader cannot launch."""
    path = Path(target_dir) / MANIFEST_NAME
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST_BYTES or not path.is_file():
            raise ManifestError(f"{path}: not a manifest aotc wrote ({size} bytes, a regular file of at most "
                                f"{MAX_MANIFEST_BYTES} expected); refusing to parse it")
        doc = json.loads(path.read_text(), object_pairs_hook=_unique_keys)
    except FileNotFoundError:
        raise ManifestError(f"no manifest at {path}") from None
    except OSError as e:  # no permission (a build by another user), a folder in its place
        raise ManifestError(f"{path} cannot be read ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError, _DuplicateKey, RecursionError) as e:
        raise ManifestError(f"{path} is not valid JSON: {type(e).__name__ if isinstance(e, RecursionError) else ''}"
                            f"{e}") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{path}: expected a JSON object")
    built_by = f"aotc {_shown(doc.get('aotc_version'))} with Triton {_shown(doc.get('triton_version'))}"
    # type() is: 2.0 == 2 and True == 1, and neither is what a writer of this schema writes
    if type(doc.get("schema_version")) is not int or doc["schema_version"] != SCHEMA_VERSION:
        raise ManifestError(
            f"{path}: manifest schema {doc.get('schema_version')!r} (written by {built_by}); "
            f"this loader reads schema {SCHEMA_VERSION}. Rebuild or pull artifacts for this aotc version."
        )
    if type(doc.get("launch_abi")) is not int or doc["launch_abi"] != LAUNCH_ABI:
        raise ManifestError(
            f"{path}: launch ABI {doc.get('launch_abi')!r} (built by {built_by}); this loader "
            f"launches ABI {LAUNCH_ABI}. Rebuild with this aotc version."
        )
    unknown = doc.keys() - TOP_LEVEL
    if unknown:
        names = ", ".join(sorted(map(repr, unknown)))
        raise ManifestError(f"{path}: malformed manifest (unknown top-level fields {names}; "
                            f"schema {SCHEMA_VERSION} has {sorted(TOP_LEVEL)})")
    for name in ("aotc_version", "triton_version"):
        why = manifest_schema.text_problem(doc.get(name, "?"), 64)
        if why:
            raise ManifestError(f"{path}: malformed manifest ({name} {why})")
    try:
        target = _target(doc["target"])
        tables = manifest_schema.KernelTables(doc)
    except (KeyError, TypeError, ValueError) as e:
        raise ManifestError(f"{path}: malformed manifest ({e})") from None
    if expect_target is not None and target.name != expect_target:
        raise ManifestError(f"{path}: manifest is for target {target.name}, expected {expect_target}; "
                            f"refusing to load {target.backend} binaries built for {target.name} here")
    why = target.mismatch()
    if why is not None:
        raise ManifestError(f"{path}: refusing this manifest: {why}")
    return Manifest(target, doc.get("aotc_version", "?"), doc.get("triton_version", "?"), None,
                    doc["schema_version"], doc["launch_abi"], tables=tables)


def _shown(version) -> str:
    """A version for an error message: a printable string as it is, anything else as its repr."""
    return version if manifest_schema.text_problem(version, 64) is None else "?" if version is None else repr(version)


def _target(record) -> Target:
    """The manifest's target record, its fields of the types Target declares (90.0 and True would
    compare equal to the table's 90 and 1); TypeError/ValueError otherwise."""
    if not isinstance(record, dict) or record.keys() != {"name", "backend", "arch", "warp_size"}:
        raise ValueError(f"target must be an object of name, backend, arch and warp_size, got {record!r:.200}")
    types = {"name": (str,), "backend": (str,), "arch": (int, str), "warp_size": (int,)}
    for name, kinds in types.items():
        if type(record[name]) not in kinds:
            raise ValueError(f"target {name} {record[name]!r:.80} is not a {' or '.join(k.__name__ for k in kinds)}")
        if type(record[name]) is str and manifest_schema.text_problem(record[name], 64):
            raise ValueError(f"target {name} {manifest_schema.text_problem(record[name], 64)}")
    return Target(**record)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list) -> dict:
    """json's object hook: a key given twice (two rows for one variant) is refused, not last-wins.
    Costs about 0.2 ms on a 75 KB manifest (0.9 -> 1.1 ms on the loaded 2-core CPU machine)."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _DuplicateKey(f"key {twice!r} appears twice in one object")
    return d


def escapes(target_dir: str | os.PathLike, file: str | os.PathLike) -> bool:
    """Whether `file` (under `target_dir`) resolves outside the target folder, through a symlink.
    The Hugging Face cache links snapshots/<commit>/<target>/... to the repo's blobs/ folder: a
    link there is inside too."""
    folder = os.path.realpath(target_dir)
    real = os.path.realpath(file)
    inside = [folder]
    snapshot = Path(folder).parent
    if snapshot.parent.name == "snapshots":
        inside.append(str(snapshot.parent.parent / "blobs"))
    return not any(real.startswith(root + os.sep) for root in inside)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_files(target_dir: str | os.PathLike, manifest: Manifest | None = None,
                 entries: list[Entry] | None = None) -> list[str]:
    """One message per missing, truncated or altered file; empty when every file is good.
    `entries` (already checked) stands in for the manifest's."""
    target_dir = Path(target_dir)
    if entries is None and manifest is not None:
        entries = manifest.entries  # the caller's manifest: a malformed entry is the caller's to report
    elif entries is None:
        try:
            entries = read_manifest(target_dir).entries
        except ManifestError as e:
            return [str(e)]
    problems = []
    for path, group in _group_by_path(entries).items():
        keys = ", ".join(e.key for e in group)
        file = target_dir / path
        if escapes(target_dir, file):
            problems.append(f"{keys}: {path} leads outside {target_dir} (a symlink to "
                            f"{os.path.realpath(file)}); refusing it")
            continue
        if not file.is_file():
            what = "is not a regular file" if os.path.lexists(file) else "is missing"
            problems.append(f"{keys}: {path} {what}")
            continue
        expected = group[0]
        size = file.stat().st_size
        if size != expected.size:
            problems.append(f"{keys}: {path} has {size} bytes, manifest says {expected.size}")
            continue
        try:
            digest = sha256_file(file)
        except OSError as e:  # no permission: named, not a traceback
            problems.append(f"{keys}: {path} cannot be read ({e.strerror})")
            continue
        if digest != expected.sha256:
            problems.append(f"{keys}: {path} sha256 {digest} != manifest {expected.sha256}")
    return problems


def _group_by_path(entries: list[Entry]) -> dict[str, list[Entry]]:
    out: dict[str, list[Entry]] = {}
    for e in entries:
        out.setdefault(e.path, []).append(e)
    return out
