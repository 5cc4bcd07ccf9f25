"""Where artifacts come from, which target a device runs, and reading verified binaries.

Source, first that is set: `set_artifacts(...)`, the `AOTC_ARTIFACTS` environment variable,
then the default: the `artifacts/` folder beside the installed `aotc.loader` package (in a
checkout, `<repo>/artifacts`, where `aotc build` writes by default). A source is a local folder
or `hf://ORG/NAME@REVISION` (downloaded once into the Hugging Face cache, see `hub.py`).

Targets (loader/targets.py): the vendor first, then the arch. An NVIDIA device of compute
capability M.m runs binaries built for smMx with x <= m (SASS is compatible within one major
version only): sm90 on an H100, sm80 on an A100, sm86 or sm89. An AMD device runs its own gfx
target only, an Iluvatar device its ivcore target only, never an sm folder.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from . import targets
from .manifest import Entry, Manifest, ManifestError, read_manifest, sha256_file
from .targets import Device

ENV_SOURCE = "AOTC_ARTIFACTS"


def default_root() -> Path:
    return Path(__file__).resolve().parent.parent / "artifacts"


_explicit: str | None = None


def set_artifacts(source: str | os.PathLike | None) -> None:
    """Point the loader at a folder or `hf://ORG/NAME@REV`; None returns to the default.

    Takes effect for kernels not loaded yet; call it before the first op.
    """
    global _explicit
    _explicit = None if source is None else str(source)
    _targets.clear()


def current_source() -> str:
    return _explicit or os.environ.get(ENV_SOURCE) or str(default_root())


def as_device(device: Device | tuple[int, int]) -> Device:
    """A `Device`; a bare capability (M, m) means an NVIDIA GPU."""
    return device if isinstance(device, Device) else Device("", tuple(device))


def candidate_targets(device: Device | tuple[int, int]) -> list[str]:
    """Target names a device can run, best first (a capability tuple: an NVIDIA device)."""
    return targets.candidates(as_device(device))


def local_target_names(source: str | None = None) -> list[str]:
    """The target folders of a local source (for error messages; a hub source lists none)."""
    source = source or current_source()
    root = Path(source).expanduser()
    if source.startswith("hf://") or not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "manifest.json").is_file())


class TargetArtifacts:
    """One target folder: its manifest, and each binary's bytes checked against its sha256."""

    def __init__(self, name: str, folder: Path, manifest: Manifest):
        self.name = name
        self.info = targets.get(name)  # the table's row: backend, warp size, driver binding
        self.folder = folder
        self.manifest = manifest
        self.entries = manifest  # .get(key) -> Entry or None, parsed on first use
        self._lock = threading.Lock()

    def read_binary(self, entry: Entry) -> bytes:
        """The binary's bytes, refused unless they match the manifest's size and sha256."""
        import hashlib

        path = self.folder / entry.path
        with self._lock:
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                raise ManifestError(f"{entry.key}: binary {path} is missing; rebuild or re-pull the "
                                    f"artifacts (aotc verify {self.folder.parent})") from None
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != entry.size or digest != entry.sha256:
            raise ManifestError(
                f"{entry.key}: binary {path} is damaged or altered (sha256 {digest}, {len(data)} bytes; "
                f"manifest says {entry.sha256}, {entry.size} bytes); refusing to load it")
        return data


class _NotCached(Exception):
    pass


_targets: dict[tuple[str, str], TargetArtifacts | None] = {}
_targets_lock = threading.Lock()


def load_target(device: Device | tuple[int, int]) -> TargetArtifacts | None:
    """The best target folder this device can run from the current source, or None. Only the
    device's own vendor's targets are looked at, and each manifest must be the table's target of
    its folder (read_manifest), so a binary never reaches another vendor's or arch's GPU.

    Offline, a hub target that was never cached is skipped for the next candidate; if no
    candidate is found, the first such error is raised (it names the pull command).
    """
    source = current_source()
    not_cached = None
    for name in candidate_targets(device):
        cache_key = (source, name)
        with _targets_lock:
            if cache_key not in _targets:
                try:
                    _targets[cache_key] = _open_target(source, name)
                except _NotCached as e:  # offline and never fetched
                    not_cached = not_cached or e.__cause__
                    continue
            found = _targets[cache_key]
        if found is not None:
            return found
    if not_cached is not None:
        raise not_cached
    return None


def _open_target(source: str, name: str) -> TargetArtifacts | None:
    if source.startswith("hf://"):
        from .hub import NotCachedError, TargetNotFoundError, fetch_target

        try:
            root = Path(fetch_target(source, name))
        except TargetNotFoundError:  # the repo has no folder for this target: try the next
            return None
        except NotCachedError as e:
            raise _NotCached() from e
    else:
        root = Path(source).expanduser()
    folder = root / name
    if not (folder / "manifest.json").is_file():
        return None
    return TargetArtifacts(name, folder, read_manifest(folder, expect_target=name))


__all__ = ["set_artifacts", "current_source", "default_root", "candidate_targets", "load_target", "local_target_names",
           "TargetArtifacts", "sha256_file"]
