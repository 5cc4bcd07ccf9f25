"""`aotc push` and `aotc pull`: built target folders to and from a Hugging Face Hub repo.

The repo mirrors an artifacts folder: `<target>/manifest.json` and `<target>/bin/...` at its root.
A push is one commit holding every pushed target; pin what it prints (`hf://ORG/NAME@<sha>`).
"""
from __future__ import annotations

import re
from pathlib import Path

import click

from aotc.loader import hub
from aotc.loader.manifest import MANIFEST_NAME, ManifestError, read_manifest, verify_files

_COMMIT = re.compile(r"[0-9a-f]{40}")


def find_targets(root: Path, names: tuple[str, ...] = ()) -> list[str]:
    """The target folders to push: those named, else every folder of `root` holding a manifest."""
    if names:
        missing = [n for n in names if not (root / n / MANIFEST_NAME).is_file()]
        if missing:
            raise hub.HubError(f"no built target {', '.join(missing)} in {root} "
                               f"(expected {root}/<target>/{MANIFEST_NAME}; build it with aotc build --arch ...)")
        return list(dict.fromkeys(names))
    found = sorted(p.parent.name for p in root.glob(f"*/{MANIFEST_NAME}"))
    if not found:
        raise hub.HubError(f"no target folders in {root} (expected {root}/<target>/{MANIFEST_NAME}; "
                           "run aotc build first)")
    return found


