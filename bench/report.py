"""BENCHMARKS.md's current tables, printed as markdown from the benchmarks' rows (JSON lines), so
every figure there is read from a results file, not typed:

    python bench/report.py decode bench/results/2026-11-24-h100-b67629e.jsonl
    python bench/report.py layouts bench/results/2026-11-24-h100-c0cb309-head-major.jsonl
    python bench/report.py prefill bench/results/2026-11-25-h100-03d3b89-prefix-prefill.jsonl
    python bench/report.py launch bench/results/2026-11-27-h100-cbe769c-launch-overhead.jsonl
    python bench/report.py launch bench/results/2026-11-24-h100-b67629e.jsonl    (its first-call rows)
    python bench/report.py build $OUT/bench.jsonl        (runs since device.sh records the build)
    python bench/report.py mla bench/results/2026-11-26-h100-ee4dd65-mla.jsonl

Each table takes the rows of one run (one commit; the first run in the file unless --commit).
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def load(path, commit: str | None = None) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    commit = commit or next(r["commit"] for r in rows if r.get("op") != "copy")
    return [r for r in rows if r.get("commit") == commit]


def provenance(rows: list[dict]) -> str:
    r = rows[0]
    copies = sorted({round(x["value"]) for x in rows if x["op"] == "copy" and x["provider"] == "torch_copy"})
    copy = f"; device-to-device copy {' / '.join(map(str, copies))} GB/s" if copies else ""
    return (f"{r.get('gpu', '?')} ({r.get('sms', '?')} SMs, driver {r.get('driver', '?')}), torch {r.get('torch')}, "
            f"Triton {r.get('triton')}, commit {r['commit']}, {r['date']}{copy}")


def _value(rows, **match):
    found = [r["value"] for r in rows if all(r.get(k) == v for k, v in match.items())]
    return found[0] if found else None


def kv_bytes(fmt: str, group: int, batch: int, ctx: int, kv_heads: int = 8, head_dim: int = 128) -> int:
    """K, V and scale bytes of one decode call, as bench_decode.make counts them (bf16 scales)."""
    tokens = batch * ctx * kv_heads
    if fmt == "bf16":
        return 2 * tokens * head_dim * 2
    width = head_dim // 2 if fmt == "int4" else head_dim
    return 2 * tokens * width + 2 * tokens * (head_dim // group) * 2


_SHAPE = re.compile(r"b(\d+) ctx(\d+) h(\d+)/(\d+) d(\d+) page(\d+)")


def decode(rows: list[dict], head_dim: int = 128) -> str:
    out = ["| format | group | batch x context | **aot µs** | GB/s | **% of copy** | chained | JIT time / aot | "
           "no-math read, % of copy | aot / read |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["op"] != "decode" or r["provider"] != "aot" or r["metric"] != "GBps":
            continue
        m = _SHAPE.search(r["shape"])
        if not m or int(m.group(5)) != head_dim:
            continue
        batch, ctx, _, kv_heads, hd, page = map(int, m.groups())
        fmt, _, group = r["variant"].partition(" group")
        group = int(group or 0)
        same = dict(op="decode", variant=r["variant"], shape=r["shape"])
        pct = _value(rows, provider="aot", metric="pct_of_copy", **same)
        chained = _value(rows, provider="aot_chained", metric="pct_of_copy", **same)
        jit = _value(rows, provider="jit", metric="GBps", **same)
        read = _value(rows, provider="layout_ceiling_1head", metric="pct_of_copy", **same)
        us = kv_bytes(fmt, group or hd, batch, ctx, kv_heads, hd) / (r["value"] * 1e9) * 1e6
        ctx_text = f"{ctx // 1024}K" + ("" if page == 16 else f" (page {page})")
        out.append(f"| {fmt} | {group or '-'} | {batch} x {ctx_text} | {us:.0f} | {r['value']:.0f} | **{pct:.1f}** | "
                   f"{chained:.1f} | {r['value'] / jit:.2f} | "
                   + (f"{read:.1f} | {pct / read:.2f} |" if read else "- | - |"))
    return "\n".join(out)


def layouts(rows: list[dict]) -> str:
    """Token-major against head-major caches, % of copy, from one run of both layouts."""
    cells: dict = {}
    for r in rows:
        if r["op"] == "decode" and r["provider"] == "aot" and r["metric"] == "pct_of_copy":
            m = _SHAPE.search(r["shape"])
            key = (r["variant"], f"{m.group(1)} x {int(m.group(2)) // 1024}K")
            cells.setdefault(key, {})["hnd" if "head-major" in r["shape"] else "nhd"] = r["value"]
    shapes = list(dict.fromkeys(s for _, s in cells))
    out = ["| format | " + " | ".join(shapes) + " |", "|---|" + "---|" * len(shapes)]
    for variant in dict.fromkeys(v for v, _ in cells):
        out.append(f"| {variant} | " + " | ".join(
            f"{cells[(variant, s)]['nhd']:.1f} -> **{cells[(variant, s)]['hnd']:.1f}**" if (variant, s) in cells else "-"
            for s in shapes) + " |")
    return "\n".join(out)


def prefill(rows: list[dict]) -> str:
    out = ["| shape (bf16 q, 32/8 heads, d128) | cache | **aot ms** | aot TF/s | JIT TF/s | SDPA flash TF/s | "
           "**aot / SDPA** | aot / JIT |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["op"] != "prefix_prefill" or r["provider"] != "aot" or r["metric"] != "tflops":
            continue
        same = dict(op="prefix_prefill", variant=r["variant"], shape=r["shape"], metric="tflops")
        ms = _value(rows, op="prefix_prefill", variant=r["variant"], shape=r["shape"], provider="aot", metric="ms")
        jit, sdpa = _value(rows, provider="jit", **same), _value(rows, provider="sdpa_flash", **same)
        cache = r["variant"].split(",")[1].replace("same", "bf16") + (" (vLLM layout)" if "vllm" in r["variant"] else "")
        out.append(f"| {r['shape'].replace(' h32/8', '')} | {cache} | {ms:.3f} | {r['value']:.1f} | {jit:.1f} | "
                   f"{sdpa:.1f} | **{r['value'] / sdpa:.2f}** | {r['value'] / jit:.2f} |")
    return "\n".join(out)


def launch(rows: list[dict]) -> str:
    """bench/launch_overhead.py: host time per op call, each op's paths against its bare launches."""
    paths = (("bare_same_calls", "bare prepacked launches"), ("bare_cuLaunchKernel", "bare, cuLaunchKernel only"),
             ("aot_plan_run", "plan `.run`"),
             ("aot_eager", "eager `loader.<op>(validate=False)`"), ("triton_jit", "Triton JIT, same kernels"))
    out = ["| op (shape) | " + " | ".join(text for _, text in paths) + " |", "|---" * (len(paths) + 1) + "|"]
    ops = dict.fromkeys((r["op"], r["variant"]) for r in rows if r.get("metric") == "host_us_per_call")
    for op, variant in ops:
        cells = []
        for provider, _ in paths:
            us = _value(rows, op=op, variant=variant, provider=provider, metric="host_us_per_call")
            ratio = _value(rows, op=op, variant=variant, provider=provider, metric="ratio_vs_bare")
            cells.append("—" if us is None else f"{us:.2f} µs" + (f" ({ratio:.2f}x)" if ratio is not None else ""))
        out.append(f"| {op} ({variant}) | " + " | ".join(cells) + " |")
    first = {"aot": "AOT, `validate=False`", "aot_validated": "AOT, default value check",
             "import_ops_ms": "`from aotc import loader` + importing the op module",
             "jit_warm_cache": "Triton JIT, warm cache", "jit_cold_cache": "Triton JIT, empty cache"}
    out += ["", "| first `loader.decode` in a fresh process | ms, median of 5 |", "|---|---|"]
    for provider, text in first.items():
        ms = _value(rows, shape="first_call", provider=provider, metric="ms_median")
        if ms is not None:
            out.append(f"| {text} | {ms:.2f} |")
    return "\n".join(out)


