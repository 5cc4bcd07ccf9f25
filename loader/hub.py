"""Prebuilt artifacts on the Hugging Face Hub: `hf://ORG/NAME@REV` -> a verified local folder.

A hub repo holds one folder per target at its root, exactly as `aotc build` writes them:
`<target>/manifest.json` and `<target>/bin/<sha256>.cubin`. `fetch_target` downloads only the
asked target's manifest and the files it lists into the standard Hugging Face cache (HF_HUB_CACHE,
else HF_HOME/hub; both read when called) and checks every file against the manifest's sha256.

Network use: a 40-hex commit sha is immutable, so a verified cached copy is used with no network
call at all; a branch is resolved online each time (one HEAD request) so a moved branch is seen.
`HF_HUB_OFFLINE=1` and `AOTC_NO_DOWNLOAD=1` both restrict to the cache; a miss then raises
`NotCachedError` with the `aotc pull ...` command that fetches it.

huggingface_hub is imported only inside the functions that download: a cache hit never imports it.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from urllib.parse import quote

from . import targets
from .manifest import MANIFEST_NAME, Manifest, ManifestError, read_manifest, sha256_file, verify_files

SCHEME = "hf://"
ENV_NO_DOWNLOAD = "AOTC_NO_DOWNLOAD"
_COMMIT = re.compile(r"[0-9a-f]{40}")
# The Hub's repo ids: ORG/NAME, each up to 96 of [A-Za-z0-9_.-], starting with a letter or digit.
_REPO = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}", re.ASCII)
_REF_CHARS = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no space
_REF_FORBIDDEN = ("..", "//", "@{", "~", "^", ":", "?", "*", "[", "\\")
# Download threads for one target's binaries: dozens of small files, latency-bound.
_WORKERS = 8


class HubError(RuntimeError):
    """Artifacts could not be had from the hub (or its cache)."""


class TargetNotFoundError(HubError, LookupError):
    """The repo at that revision has no folder for this target."""


class NotCachedError(HubError):
    """Downloads are disabled and the cache does not hold a good copy."""


class BadSourceError(HubError, ValueError):
    """A repo id, revision or target name that may not be used: it could lead outside the cache."""


class CorruptArtifactsError(HubError):
    """Files that do not match their manifest, and could not be (or may not be) downloaded again."""


def is_hub_source(source: str | os.PathLike) -> bool:
    return str(source).startswith(SCHEME)


def parse_hub_source(source: str) -> tuple[str, str]:
    """`hf://ORG/NAME@REV` -> ("ORG/NAME", "REV"); REV defaults to "main"."""
    if not is_hub_source(source):
        raise ValueError(f"not a hub source: {source!r}; expected hf://ORG/NAME or hf://ORG/NAME@REVISION")
    rest = str(source)[len(SCHEME):]
    repo, sep, revision = rest.partition("@")
    why = repo_problem(repo) or (revision_problem(revision) if sep else None)
    if why:
        raise BadSourceError(f"bad hub source {source!r}: {why}; expected hf://ORG/NAME or hf://ORG/NAME@REVISION "
                             "(a branch or tag such as v0.1.0, or a 40-hex commit sha)")
    return repo, revision or "main"


def repo_problem(repo) -> str | None:
    """Why `repo` is not a Hub repo id ORG/NAME (letters, digits, _ . -; no "--" or ".."), or None."""
    if not isinstance(repo, str) or not _REPO.fullmatch(repo) or ".." in repo or "--" in repo \
            or any(part.endswith((".", "-")) for part in repo.split("/")):
        return f"repo {repo!r:.120} is not ORG/NAME"
    return None


def revision_problem(revision) -> str | None:
    """Why `revision` is neither a 40-hex commit nor a branch or tag name, or None. Names follow
    git's check-ref-format (the Hub's refs are git refs; refs/pr/1 is one): printable ASCII with
    no space, none of .. // @{ ~ ^ : ? * [ \\, no component starting with "." or ending with
    ".lock", not starting or ending with "/", not ending with ".", not "@", at most 255
    characters. So a revision never leads outside the cache's refs/ and snapshots/ folders."""
    if not isinstance(revision, str) or not revision:
        return f"revision {revision!r:.120} is empty or not a string"
    if _COMMIT.fullmatch(revision):
        return None
    bad = (len(revision) > 255 or not _REF_CHARS.fullmatch(revision)
           or any(f in revision for f in _REF_FORBIDDEN) or revision == "@"
           or revision.startswith("/") or revision.endswith(("/", "."))
           or any(p.startswith(".") or p.endswith(".lock") for p in revision.split("/")))
    return f"revision {revision!r:.120} is not a branch or tag name (git's rules) nor a 40-hex commit" if bad else None


