"""`aotc push` / `aotc pull` through Click against the fake hub, with the real huggingface_hub client."""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from aotc.aot import hub_commands
from aotc.aot.hub_commands import pull_command, push_command
from aotc.loader.hub import fetch_target
from aotc.loader.manifest import read_manifest, verify_files

REPO = "org/kern"


def _run(command, args):
    result = CliRunner().invoke(command, args, catch_exceptions=False)
    return result.exit_code, result.output


def _push(artifacts, *extra):
    code, out = _run(push_command, [str(artifacts), "--repo", REPO, *extra])
    assert code == 0, out
    sha = re.search(r"^commit ([0-9a-f]{40})$", out, re.M).group(1)
    assert f"AOTC_ARTIFACTS=hf://{REPO}@{sha}" in out
    return sha


def _repo_tree(hub, rev):
    return {p: data for p, data in hub.files(REPO, rev).items() if p != ".gitattributes"}


def _local_tree(artifacts, targets=("sm80", "sm90")):
    return {f"{t}/{p.relative_to(artifacts / t)}": p.read_bytes()
            for t in targets for p in (artifacts / t).rglob("*") if p.is_file()}


def test_push_is_one_commit_of_every_target_then_pull_and_fetch_from_cache(hub, artifacts):
    sha = _push(artifacts)
    assert len([r for r in hub.requests if r[1].startswith("/api/models/org/kern/commit/")]) == 1
    assert hub.resolve(REPO, "main") == sha
    assert _repo_tree(hub, sha) == _local_tree(artifacts)

    code, out = _run(pull_command, ["--repo", REPO, "--arch", "sm90"])
    assert code == 0, out
    assert f"is commit {sha}" in out and "sm90: 2 entries verified" in out
    folder = fetch_target(f"hf://{REPO}@{sha}", "sm90") / "sm90"
    assert str(folder) in out
    hub.requests.clear()
    assert verify_files(fetch_target(f"hf://{REPO}@{sha}", "sm90") / "sm90") == []
    assert hub.requests == []  # the pull warmed the cache the loader reads


def test_push_to_a_new_branch_and_pin_each_release(hub, artifacts, make_target):
    v1 = _push(artifacts, "--revision", "v0.1.0")
    make_target(artifacts, "sm90", seed=3)
    v2 = _push(artifacts, "--revision", "v0.2.0")
    assert hub.resolve(REPO, "v0.1.0") == v1 and hub.resolve(REPO, "v0.2.0") == v2
    assert _repo_tree(hub, "main") == {}  # releases live on their branches
    old = read_manifest(fetch_target(f"hf://{REPO}@v0.1.0", "sm90") / "sm90")
    new = read_manifest(fetch_target(f"hf://{REPO}@{v2}", "sm90") / "sm90")
    assert new == read_manifest(artifacts / "sm90") and old != new


def test_push_named_arch_only_and_replaces_stale_binaries(hub, artifacts, make_target):
    first = _push(artifacts)
    for cubin in (artifacts / "sm90" / "bin").iterdir():
        cubin.unlink()
    make_target(artifacts, "sm90", seed=4)
    second = _push(artifacts, "--arch", "sm90")
    tree = _repo_tree(hub, second)
    assert {p: d for p, d in tree.items() if p.startswith("sm90/")} == _local_tree(artifacts, ["sm90"])
    assert {p: d for p, d in tree.items() if p.startswith("sm80/")} == {
        p: d for p, d in _repo_tree(hub, first).items() if p.startswith("sm80/")}


def test_push_refuses_a_folder_that_fails_verification(hub, artifacts):
    victim = next((artifacts / "sm80" / "bin").iterdir())
    victim.write_bytes(victim.read_bytes()[:-3])
    code, out = _run(push_command, [str(artifacts), "--repo", REPO])
    assert code != 0
    assert "refusing to push" in out and victim.name in out
    assert REPO not in hub.repos


def test_push_refuses_missing_arch_and_commit_sha_revision(hub, artifacts):
    code, out = _run(push_command, [str(artifacts), "--repo", REPO, "--arch", "sm75"])
    assert code != 0 and "no built target sm75" in out
    code, out = _run(push_command, [str(artifacts), "--repo", REPO, "--revision", "b" * 40])
    assert code != 0 and "push needs a branch name" in out
    assert hub.requests_matching("/commit/") == []