def build(rows: list[dict]) -> str:
    """device.sh's build rows (harness.record_build): seconds, and variants / binaries / bytes a kernel."""
    out = ["| target | kernel | variants | binaries | bytes | build seconds |", "|---|---|---|---|---|---|"]
    for shape in dict.fromkeys(r["shape"] for r in rows if r["op"] == "build"):
        get = lambda kernel, metric: _value(rows, op="build", variant=kernel, shape=shape, metric=metric)  # noqa: E731
        kernels = dict.fromkeys(r["variant"] for r in rows if r["op"] == "build" and r["shape"] == shape)
        for kernel in [k for k in kernels if k != "all"] + ["all"]:
            variants = get(kernel, "variants")
            out.append(f"| {shape} | {kernel} | {variants if variants is not None else '-'} | {get(kernel, 'binaries')} | "
                       f"{get(kernel, 'bytes'):,} | " + (f"{get(kernel, 'seconds'):.0f} |" if kernel == "all" else "|"))
    return "\n".join(out)


def mla(rows: list[dict]) -> str:
    """bench_mla.py's rows: aotc (its split count) and vLLM, % of the run's copy, speed ratio, TFLOP/s."""
    out = ["| heads | batch x context | aotc splits | aotc us | % of copy | vLLM us | % of copy | aotc / vLLM | "
           "aotc TFLOP/s |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for shape in dict.fromkeys(r["shape"] for r in rows if r["op"] == "mla_decode" and r["provider"] == "aot"):
        batch, heads, ctx = re.match(r"B(\d+)xH(\d+)x(\d+)", shape).groups()
        get = lambda p, m: _value(rows, op="mla_decode", provider=p, shape=shape, metric=m)  # noqa: E731
        us, vus = get("aot", "us"), get("vllm", "us")
        vllm = f"{vus:.1f} | {get('vllm', 'pct_copy'):.1f} | {vus / us:.2f}x" if vus else "- | - | -"
        out.append(f"| {heads} | {batch} x {int(ctx) // 1024}K | {get('aot', 'splits')} | {us:.1f} | "
                   f"{get('aot', 'pct_copy'):.1f} | {vllm} | {get('aot', 'TFLOPs'):.1f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table", choices=("decode", "layouts", "prefill", "launch", "build", "mla"))
    ap.add_argument("rows")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--head-dim", type=int, default=128)
    a = ap.parse_args()
    rows = load(a.rows, a.commit)
    print(provenance(rows) + "\n")
    print(decode(rows, a.head_dim) if a.table == "decode" else globals()[a.table](rows))


if __name__ == "__main__":
    main()