def check_source(repo: str, revision: str, target: str) -> None:
    """BadSourceError naming whichever of repo, revision and target may not be used."""
    why = repo_problem(repo) or revision_problem(revision)
    if why is None:
        try:
            if not isinstance(target, str):
                raise ValueError(f"a target is a name such as sm90, not {type(target).__name__}")
            targets.get(target)
        except ValueError as e:
            why = f"target: {e}"
    if why:
        raise BadSourceError(why)


def pull_command(repo: str, revision: str, target: str) -> str:
    return f"aotc pull --repo {repo} --revision {revision} --arch {target}"


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment as it is now."""
    # Same order as huggingface_hub.constants, without importing it.
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not hub:
        home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
        hub = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(hub)))


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _offline() -> bool:
    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def hub_endpoint() -> str | None:
    # Read when called (huggingface_hub reads HF_ENDPOINT once, at import).
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or None


def fetch_target(source: str, target: str) -> Path:
    """A local root folder holding `<target>/manifest.json` and every file it lists, all verified.

    Raises TargetNotFoundError (the revision has no such target), NotCachedError (downloads disabled
    and not cached), CorruptArtifactsError, ManifestError (a manifest this loader cannot use) or
    HubError (repo or revision not found, network).
    """
    repo, revision = parse_hub_source(source)
    return fetch(repo, revision, target, allow_download=not _env_true(ENV_NO_DOWNLOAD))


def fetch(repo: str, revision: str, target: str, *, allow_download: bool = True,
          token: str | None = None) -> Path:
    """fetch_target's work, with downloads allowed or not by the caller (`aotc pull` allows them).
    BadSourceError (a HubError and a ValueError) for a repo, revision or target that may not be used."""
    check_source(repo, revision, target)
    cache = hub_cache_dir()
    if _COMMIT.fullmatch(revision) or _offline() or not allow_download:
        # Lock-free fast path: a revision that will not be resolved online, already cached and intact.
        root = _cached_root(cache, repo, revision)
        if root is not None and (root / target / MANIFEST_NAME).is_file() and not _problems(root, target):
            return root

    from filelock import FileLock

    lock = cache / ".locks" / "aotc" / _repo_folder(repo) / f"{quote(revision, safe='')}.{target}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    # One fetcher per (repo, revision, target): a second process waits, then finds the first one's copy.
    with FileLock(str(lock)):
        return _fetch_locked(cache, repo, revision, target, allow_download, token)


def _fetch_locked(cache: Path, repo: str, revision: str, target: str, allow_download: bool,
                  token: str | None) -> Path:
    offline = _offline()
    problems: list[str] = []
    root = _cached_root(cache, repo, revision)
    if root is not None:
        if (root / target / MANIFEST_NAME).is_file():
            problems = _problems(root, target)
            if not problems and (offline or not allow_download or _COMMIT.fullmatch(revision)):
                return root
        elif _known_absent(cache, repo, root.name, target):
            raise TargetNotFoundError(f"{repo}@{revision} has no {target} artifacts "
                                      f"(no {target}/{MANIFEST_NAME} at commit {root.name})")
    if offline or not allow_download:
        why = "HF_HUB_OFFLINE=1" if offline else f"{ENV_NO_DOWNLOAD}=1"
        fix = f"Fetch them where downloads are allowed with: {pull_command(repo, revision, target)}"
        if problems:
            raise CorruptArtifactsError(
                f"the cached {target} artifacts of {repo}@{revision} ({root / target}) fail verification "
                f"and downloads are disabled ({why}):\n  " + "\n  ".join(problems[:10]) + f"\n{fix}")
        raise NotCachedError(
            f"the {target} artifacts of {repo}@{revision} are not in the Hugging Face cache ({cache}) "
            f"and downloads are disabled ({why}). {fix}")
    return _download(cache, repo, revision, target, token)


def _download(cache: Path, repo: str, revision: str, target: str, token: str | None) -> Path:
    from concurrent.futures import ThreadPoolExecutor

    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import (EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError,
                                       RepositoryNotFoundError, RevisionNotFoundError)

    def get(filename: str, rev: str, force: bool = False) -> Path:
        return Path(hf_hub_download(repo, filename, revision=rev, cache_dir=str(cache), endpoint=hub_endpoint(),
                                    token=token, force_download=force))

    manifest_name = f"{target}/{MANIFEST_NAME}"
    try:
        manifest_path = get(manifest_name, revision)
    except RepositoryNotFoundError as e:
        raise HubError(f"hub repo {repo} not found (or private and no token: huggingface-cli login "
                       f"or HF_TOKEN): {e}") from e
    except RevisionNotFoundError as e:
        raise HubError(f"hub repo {repo} has no revision {revision!r}: {e}") from e
    except EntryNotFoundError as e:
        if isinstance(e, LocalEntryNotFoundError):
            raise HubError(f"could not reach the hub for {repo}@{revision} and nothing is cached: {e}") from e
        raise TargetNotFoundError(f"{repo}@{revision} has no {target} artifacts (no {manifest_name}); "
                                  f"targets there: {_remote_targets(repo, revision, token) or 'none'}") from e
    except HfHubHTTPError as e:
        raise HubError(f"downloading {manifest_name} from {repo}@{revision} failed: {e}") from e
    root = manifest_path.parent.parent
    commit = root.name  # snapshots/<commit sha>/<target>/manifest.json
    folder = root / target

    if _blob_mismatch(manifest_path):
        _refetch(get, manifest_name, commit, folder / MANIFEST_NAME)
        if _blob_mismatch(manifest_path):
            raise CorruptArtifactsError(f"{repo}@{commit}: {manifest_name} does not match its hub hash "
                                        "even after downloading it again")
    manifest = read_manifest(folder, expect_target=target)
    keys: dict[str, list[str]] = {}
    for e in manifest.entries:
        keys.setdefault(e.path, []).append(e.key)

    def get_binary(path: str) -> None:
        try:
            get(f"{target}/{path}", commit)
        except EntryNotFoundError as e:  # the error names the entries, not only the file
            raise HubError(f"{', '.join(keys[path])}: binary {target}/{path} is missing from {repo}@{commit}; "
                           f"refusing the incomplete {target} artifacts") from e

    try:
        with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
            list(pool.map(get_binary, sorted(keys)))
    except HubError:
        raise
    except Exception as e:  # network and HTTP error classes differ between huggingface_hub versions
        raise HubError(f"downloading the {target} binaries of {repo}@{commit} failed: {e}") from e
    bad = _bad_paths(folder, manifest)
    for path in bad:  # a tampered or truncated cached copy: replace it once
        _refetch(get, f"{target}/{path}", commit, folder / path)
    if bad:
        problems = verify_files(folder, manifest)
        if problems:
            raise CorruptArtifactsError(
                f"{repo}@{commit} {target}: files on the hub do not match their manifest, refusing them:\n  "
                + "\n  ".join(problems[:10]))
    return root


def _refetch(get, filename: str, commit: str, pointer: Path) -> None:
    # A regular file where the cache keeps a symlink would survive force_download; drop it first.
    if pointer.exists() and not pointer.is_symlink():
        pointer.unlink()
    get(filename, commit, force=True)


def _problems(root: Path, target: str) -> list[str]:
    """Why the cached copy of `target` cannot be used as is; empty when it can.

    A manifest that matches its hub hash but that this loader cannot use raises ManifestError: no
    download will fix it.
    """
    folder = root / target
    mismatch = _blob_mismatch(folder / MANIFEST_NAME)
    if mismatch:
        return [mismatch]
    return verify_files(folder, read_manifest(folder, expect_target=target))


def _bad_paths(folder: Path, manifest: Manifest) -> list[str]:
    bad = []
    for path, entry in {e.path: e for e in manifest.entries}.items():
        file = folder / path
        if not file.is_file() or file.stat().st_size != entry.size or sha256_file(file) != entry.sha256:
            bad.append(path)
    return bad


def _blob_mismatch(pointer: Path) -> str | None:
    """The cache names each blob by its hub hash (git blob sha1, or sha256 for LFS/xet files).

    That is the manifest's own integrity check: the manifest carries every other file's sha256.
    """
    if not pointer.is_symlink():
        return None  # a copied cache (no symlinks): nothing to check against
    blob = Path(os.path.realpath(pointer))
    name = blob.name
    try:
        data = blob.read_bytes()
    except FileNotFoundError:
        return f"{pointer}: its blob {blob} is missing"
    if len(name) == 64:
        digest = hashlib.sha256(data).hexdigest()
    elif len(name) == 40:
        digest = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    else:
        return None
    return None if digest == name else f"{pointer}: content hash {digest} != cached hub hash {name}"


def _repo_folder(repo: str) -> str:
    return "models--" + repo.replace("/", "--")  # the Hugging Face cache layout


def _cached_root(cache: Path, repo: str, revision: str) -> Path | None:
    storage = cache / _repo_folder(repo)
    commit = revision
    if not _COMMIT.fullmatch(revision):
        ref = storage / "refs" / revision
        if not ref.is_file():
            return None
        commit = ref.read_text().strip()
        if not _COMMIT.fullmatch(commit):  # a damaged refs file: not a snapshot to trust
            return None
    snapshot = storage / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _known_absent(cache: Path, repo: str, commit: str, target: str) -> bool:
    # huggingface_hub records a 404 for a file at a commit under .no_exist/<commit>/<path>.
    return (cache / _repo_folder(repo) / ".no_exist" / commit / target / MANIFEST_NAME).exists()


def _remote_targets(repo: str, revision: str, token: str | None) -> str:
    try:
        from huggingface_hub.hf_api import HfApi, RepoFolder

        tree = HfApi(endpoint=hub_endpoint(), token=token).list_repo_tree(repo, revision=revision)
        return ", ".join(sorted(f.path for f in tree if isinstance(f, RepoFolder)))
    except Exception:  # only decorates an error message
        return "?"


def _swap_lock(dest: Path) -> str:
    """A lock file for swapping `dest`, in the temporary folder (the out folder keeps only targets)."""
    import hashlib
    import tempfile

    digest = hashlib.sha256(str(dest.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return os.path.join(tempfile.gettempdir(), f"aotc-pull-{digest}.lock")


def copy_target(root: Path, target: str, out: str | os.PathLike) -> Path:
    """Copy a verified target folder to `out/<target>`, replacing what was there only once complete."""
    import shutil
    import tempfile

    from filelock import FileLock

    src = Path(root) / target
    manifest = read_manifest(src, expect_target=target)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target}.", dir=out))
    mask = os.umask(0o022)
    os.umask(mask)
    os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes it 0700; it becomes the target folder, readable as mkdir's
    try:
        for rel in sorted({e.path for e in manifest.entries}) + [MANIFEST_NAME]:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, tmp / rel)
        problems = verify_files(tmp, manifest)
        if problems:
            raise CorruptArtifactsError(f"copy of {src} to {out} failed verification:\n  " + "\n  ".join(problems))
        dest = out / target
        old = None
        # Two pulls into one folder: each swaps its complete copy in whole, one at a time (unlocked,
        # both could move the same old folder aside and one would find it gone).
        with FileLock(_swap_lock(out / target)):
            if dest.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{target}.old.", dir=out))
                os.replace(dest, old / target)
            os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["parse_hub_source", "is_hub_source", "fetch_target", "fetch", "copy_target", "pull_command",
           "hub_cache_dir", "hub_endpoint", "check_source", "HubError", "BadSourceError", "TargetNotFoundError",
           "NotCachedError",
           "CorruptArtifactsError", "ManifestError"]
