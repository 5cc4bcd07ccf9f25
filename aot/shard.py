"""`aotc build --shard I/N`: one machine's slice of a build, for builds spread over CI jobs.

Shard I of N (0 <= I < N) takes the variants at positions I, I+N, I+2N, ... of the target's plan:
the build's canonical order (kernels by name, each spec's variants in its table's order, then the
keys of a miss log). Round robin rather than a hash split, so every shard gets its share of each
kernel, and a kernel whose variants compile slowly is spread over all of them. Every shard of a
build runs with the same sources, Triton and options (`--arch`, `--kernel`, `--from-misses`); each
writes `<target>/shard.json` (its index, the count, a digest of the whole plan and its own keys),
and `aotc merge` (aot/merge.py) refuses shards of different plans, a missing shard, or a shard whose
manifest lacks one of its keys.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

SHARD_RECORD = "shard.json"


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    @staticmethod
    def parse(text: str) -> "Shard":
        """'I/N' with 0 <= I < N; ValueError naming --shard otherwise."""
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
        if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
            raise ValueError(f"--shard {text!r}: expected I/N with 0 <= I < N (0/4 ... 3/4 for four shards)")
        return Shard(int(m.group(1)), int(m.group(2)))

    def select(self, planned: list) -> list:
        return planned[self.index::self.count]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def plan_digest(keys: list[str]) -> str:
    """The whole plan of a target (every shard's keys, in order): shards of one build agree on it."""
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()


def record(shard: Shard, plan: list[str], own: list[str]) -> bytes:
    return json.dumps({"index": shard.index, "count": shard.count, "plan": plan_digest(plan), "keys": sorted(own)},
                      sort_keys=True, indent=1).encode()


def read_record(target_dir: Path) -> dict | None:
    """A shard's record, checked for shape; None where the folder holds a whole build."""
    path = Path(target_dir) / SHARD_RECORD
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        ok = (isinstance(doc, dict) and isinstance(doc.get("index"), int) and isinstance(doc.get("count"), int)
              and 0 <= doc["index"] < doc["count"] and isinstance(doc.get("plan"), str)
              and isinstance(doc.get("keys"), list) and all(isinstance(k, str) for k in doc["keys"]))
    except (json.JSONDecodeError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise ValueError(f"{path}: not a shard record aotc build --shard wrote")
    return doc
