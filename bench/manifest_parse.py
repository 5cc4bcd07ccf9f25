"""What the loader's first call pays for the manifest: `read_manifest` (read, json.loads, checks)
plus `Manifest.get` of two keys, median of N runs in this process. CPU only, no torch.

    python bench/manifest_parse.py artifacts/sm90            # or .../sm90/manifest.json
    python bench/manifest_parse.py artifacts/sm90 --key 'decode_split(...)@aligned' --key ...

Without --key it gets the first key of the first two kernels (a decode call's split + merge).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from aotc.loader.manifest import MANIFEST_NAME, read_manifest


def default_keys(keys: list[str]) -> list[str]:
    firsts: dict[str, str] = {}
    for key in keys:
        firsts.setdefault(key.split("(", 1)[0], key)
    return list(firsts.values())[:2]


def measure(folder: Path, keys: list[str] | None = None, runs: int = 50, read=read_manifest) -> dict:
    """Median and min ms of `read(folder)` + `get` of each key; `read` may be another reader."""
    keys = keys or default_keys(read(folder).keys())
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        m = read(folder)
        found = [m.get(k) for k in keys]
        times.append(time.perf_counter() - start)
        assert all(found), f"{folder}: no entry for {[k for k, e in zip(keys, found) if e is None]}"
        entries = len(m.keys())
        del m, found  # else the next parse runs with two manifests alive, and the GC walks both
    size = (folder / MANIFEST_NAME).stat().st_size
    return {"bytes": size, "entries": entries, "keys": keys, "median_ms": statistics.median(times) * 1e3,
            "min_ms": min(times) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("manifest", type=Path, help="a target folder or its manifest.json")
    ap.add_argument("--key", action="append", help="keys to get (default: two, see above)")
    ap.add_argument("--runs", type=int, default=50)
    a = ap.parse_args()
    folder = a.manifest.parent if a.manifest.name == MANIFEST_NAME else a.manifest
    r = measure(folder, a.key, a.runs)
    print(f"{folder / MANIFEST_NAME}: {r['entries']} entries, {r['bytes']} bytes; read_manifest + get of "
          f"{len(r['keys'])} keys: median {r['median_ms']:.3f} ms, min {r['min_ms']:.3f} ms over {a.runs} runs")


if __name__ == "__main__":
    main()
