"""Names that reach the Hugging Face cache's paths (issue 37, class 7): a revision is a branch or
tag name by git's rules or a 40-hex commit, a repo id is ORG/NAME, a target is one of the table's;
anything else is refused before a file is read or created (no refs file outside the cache, no lock
file anywhere). A damaged refs file is not followed out of snapshots/."""
from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from aotc.aot.cli import cli
from aotc.aot.hub_commands import push_artifacts
from aotc.loader import hub as hubmod
from aotc.loader.hub import BadSourceError, fetch, fetch_target, parse_hub_source

from .conftest import fake_hub

REPO = "org/kern"

BAD_REVISIONS = ["../x", "../../../../etc", "main/../../x", "..", ".hidden", "a/.b", "x.lock", "a/b.lock", "/main",
                 "main/", "main.", "a//b", "a..b", "@", "a@{1}", "a b", "a~1", "a^", "a:b", "a?", "a*", "a[", "a\\b",
                 "a\x00b", "a\nb", "\ud800", "é", "x" * 256, ""]
GOOD_REVISIONS = ["main", "v0.1.0", "refs/pr/1", "feature/new-tiles", "release-2026.11", "a" * 40]
BAD_REPOS = ["org", "org/..", "../org", "org/kern/x", "org/.kern", "-org/kern", "org/ke--rn", "org/kern.", "org/k n",
             "org/" + "k" * 97]
BAD_TARGETS = ["../x", "../../tmp/evil", "sm90/../..", "sm", "gfx000", "", "sm90\x00"]


@pytest.mark.parametrize("revision", BAD_REVISIONS, ids=repr)
def test_a_bad_revision_is_refused_in_a_source(revision):
    with pytest.raises(BadSourceError, match="revision .* is not a branch or tag name|revision .* is empty"):
        parse_hub_source(f"hf://{REPO}@{revision}")


@pytest.mark.parametrize("revision", GOOD_REVISIONS)
def test_branch_tag_pr_and_commit_revisions_parse(revision):
    assert parse_hub_source(f"hf://{REPO}@{revision}") == (REPO, revision)


@pytest.mark.parametrize("repo", BAD_REPOS, ids=repr)
def test_a_bad_repo_is_refused(repo):
    with pytest.raises(BadSourceError, match="is not ORG/NAME"):
        parse_hub_source(f"hf://{repo}")


def _files_under(path):
    return sorted(str(p) for p in path.rglob("*")) if path.exists() else []


@pytest.mark.parametrize("revision", ["../../../x", "main/../../x", "..", "a\x00b"], ids=repr)
def test_fetch_refuses_a_bad_revision_touching_nothing(hub, tmp_path, revision):
    before = _files_under(tmp_path)
    for call in (lambda: fetch(REPO, revision, "sm90"), lambda: fetch(REPO, revision, "sm90", allow_download=False)):
        with pytest.raises(BadSourceError, match="revision"):
            call()
    assert _files_under(tmp_path) == before and hub.requests == []


@pytest.mark.parametrize("target", BAD_TARGETS, ids=repr)
def test_fetch_refuses_a_bad_target_touching_nothing(hub, tmp_path, target):
    before = _files_under(tmp_path)
    with pytest.raises(BadSourceError, match="target"):
        fetch(REPO, "main", target)
    assert _files_under(tmp_path) == before and hub.requests == []


def test_a_bad_source_is_a_hub_error_and_a_value_error():
    assert issubclass(BadSourceError, hubmod.HubError) and issubclass(BadSourceError, ValueError)
    with pytest.raises(ValueError):
        fetch_target("hf://org/kern@../x", "sm90")


@pytest.mark.parametrize("args, named", [
    (["--arch", "../x"], "target"),
    (["--arch", "../../../../tmp/aotc-evil"], "target"),
    (["--revision", "../../x", "--arch", "sm90"], "revision"),
    (["--revision", "main/../x", "--arch", "sm90"], "revision"),
])
def test_pull_refuses_bad_names_and_creates_no_file(hub, tmp_path, args, named):
    before = _files_under(tmp_path)
    result = CliRunner().invoke(cli, ["pull", "--repo", REPO, *args])
    assert result.exit_code == 1 and named in result.output and "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert _files_under(tmp_path) == before and not os.path.exists("/tmp/aotc-evil.lock")


def test_a_refs_file_pointing_out_of_snapshots_is_not_followed(hub, tmp_path, monkeypatch):
    """A cache whose refs/main says "../../outside": the offline fetch finds nothing cached."""
    fake_hub.make_target(tmp_path / "artifacts", "sm90")
    sha, _ = push_artifacts(tmp_path / "artifacts", REPO)
    root = fetch(REPO, "main", "sm90")
    assert root.name == sha
    storage = root.parent.parent
    outside = storage.parent / "outside"
    (outside / "sm90").mkdir(parents=True)
    (outside / "sm90" / "manifest.json").write_text("{}")
    (storage / "refs" / "main").write_text("../../outside")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hubmod.NotCachedError):
        fetch(REPO, "main", "sm90")
