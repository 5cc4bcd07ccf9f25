"""A PNG of decode bandwidth per cache format beside the copy bandwidth of the same run, drawn
from bench_decode.py's rows (JSON lines). bench_decode.py --plot PATH calls `plot`; by hand:

    python bench/plot_decode.py bench/results/2026-11-24-h100-b67629e.jsonl --png decode.png

One bar per (format, group) and shape: aotc's GB/s (K, V and scales read once over the full
`loader.decode` call); a tick on each bar: the no-math read of the same bytes on decode's grid
(the layout ceiling), when the run measured it; a dashed line: the device-to-device copy
bandwidth measured at the start of that run. Needs matplotlib (imported inside `plot`; without it
the plot is skipped with a message).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path


def decode_rows(path, commit: str | None = None, head_dim: int = 128) -> tuple[dict, float, dict]:
    """(GB/s by (variant, shape), the copy GB/s of those rows' runs, meta of the first row): the
    newest commit in the file unless `commit` is given; rows at `head_dim` only. Repeats are
    medians; each decode row takes the copy bandwidth of the run it belongs to (the last copy row
    before it in the file)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    commits = [r.get("commit") for r in rows if r.get("op") == "decode" and r.get("provider") == "aot"]
    if not commits:
        raise ValueError(f"{path}: no decode rows (bench_decode.py writes them)")
    commit = commit or commits[-1]
    bw: dict = {}
    ceil: dict = {}
    copies, copy, meta = [], None, None
    for r in rows:
        if r.get("op") == "copy" and r.get("provider") == "torch_copy" and r.get("metric") == "GBps":
            copy = r["value"]
            continue
        if r.get("op") != "decode" or r.get("commit") != commit or f" d{head_dim} " not in f"{r['shape']} ":
            continue
        key = (r["variant"], r["shape"])
        if r["provider"] == "aot" and r["metric"] == "GBps":
            if copy is None:
                raise ValueError(f"{path}: a decode row before any copy row")
            bw.setdefault(key, []).append(r["value"])
            copies.append(copy)
            meta = meta or r
        elif r["provider"] == "layout_ceiling_1head" and r["metric"] == "pct_of_copy" and copy is not None:
            ceil.setdefault(key, []).append(r["value"] * copy / 100)
    if not bw:
        raise ValueError(f"{path}: no aot GB/s rows at commit {commit}, head_dim {head_dim}")
    med = {k: statistics.median(v) for k, v in bw.items()}
    return med, statistics.median(copies), {"meta": meta, "ceiling": {k: statistics.median(v) for k, v in ceil.items()}}


def _short(shape: str) -> str:
    """'b32 ctx4096 h32/8 d128 page16' -> '32 x 4K, page 16'."""
    m = re.search(r"b(\d+) ctx(\d+) .*page(\d+)", shape)
    if not m:
        return shape
    batch, ctx, page = map(int, m.groups())
    return f"{batch} x {ctx // 1024}K, page {page}" + (" head-major" if "head-major" in shape else "")


def plot(rows_path, png_path, commit: str | None = None, head_dim: int = 128) -> Path | None:
    """Draw the PNG; returns its path, or None (with a message) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_decode: matplotlib is not installed; no plot (pip install matplotlib)")
        return None
    bw, copy, extra = decode_rows(rows_path, commit, head_dim)
    meta, ceiling = extra["meta"], extra["ceiling"]
    variants = list(dict.fromkeys(v for v, _ in bw))
    shapes = list(dict.fromkeys(s for _, s in bw))
    width = 0.8 / len(shapes)
    fig, ax = plt.subplots(figsize=(max(8.0, 1.1 * len(variants) + 2), 5.2))
    for i, shape in enumerate(shapes):
        xs = [j + (i - (len(shapes) - 1) / 2) * width for j, v in enumerate(variants) if (v, shape) in bw]
        ys = [bw[(v, shape)] for v in variants if (v, shape) in bw]
        ax.bar(xs, ys, width * 0.92, label=_short(shape))
        cx = [x for x, v in zip(xs, [v for v in variants if (v, shape) in bw]) if (v, shape) in ceiling]
        cy = [ceiling[(v, shape)] for v in variants if (v, shape) in bw and (v, shape) in ceiling]
        ax.scatter(cx, cy, marker="_", s=120, color="black", zorder=3,
                   label="no-math read of the same bytes" if i == 0 and cx else None)
    ax.axhline(copy, color="gray", linestyle="--", linewidth=1.2,
               label=f"device-to-device copy, same run: {copy:.0f} GB/s")
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels([v.replace(" group", "\ngroup ") for v in variants], fontsize=8)
    ax.set_ylabel("GB/s (K, V and scales read once / call time)")
    ax.set_ylim(0, copy * 1.3)  # room for the legend above the bars
    gpu = meta.get("gpu", "?")
    ax.set_title(f"loader.decode bandwidth per cache format, head_dim {head_dim}, 32/8 heads\n"
                 f"{gpu}, commit {meta.get('commit', '?')}, {meta.get('date', '?')}, "
                 f"torch {meta.get('torch', '?')}, Triton {meta.get('triton', '?')}", fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    png_path = Path(png_path)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    print(f"plot_decode: wrote {png_path}")
    return png_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", help="bench_decode.py's rows (JSON lines)")
    ap.add_argument("--png", required=True, help="where to write the plot")
    ap.add_argument("--commit", default=None, help="rows of this commit (default: the newest decode rows' commit)")
    ap.add_argument("--head-dim", type=int, default=128)
    a = ap.parse_args()
    plot(a.rows, a.png, a.commit, a.head_dim)


if __name__ == "__main__":
    main()
