"""`aotc list` and `aotc verify`: read an artifacts folder and check every binary against its manifest."""
from __future__ import annotations

from pathlib import Path

from aotc.loader.manifest import MANIFEST_NAME, ManifestError, read_manifest, verify_files

from .elf import ElfError, check_binary


def declared_variants(info) -> int:
    """How many variant keys the kernel families declare for a target (0 when they cannot be read)."""
    from aotc.kernels.registry import all_specs

    try:
        return sum(len(spec.keys(info.spec_arch())) for spec in all_specs().values())
    except Exception:  # noqa: BLE001 - a family that fails to import is the build's to report
        return 0


def target_dirs(root: str | Path) -> list[Path]:
    root = Path(root)
    return sorted(p for p in root.iterdir() if (p / MANIFEST_NAME).is_file()) if root.is_dir() else []


def summarize(root: str | Path) -> dict:
    out = {}
    for folder in target_dirs(root):
        try:
            m = read_manifest(folder, expect_target=folder.name)  # a folder is named after its target
            entries = m.entries  # builds every Entry: a malformed one raises here
        except ManifestError as e:
            out[folder.name] = {"error": str(e)}
            continue
        kernels: dict[str, dict] = {}
        seen_paths: set[str] = set()
        for e in entries:
            k = kernels.setdefault(e.kernel, {"variants": 0, "binaries": 0, "bytes": 0, "_paths": set()})
            k["binaries"] += 1
            if e.path not in k["_paths"]:
                k["_paths"].add(e.path)
                k["bytes"] += e.size
            seen_paths.add(e.path)
        for kernel, k in kernels.items():
            # A variant is a key's axes; its binaries are the specialization levels.
            k["variants"] = len({e.key.rsplit("@", 1)[0] for e in entries if e.kernel == kernel})
            del k["_paths"]
        out[folder.name] = {
            "arch": m.target.arch, "backend": m.target.backend, "warp_size": m.target.warp_size,
            "binaries": len(entries),
            "files": len(seen_paths), "bytes": sum(k["bytes"] for k in kernels.values()),
            "triton_version": m.triton_version, "aotc_version": m.aotc_version, "kernels": kernels,
        }
    return out


def verify(root: str | Path) -> tuple[list[str], int]:
    """(problems, entries checked): sha256 and size of every file, the manifest's target is the
    table's target of its folder, each binary's ELF machine and arch field are that target's
    (loader/targets.py), and it defines its symbol."""
    problems, checked = [], 0
    folders = target_dirs(root)
    if not folders:
        return [f"{root}: no <target>/{MANIFEST_NAME} found"], 0
    for folder in folders:
        try:
            m = read_manifest(folder)
        except ManifestError as e:
            problems.append(str(e))
            continue
        entries, malformed = m.checked_entries()  # every malformed entry named, the others checked
        problems += [f"{folder.name}: {p}" for p in malformed]
        problems += [f"{folder.name}: {p}" for p in verify_files(folder, entries=entries)]
        if folder.name != m.target.name or m.target.mismatch():
            why = m.target.mismatch() or f"it is for target {m.target.name}"
            problems.append(f"{folder.name}: manifest refused: {why}")
            continue
        info = m.target.info
        if not entries and not malformed:
            declared = declared_variants(info)
            if declared:
                problems.append(f"{folder.name}: the manifest lists no binary, while {declared} variants are "
                                f"declared for {folder.name} (a build where every compile failed?)")
        for e in entries:
            checked += 1
            path = folder / e.path
            if not path.is_file():
                continue
            if not e.path.endswith(info.ext):
                problems.append(f"{folder.name}: {e.key}: {e.path} is not a {info.binary} ({info.ext}) file")
            try:
                bad, symbols = check_binary(path.read_bytes(), info)
            except OSError:  # unreadable: verify_files named it already
                continue
            except ElfError as err:
                problems.append(f"{folder.name}: {e.key}: {e.path}: {err}")
                continue
            problems += [f"{folder.name}: {e.key}: {e.path} {p}" for p in bad]
            if e.symbol not in symbols:
                problems.append(f"{folder.name}: {e.key}: {e.path} does not define symbol {e.symbol}")
    return problems, checked
