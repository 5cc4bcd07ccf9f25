"""`aotc check-reproducible`: build the same variants twice, each in a fresh Triton cache and a
process with another hash seed, and compare every binary's sha256. A release step (RELEASING in
the README): a binary that differs between two builds of one commit breaks "the AOT binary is what
the JIT compiles" and the hub's content addressing."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from aotc.loader.manifest import read_manifest


@dataclass
class Comparison:
    compared: int = 0  # keys built in both
    differ: list[str] = field(default_factory=list)  # "target key: sha256 a != b"
    only_one: list[str] = field(default_factory=list)  # keys one build has and the other lacks
    failed: list[str] = field(default_factory=list)  # a build's error output

    @property
    def ok(self) -> bool:
        return not (self.differ or self.only_one or self.failed)


def compare_folders(a: Path, b: Path, archs: Iterable[str]) -> Comparison:
    """Compare the manifests of two artifacts folders, target by target, key by key."""
    out = Comparison()
    for arch in archs:
        first = {e.key: e.sha256 for e in read_manifest(Path(a) / arch).entries}
        second = {e.key: e.sha256 for e in read_manifest(Path(b) / arch).entries}
        out.only_one += [f"{arch} {k}" for k in sorted(set(first) ^ set(second))]
        for key in sorted(set(first) & set(second)):
            out.compared += 1
            if first[key] != second[key]:
                out.differ.append(f"{arch} {key}: {first[key]} != {second[key]}")
    return out


def double_build(archs: Iterable[str], kernels: Iterable[str] = (), jobs: int | None = None,
                 work: str | os.PathLike | None = None, timeout: float | None = None) -> Comparison:
    """Two `aotc build` processes into two folders under `work` (a temporary folder by default),
    each with an empty TRITON_CACHE_DIR and its own PYTHONHASHSEED, then compare_folders."""
    archs = list(dict.fromkeys(archs))
    with tempfile.TemporaryDirectory(prefix="aotc-repro-", dir=work) as tmp:
        tmp = Path(tmp)
        out = Comparison()
        for run, seed in (("a", "1"), ("b", "2")):
            env = dict(os.environ, TRITON_CACHE_DIR=str(tmp / f"cache-{run}"), PYTHONHASHSEED=seed)
            cmd = [sys.executable, "-m", "aotc.aot.cli", "build", "--out", str(tmp / run), "--quiet"]
            cmd += [f"--arch={a}" for a in archs] + [f"--kernel={k}" for k in kernels]
            cmd += [f"-j{jobs}"] if jobs else []
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            if done.returncode:
                out.failed.append(f"build {run} exited {done.returncode}:\n{done.stderr[-4000:]}")
                return out
        return compare_folders(tmp / "a", tmp / "b", archs)