def push_artifacts(root: str | Path, repo: str, *, revision: str | None = None, targets: tuple[str, ...] = (),
                   token: str | None = None, private: bool | None = None,
                   message: str | None = None) -> tuple[str, dict[str, int]]:
    """Upload verified target folders to `repo` in one commit; returns (commit sha, files per target).

    Creates the repo if missing and the branch `revision` if new (from main's head). A pushed target's
    folder on the hub ends up holding exactly the local manifest and the files it lists.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.utils import HfHubHTTPError

    root = Path(root)
    branch = revision or "main"
    if _COMMIT.fullmatch(branch):
        raise hub.HubError(f"--revision {branch} is a commit sha; push needs a branch name such as v0.1.0")
    files: dict[str, list[str]] = {}
    versions = set()
    for name in find_targets(root, targets):
        folder = root / name
        manifest = read_manifest(folder, expect_target=name)  # ManifestError names what is wrong
        problems = verify_files(folder, manifest)
        if problems:
            raise hub.HubError(f"refusing to push {folder}: it fails verification (rebuild it):\n  "
                               + "\n  ".join(problems[:10]))
        files[name] = [MANIFEST_NAME] + sorted({e.path for e in manifest.entries})
        versions.add(f"aotc {manifest.aotc_version}, Triton {manifest.triton_version}")

    try:
        return _commit(HfApi(endpoint=hub.hub_endpoint(), token=token), root, repo, branch, files, private,
                       message or f"aotc artifacts: {', '.join(files)} ({'; '.join(sorted(versions))})")
    except HfHubHTTPError as e:
        hint = ""
        if e.response is not None and e.response.status_code in (401, 403):
            hint = ("\nPushing needs a token with write access to the repo: huggingface-cli login "
                    "(hf auth login), or HF_TOKEN.")
        raise hub.HubError(f"pushing to {repo} branch {branch} failed: {e}{hint}") from e


def _commit(api, root: Path, repo: str, branch: str, files: dict[str, list[str]], private: bool | None,
            message: str) -> tuple[str, dict[str, int]]:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    api.create_repo(repo, exist_ok=True, private=private)
    if branch != "main":
        api.create_branch(repo, branch=branch, exist_ok=True)
    new_paths = {f"{t}/{rel}" for t, rels in files.items() for rel in rels}
    # A rebuilt target names its binaries by new hashes: drop the old ones so the folder matches.
    stale = [p for p in api.list_repo_files(repo, revision=branch)
             if p.split("/", 1)[0] in files and p not in new_paths]
    operations = [CommitOperationDelete(path_in_repo=p) for p in stale]
    operations += [CommitOperationAdd(path_in_repo=f"{t}/{rel}", path_or_fileobj=str(root / t / rel))
                   for t, rels in files.items() for rel in rels]
    info = api.create_commit(repo, operations, revision=branch, commit_message=message)
    return info.oid, {t: len(rels) for t, rels in files.items()}


@click.command("push")
@click.argument("artifacts_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--repo", required=True, help="Hub repo ORG/NAME (created if missing).")
@click.option("--revision", default="main", show_default=True,
              help="Branch to commit to (created from main if new), e.g. v0.1.0.")
@click.option("--arch", "archs", multiple=True, help="Target folder to push (repeatable); default: all in DIR.")
@click.option("--private/--public", default=None, help="Visibility if the repo is created (default: the Hub's).")
@click.option("--message", default=None, help="Commit message.")
def push_command(artifacts_dir: Path, repo: str, revision: str, archs: tuple[str, ...], private: bool | None,
                 message: str | None) -> None:
    """Upload built target folders of ARTIFACTS_DIR to a Hub repo in one commit.

    Needs a write token: huggingface-cli login, or HF_TOKEN. Prints the commit sha to pin.
    """
    try:
        sha, counts = push_artifacts(artifacts_dir, repo, revision=revision, targets=archs, private=private,
                                     message=message)
    except (hub.HubError, ManifestError) as e:
        raise click.ClickException(str(e)) from e
    pushed = ", ".join(f"{t} ({n} files)" for t, n in counts.items())
    click.echo(f"pushed {pushed} to {repo} branch {revision}")
    click.echo(f"commit {sha}")
    click.echo(f"pin it: AOTC_ARTIFACTS=hf://{repo}@{sha}")


def device_targets() -> list[str] | None:
    """Targets the current GPU can run, best first (the loader's order); None without a CUDA GPU."""
    import torch

    from aotc.loader import targets

    if not torch.cuda.is_available():
        return None
    # The vendor first (an Iluvatar GPU reports a CUDA capability), then its targets.
    return targets.candidates(targets.describe(torch.cuda.current_device()))


def pull_artifacts(repo: str, revision: str = "main", targets: tuple[str, ...] = (),
                   out: str | Path | None = None) -> dict[str, Path]:
    """Download and verify targets; returns each target's folder (in the cache, or under `out`).

    With no targets, the current GPU's: the first of its candidate targets that the repo has.
    """
    if targets:
        roots = {}
        for t in dict.fromkeys(targets):
            roots[t] = hub.fetch(repo, revision, t)
            revision = roots[t].name  # every target from the commit the branch pointed at first
    else:
        candidates = device_targets()
        if candidates is None:
            raise hub.HubError("no CUDA GPU here to choose a target for: name one or more with --arch, "
                               "e.g. --arch sm90 --arch sm80")
        roots = {}
        for t in candidates:
            try:
                roots[t] = hub.fetch(repo, revision, t)
                break
            except hub.TargetNotFoundError:
                continue
        if not roots:
            raise hub.TargetNotFoundError(f"{repo}@{revision} has none of the targets this GPU runs: "
                                          f"{', '.join(candidates)}")
    if out is None:
        return {t: root / t for t, root in roots.items()}
    return {t: hub.copy_target(root, t, out) for t, root in roots.items()}


@click.command("pull")
@click.option("--repo", required=True, help="Hub repo ORG/NAME.")
@click.option("--revision", default="main", show_default=True, help="Branch, tag or 40-hex commit sha.")
@click.option("--arch", "archs", multiple=True, help="Target to fetch (repeatable); default: this GPU's.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Copy the verified target folders here (default: leave them in the Hugging Face cache).")
def pull_command(repo: str, revision: str, archs: tuple[str, ...], out: Path | None) -> None:
    """Download target folders from a Hub repo and verify every file's sha256.

    Files go to the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub), where the loader finds them.
    """
    try:
        folders = pull_artifacts(repo, revision, archs, out)
    except (hub.HubError, ManifestError) as e:
        raise click.ClickException(str(e)) from e
    for t, folder in folders.items():
        n = len(read_manifest(folder, expect_target=t).entries)
        click.echo(f"{t}: {n} entries verified in {folder}")
    if out is not None:
        click.echo(f"use them: AOTC_ARTIFACTS={Path(out).resolve()}")
    else:
        commit = next(iter(folders.values())).parent.name
        click.echo(f"{repo}@{revision} is commit {commit}; pin it: AOTC_ARTIFACTS=hf://{repo}@{commit}")
