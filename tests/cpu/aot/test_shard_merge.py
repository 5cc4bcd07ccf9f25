"""`aotc build --shard I/N` and `aotc merge`: shards of a build merge into the bytes a single machine's
build writes (manifest and binaries), and merge refuses shards that do not make one whole build."""
import json
import shutil

import pytest

from aotc.aot.build import build
from aotc.aot.merge import MergeError, merge
from aotc.aot.shard import SHARD_RECORD, Shard
from aotc.loader.manifest import read_manifest, verify_files

from .conftest import run_cli

TARGETS = ("sm80", "sm90")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """The tiny kernel built for sm80 and sm90 as three shards, through the command line."""
    root = tmp_path_factory.mktemp("shards")
    dirs = [root / f"s{i}" for i in range(3)]
    for i, d in enumerate(dirs):
        res = run_cli("build", "--arch", "sm80", "--arch", "sm90", "--kernel", "tiny_axpy", "--shard", f"{i}/3",
                      "--out", d, "--jobs", "1", "--quiet")
        assert res.returncode == 0, res.stderr
    return dirs


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


def test_shards_split_the_plan_round_robin(shards, tiny_artifacts):
    for target in TARGETS:
        whole = sorted(read_manifest(tiny_artifacts / target).by_key())
        parts = [json.loads((d / target / SHARD_RECORD).read_text()) for d in shards]
        assert [len(p["keys"]) for p in parts] == [3, 3, 2]
        assert sorted(k for p in parts for k in p["keys"]) == whole  # disjoint, and together the whole plan
        assert len({p["plan"] for p in parts}) == 1 and [p["index"] for p in parts] == [0, 1, 2]
        for d, p in zip(shards, parts):
            assert sorted(read_manifest(d / target).by_key()) == p["keys"]


def test_merged_shards_are_byte_identical_to_the_single_machine_build(shards, tiny_artifacts, tmp_path):
    out = tmp_path / "merged"
    res = run_cli("merge", out, *shards)
    assert res.returncode == 0, res.stderr
    for target in TARGETS:
        merged, single = _files(out / target), _files(tiny_artifacts / target)
        assert merged.keys() == single.keys() and "manifest.json" in merged and SHARD_RECORD not in merged
        assert merged == single  # the manifest's bytes and every binary's
        assert verify_files(out / target) == []
    # the build records came along: building the whole into the merged folder compiles nothing
    report = build(out, TARGETS, kernels=["tiny_axpy"], jobs=1, progress=False)
    assert report.compiled == [] and len(report.reused) == 16
    assert _files(out / "sm90") == _files(tiny_artifacts / "sm90")


def _copy(shards, tmp_path):
    dirs = [tmp_path / d.name for d in shards]
    for src, dst in zip(shards, dirs):
        shutil.copytree(src, dst)
    return dirs


def test_merge_refuses_a_missing_or_repeated_shard(shards, tmp_path):
    with pytest.raises(MergeError, match=r"shard\(s\) 1/3 missing; have 0/3, 2/3"):
        merge(tmp_path / "out", [shards[0], shards[2]])
    with pytest.raises(MergeError, match="shard 0/3 given twice"):
        merge(tmp_path / "out", [shards[0], *_copy(shards[:1], tmp_path), shards[1], shards[2]])
    assert not (tmp_path / "out").exists()


def test_merge_refuses_shards_of_different_builds_and_an_incomplete_shard(shards, tmp_path):
    dirs = _copy(shards, tmp_path)
    record = dirs[1] / "sm90" / SHARD_RECORD
    doc = json.loads(record.read_text())
    record.write_text(json.dumps({**doc, "plan": "0" * 64}))
    with pytest.raises(MergeError, match="come from different builds"):
        merge(tmp_path / "out", dirs)
    record.write_text(json.dumps({**doc, "keys": doc["keys"] + ["tiny_axpy(block=4096,dtype=fp16)@aligned"]}))
    with pytest.raises(MergeError, match="lacks 1 of its variants"):
        merge(tmp_path / "out", dirs)


def test_merge_refuses_a_tampered_binary_before_writing_anything(shards, tmp_path):
    dirs = _copy(shards, tmp_path)
    binary = next((dirs[2] / "sm80" / "bin").iterdir())
    data = bytearray(binary.read_bytes())
    data[len(data) // 2] ^= 0xFF
    binary.write_bytes(bytes(data))
    with pytest.raises(MergeError, match="not the binary its manifest names"):
        merge(tmp_path / "out", dirs)
    assert not (tmp_path / "out" / "sm80" / "manifest.json").exists()


def test_a_whole_build_merges_alone_and_not_beside_shards(shards, tiny_artifacts, tmp_path):
    report = merge(tmp_path / "out", [tiny_artifacts])
    assert report.targets == {"sm80": 8, "sm90": 8}
    assert _files(tmp_path / "out" / "sm90") == _files(tiny_artifacts / "sm90")
    with pytest.raises(MergeError, match="holds a whole build"):
        merge(tmp_path / "out2", [tiny_artifacts, *shards])


@pytest.mark.parametrize("text", ["3/3", "1/0", "-1/2", "a/b", "2"])
def test_a_bad_shard_is_a_usage_error(text):
    with pytest.raises(ValueError, match="--shard"):
        Shard.parse(text)
    res = run_cli("build", "--arch", "sm90", "--kernel", "tiny_axpy", "--shard", text, "--out", "/nonexistent/x")
    assert res.returncode == 2 and "--shard" in res.stderr