def test_push_without_a_token_fails_clearly(hub, artifacts, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(artifacts / "no-token"))
    code, out = _run(push_command, [str(artifacts), "--repo", REPO])
    assert code != 0
    assert "401" in out and "HF_TOKEN" in out and "huggingface-cli login" in out
    assert REPO not in hub.repos


def test_pull_to_out_folder_copies_only_the_named_targets(hub, artifacts, tmp_path):
    _push(artifacts)
    out_dir = tmp_path / "pulled"
    code, out = _run(pull_command, ["--repo", REPO, "--arch", "sm80", "--out", str(out_dir)])
    assert code == 0, out
    assert sorted(p.name for p in out_dir.iterdir()) == ["sm80"]
    assert _local_tree(out_dir, ["sm80"]) == _local_tree(artifacts, ["sm80"])
    assert not any(p.is_symlink() for p in out_dir.rglob("*"))
    assert f"AOTC_ARTIFACTS={out_dir.resolve()}" in out
    # Pulling again replaces the folder in place.
    code, out = _run(pull_command, ["--repo", REPO, "--arch", "sm80", "--out", str(out_dir)])
    assert code == 0, out
    assert sorted(p.name for p in out_dir.iterdir()) == ["sm80"]


def test_pull_without_arch_picks_the_gpu_target_or_says_what_to_do(hub, artifacts, monkeypatch):
    _push(artifacts)
    monkeypatch.setattr(hub_commands, "device_targets", lambda: None)
    code, out = _run(pull_command, ["--repo", REPO])
    assert code != 0 and "no CUDA GPU" in out and "--arch" in out

    # An sm86 device: the repo has no sm86, so the loader's next candidate, sm80, is pulled.
    monkeypatch.setattr(hub_commands, "device_targets", lambda: ["sm86", "sm85", "sm84", "sm83", "sm82",
                                                                 "sm81", "sm80"])
    code, out = _run(pull_command, ["--repo", REPO])
    assert code == 0, out
    assert "sm80: 2 entries verified" in out and "sm90" not in out.replace(f"hf://{REPO}", "")
    assert hub.requests_matching("/sm90/") == []


def test_pull_surfaces_incompatible_manifest_and_missing_target(hub, artifacts):
    _push(artifacts)
    code, out = _run(pull_command, ["--repo", REPO, "--arch", "sm75"])
    assert code != 0 and "no sm75 artifacts" in out and "sm80, sm90" in out

    doc = json.loads((artifacts / "sm90" / "manifest.json").read_text())
    doc["schema_version"], doc["aotc_version"] = 7, "9.9.9"
    sha = hub.commit(REPO, "main", {"sm90/manifest.json": json.dumps(doc).encode()}, "from the future")
    code, out = _run(pull_command, ["--repo", REPO, "--revision", sha, "--arch", "sm90"])
    assert code != 0
    assert "manifest schema 7" in out and "aotc 9.9.9" in out and "reads schema 2" in out


@pytest.mark.parametrize("args", [["--repo", REPO, "--revision", "nope", "--arch", "sm90"],
                                  ["--repo", "org/absent", "--arch", "sm90"]])
def test_pull_unknown_revision_or_repo(hub, artifacts, args):
    _push(artifacts)
    code, out = _run(pull_command, args)
    assert code != 0 and ("no revision 'nope'" in out or "org/absent not found" in out)


def test_aotc_cli_has_push_and_pull():
    from aotc.aot.cli import cli

    for name in ("push", "pull"):
        result = CliRunner().invoke(cli, [name, "--help"])
        assert result.exit_code == 0 and "--repo" in result.output


def test_loader_reads_a_hub_source_from_aotc_artifacts(hub, artifacts, monkeypatch):
    from aotc.loader import artifacts as loader_artifacts

    sha = _push(artifacts)
    monkeypatch.setenv("AOTC_ARTIFACTS", f"hf://{REPO}@{sha}")
    loader_artifacts.set_artifacts(None)
    try:
        found = loader_artifacts.load_target((9, 0))
        assert found is not None and found.name == "sm90"
        local = read_manifest(artifacts / "sm90")
        for entry in local.entries:
            assert found.read_binary(found.entries[entry.key]) == (artifacts / "sm90" / entry.path).read_bytes()
    finally:
        loader_artifacts.set_artifacts(None)
