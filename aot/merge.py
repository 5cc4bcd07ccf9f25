"""`aotc merge OUT SHARD_DIRS...`: combine the outputs of `aotc build --shard I/N` (aot/shard.py) into
one artifacts folder whose manifest is byte for byte the one a single machine's build writes.

For each target found in the shard folders: every shard of one plan must be there, once, each with
every key of its slice in its manifest and every binary whole (sha256 checked as it is copied);
all were built by the same aotc and Triton. A target folder without a shard record is a whole
build and must be the target's only source. Binaries and build records are copied, then the
manifest is written last (atomically, under the folder's lock): OUT's previous manifest of that
target, if any, is replaced, and a later `aotc build` into OUT reuses what was merged.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from aotc.loader.manifest import MANIFEST_NAME, Entry, ManifestError, Target, read_manifest, sha256_file

from .build import atomic_write, manifest_of
from .shard import read_record


class MergeError(ValueError):
    """Shard outputs that do not make one whole build."""


@dataclass
class MergeReport:
    targets: dict[str, int] = field(default_factory=dict)  # target -> entries in its merged manifest
    manifests: list[Path] = field(default_factory=list)


def merge(out_dir: str | os.PathLike, shard_dirs: list[str | os.PathLike]) -> MergeReport:
    out_dir = Path(out_dir)
    sources: dict[str, list[Path]] = {}
    for root in map(Path, shard_dirs):
        if not root.is_dir():
            raise MergeError(f"{root}: not a folder")
        found = sorted(p for p in root.iterdir() if (p / MANIFEST_NAME).is_file())
        if not found:
            raise MergeError(f"{root}: no <target>/{MANIFEST_NAME} in it (give the --out folders of the shard builds)")
        for target_dir in found:
            if target_dir.resolve().parent == out_dir.resolve():
                raise MergeError(f"{target_dir}: a shard folder cannot be the merge's output")
            sources.setdefault(target_dir.name, []).append(target_dir)
    report = MergeReport()
    for target, dirs in sorted(sources.items()):
        entries, triton = _gather(target, dirs)
        report.manifests.append(_write(out_dir / target, dirs, entries, triton))
        report.targets[target] = len(entries)
    return report


def _gather(target: str, dirs: list[Path]) -> tuple[dict[str, tuple[Entry, Path]], str]:
    """Every entry of the target's shards, each with the folder holding its binary."""
    records = [(d, read_record(d)) for d in dirs]
    whole = [d for d, r in records if r is None]
    if whole and len(dirs) > 1:
        raise MergeError(f"{target}: {whole[0]} holds a whole build (no shard record), and {len(dirs) - 1} other "
                         f"folder(s) also hold {target}; merge shards of one build, or one whole build")
    if not whole:
        plans = {(r["count"], r["plan"]) for _, r in records}
        if len(plans) > 1:
            raise MergeError(f"{target}: the shards come from different builds (counts and plans differ: sources, "
                             f"Triton or --kernel/--from-misses were not the same): {[str(d) for d in dirs]}")
        count = records[0][1]["count"]
        seen: dict[int, Path] = {}
        for d, r in records:
            if r["index"] in seen:
                raise MergeError(f"{target}: shard {r['index']}/{count} given twice ({seen[r['index']]}, {d})")
            seen[r["index"]] = d
        missing = sorted(set(range(count)) - set(seen))
        if missing:
            raise MergeError(f"{target}: shard(s) {', '.join(f'{i}/{count}' for i in missing)} missing; "
                             f"have {', '.join(f'{i}/{count}' for i in sorted(seen))}")
    entries: dict[str, tuple[Entry, Path]] = {}
    versions = set()
    for d, r in records:
        try:
            manifest = read_manifest(d, expect_target=target)
        except ManifestError as e:
            raise MergeError(str(e)) from None
        versions.add((manifest.aotc_version, manifest.triton_version))
        by_key = manifest.by_key()
        keys = r["keys"] if r is not None else sorted(by_key)
        lacking = [k for k in keys if k not in by_key]
        if lacking:
            raise MergeError(f"{d}: shard {r['index']}/{r['count']}'s manifest lacks {len(lacking)} of its "
                             f"variants (did that build fail?), e.g. {lacking[0]}")
        for k in keys:
            entries[k] = (by_key[k], d)
    if len(versions) > 1:
        raise MergeError(f"{target}: shards built by different aotc/Triton versions {sorted(versions)}")
    return entries, versions.pop()[1]


def _write(target_dir: Path, dirs: list[Path], entries: dict[str, tuple[Entry, Path]], triton: str) -> Path:
    for entry, src in entries.values():  # every binary checked before anything is written
        if not _whole(src / entry.path, entry):
            raise MergeError(f"{src / entry.path}: missing or not the binary its manifest names for {entry.key} "
                             f"(sha256 {entry.sha256}); nothing of {target_dir.name} was written")
    target_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target_dir / ".lock")):
        for entry, src in entries.values():
            if not _whole(target_dir / entry.path, entry):
                data = (src / entry.path).read_bytes()
                if hashlib.sha256(data).hexdigest() != entry.sha256:  # changed since the check above
                    raise MergeError(f"{src / entry.path} changed while merging")
                atomic_write(target_dir / entry.path, data)
            record = src / ".records" / f"{entry.provenance.get('build_hash')}.json"
            if record.is_file():  # a later aotc build into OUT reuses the entry
                atomic_write(target_dir / ".records" / record.name, record.read_bytes())
        manifest = manifest_of(Target.from_name(target_dir.name), triton, {k: e for k, (e, _) in entries.items()})
        path = target_dir / MANIFEST_NAME
        atomic_write(path, manifest.to_json().encode())
    return path


def _whole(path: Path, entry: Entry) -> bool:
    return path.is_file() and path.stat().st_size == entry.size and sha256_file(path) == entry.sha256
