"""fetch_target against the fake hub: cache hits without network, pinned revisions, tampering,
offline and no-download modes, interrupted downloads, concurrent fetchers."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from aotc.aot.hub_commands import push_artifacts
from aotc.loader import hub as hubmod
from aotc.loader.hub import (CorruptArtifactsError, NotCachedError, TargetNotFoundError, fetch_target,
                             parse_hub_source)
from aotc.loader.manifest import Manifest, ManifestError, read_manifest, verify_files

REPO = "org/kern"


def _pushed(hub, artifacts, **kw):
    sha, _ = push_artifacts(artifacts, REPO, **kw)
    hub.requests.clear()
    return sha


def _same_content(folder, local):
    """Every file the local manifest lists, byte-identical in the fetched folder."""
    m = read_manifest(local)
    assert read_manifest(folder) == m
    assert verify_files(folder, m) == []
    for e in m.entries:
        assert (folder / e.path).read_bytes() == (local / e.path).read_bytes()


@pytest.mark.parametrize("source, expected", [
    ("hf://org/kern", ("org/kern", "main")),
    ("hf://org/kern@v0.1.0", ("org/kern", "v0.1.0")),
    ("hf://org/kern@" + "a" * 40, ("org/kern", "a" * 40)),
])
def test_parse_hub_source(source, expected):
    assert parse_hub_source(source) == expected


@pytest.mark.parametrize("bad", ["org/kern", "hf://kern", "hf://org/kern@", "hf://org/kern/extra", "hf:///kern"])
def test_parse_hub_source_rejects(bad):
    with pytest.raises(ValueError, match="hf://ORG/NAME"):
        parse_hub_source(bad)


def test_fetch_downloads_only_the_target_then_hits_cache_without_network(hub, artifacts):
    sha = _pushed(hub, artifacts)
    root = fetch_target(f"hf://{REPO}@{sha}", "sm90")
    _same_content(root / "sm90", artifacts / "sm90")
    assert hub.requests_matching("/resolve/"), "the first fetch must download"
    assert hub.requests_matching("sm80") == []
    assert not (root / "sm80").exists()

    hub.requests.clear()
    assert fetch_target(f"hf://{REPO}@{sha}", "sm90") == root
    assert hub.requests == []


def test_pinned_revision_keeps_its_content(hub, artifacts, make_target):
    first = _pushed(hub, artifacts)
    make_target(artifacts, "sm90", seed=1)  # rebuilt: different binaries
    second = _pushed(hub, artifacts)
    assert first != second
    old = fetch_target(f"hf://{REPO}@{first}", "sm90")
    new = fetch_target(f"hf://{REPO}", "sm90")  # main
    assert new.name == second and old.name == first
    _same_content(new / "sm90", artifacts / "sm90")
    assert read_manifest(old / "sm90").entries != read_manifest(new / "sm90").entries
    assert verify_files(old / "sm90") == []


def test_branch_is_resolved_online_each_time(hub, artifacts, make_target):
    _pushed(hub, artifacts)
    fetch_target(f"hf://{REPO}", "sm90")
    make_target(artifacts, "sm90", seed=2)
    second = _pushed(hub, artifacts)
    root = fetch_target(f"hf://{REPO}", "sm90")
    assert root.name == second
    _same_content(root / "sm90", artifacts / "sm90")


def _cubins(root):
    return sorted((root / "sm90" / "bin").iterdir())


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_tampered_cached_file_is_refused_and_downloaded_again(hub, artifacts, damage):
    sha = _pushed(hub, artifacts)
    root = fetch_target(f"hf://{REPO}@{sha}", "sm90")
    victim = _cubins(root)[0]
    data = victim.read_bytes()
    victim.write_bytes(data[:-1] + bytes([data[-1] ^ 1]) if damage == "flip" else data[: len(data) // 2])
    assert verify_files(root / "sm90")
    hub.requests.clear()

    assert fetch_target(f"hf://{REPO}@{sha}", "sm90") == root
    assert victim.read_bytes() == data
    gets = [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]
    assert len(gets) == 1 and gets[0][1].endswith(victim.name)


def test_consistently_tampered_manifest_is_caught_by_its_hub_hash(hub, artifacts):
    # Swap a binary AND rewrite the manifest's sha256 for it: only the manifest's own hash can tell.
    sha = _pushed(hub, artifacts)
    root = fetch_target(f"hf://{REPO}@{sha}", "sm90")
    folder = root / "sm90"
    original = {p: p.read_bytes() for p in [folder / "manifest.json", *_cubins(root)]}
    victim = _cubins(root)[0]
    evil = os.urandom(victim.stat().st_size)
    m = read_manifest(folder)
    entries = [replace(e, sha256=hashlib.sha256(evil).hexdigest()) if e.path == f"bin/{victim.name}" else e
               for e in m.entries]
    victim.write_bytes(evil)
    (folder / "manifest.json").write_text(Manifest(m.target, m.aotc_version, m.triton_version, entries).to_json())
    assert verify_files(folder) == []  # self-consistent: the manifest alone cannot catch it

    assert fetch_target(f"hf://{REPO}@{sha}", "sm90") == root
    assert {p: p.read_bytes() for p in original} == original


def test_tampered_file_without_download_is_refused_clearly(hub, artifacts, monkeypatch):
    sha = _pushed(hub, artifacts)
    root = fetch_target(f"hf://{REPO}@{sha}", "sm90")
    victim = _cubins(root)[1]
    victim.write_bytes(b"\0" + victim.read_bytes()[1:])
    hub.requests.clear()
    monkeypatch.setenv("AOTC_NO_DOWNLOAD", "1")
    with pytest.raises(CorruptArtifactsError) as err:
        fetch_target(f"hf://{REPO}@{sha}", "sm90")
    msg = str(err.value)
    assert victim.name in msg and "AOTC_NO_DOWNLOAD=1" in msg
    assert f"aotc pull --repo {REPO} --revision {sha} --arch sm90" in msg
    assert hub.requests == []


@pytest.mark.parametrize("pinned", [True, False])
def test_offline_uses_warm_cache_with_no_request(hub, artifacts, monkeypatch, pinned):
    sha = _pushed(hub, artifacts)
    source = f"hf://{REPO}@{sha}" if pinned else f"hf://{REPO}"
    root = fetch_target(source, "sm90")
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert fetch_target(source, "sm90") == root
    _same_content(root / "sm90", artifacts / "sm90")
    assert hub.requests == []


@pytest.mark.parametrize("env", ["AOTC_NO_DOWNLOAD", "HF_HUB_OFFLINE"])
def test_cold_cache_without_download_names_target_and_pull_command(hub, artifacts, monkeypatch, env):
    _pushed(hub, artifacts)
    monkeypatch.setenv(env, "1")
    with pytest.raises(NotCachedError) as err:
        fetch_target(f"hf://{REPO}@v0.1.0", "sm90")
    msg = str(err.value)
    assert "sm90" in msg and f"{env}=1" in msg and str(hubmod.hub_cache_dir()) in msg
    assert f"aotc pull --repo {REPO} --revision v0.1.0 --arch sm90" in msg
    assert hub.requests == []


def test_missing_target_is_its_own_error_online_and_from_cache(hub, artifacts, monkeypatch):
    sha = _pushed(hub, artifacts)
    with pytest.raises(TargetNotFoundError, match=r"no sm86 artifacts.*targets there: sm80, sm90"):
        fetch_target(f"hf://{REPO}@{sha}", "sm86")
    fetch_target(f"hf://{REPO}@{sha}", "sm90")
    hub.requests.clear()
    monkeypatch.setenv("AOTC_NO_DOWNLOAD", "1")
    # The 404 was recorded in the cache: offline, the loader can still move on to its next target.
    with pytest.raises(TargetNotFoundError, match="sm86"):
        fetch_target(f"hf://{REPO}@{sha}", "sm86")
    assert hub.requests == []


def test_unknown_repo_and_revision(hub, artifacts):
    sha = _pushed(hub, artifacts)
    with pytest.raises(hubmod.HubError, match="org/nope not found"):
        fetch_target("hf://org/nope", "sm90")
    with pytest.raises(hubmod.HubError, match="no revision 'v9'"):
        fetch_target(f"hf://{REPO}@v9", "sm90")
    assert fetch_target(f"hf://{REPO}@{sha}", "sm90").name == sha


def test_incompatible_manifest_is_refused_naming_both_sides(hub, artifacts):
    doc = json.loads((artifacts / "sm90" / "manifest.json").read_text())
    doc["launch_abi"], doc["triton_version"] = 2, "3.7.0"
    files = {f"sm90/{p.relative_to(artifacts / 'sm90')}": p.read_bytes()
             for p in (artifacts / "sm90").rglob("*.cubin")}
    files["sm90/manifest.json"] = json.dumps(doc).encode()
    hub.repos[REPO] = {"branches": {}, "commits": {}}
    sha = hub.commit(REPO, "main", files, "built by a newer aotc")
    with pytest.raises(ManifestError, match=r"launch ABI 2 .*Triton 3\.7\.0.*launches ABI 1"):
        fetch_target(f"hf://{REPO}@{sha}", "sm90")


def _fetch_in_subprocess(source, target="sm90", **popen):
    code = ("import sys; from aotc.loader.hub import fetch_target; "
            "print(fetch_target(sys.argv[1], sys.argv[2]))")
    return subprocess.Popen([sys.executable, "-c", code, source, target], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ), **popen)


def test_interrupted_download_leaves_nothing_trusted(hub, artifacts):
    sha = _pushed(hub, artifacts)
    local = read_manifest(artifacts / "sm90")
    hub.stall_once.add(f"sm90/{local.entries[0].path}")
    proc = _fetch_in_subprocess(f"hf://{REPO}@{sha}")
    try:
        assert hub.stalled.wait(30), proc.stderr.read() if proc.poll() is not None else "no stall"
    finally:
        proc.kill()
        proc.wait()
        hub.release.set()
    storage = hubmod.hub_cache_dir() / "models--org--kern"
    half = storage / "snapshots" / sha / "sm90" / local.entries[0].path
    assert not half.exists()  # only a temporary .incomplete file, which nothing reads

    root = fetch_target(f"hf://{REPO}@{sha}", "sm90")
    _same_content(root / "sm90", artifacts / "sm90")


def test_concurrent_processes_both_get_good_copies(hub, artifacts):
    sha = _pushed(hub, artifacts)
    hub.get_delay = 0.2  # long enough that the two fetches overlap
    procs = [_fetch_in_subprocess(f"hf://{REPO}@{sha}") for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    roots = {out.strip() for out, _ in outs}
    assert len(roots) == 1
    from pathlib import Path

    _same_content(Path(roots.pop()) / "sm90", artifacts / "sm90")
    gets = [r[1] for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]
    assert len(gets) == len(set(gets)) == 3  # manifest + 2 binaries, each downloaded once


def test_concurrent_threads_both_get_good_copies(hub, artifacts):
    from concurrent.futures import ThreadPoolExecutor

    sha = _pushed(hub, artifacts)
    hub.get_delay = 0.1
    with ThreadPoolExecutor(2) as pool:
        roots = list(pool.map(lambda _: fetch_target(f"hf://{REPO}@{sha}", "sm90"), range(2)))
    assert roots[0] == roots[1]
    _same_content(roots[0] / "sm90", artifacts / "sm90")


def test_importing_the_loader_does_not_import_huggingface_hub():
    code = "import sys, aotc.loader, aotc.loader.hub; assert 'huggingface_hub' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
