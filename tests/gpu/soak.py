"""Decode soak: many eager calls with changing shapes from 4 threads on 2 streams.

    python tests/gpu/soak.py [--calls 1000000] [--threads 4] [--streams 2] [--json PATH]

Six inputs of different batch, lengths and cache formats (bf16, int8, int4, fp8) are made once;
each thread cycles through them on its stream (threads t and t + 2 share stream t % 2, so two
threads interleave their launches on one stream), with `validate=True` every 64th call. Each
thread's outputs are compared bit for bit with a single-threaded run of the same inputs every
`--check-every` calls and at the end. Reported before (after a warm-up pass) and after: host RSS,
torch.cuda.memory_allocated, the decode plan cache's size. Exit 1 on any mismatch or growth:
allocated bytes must not change, the plan cache must not grow past the warm-up's, RSS may
grow by at most --rss-slack-mb (the Python heap's own churn).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # tests.cpu.* case builders

import aotc.loader.ops.decode as decode_mod  # noqa: E402
from aotc.loader.ops.decode import decode  # noqa: E402

SHAPES = [  # (format, lengths): batch and lengths change from one call to the next
    ("bf16", [1]), ("bf16", [17, 300, 64, 1000]), ("int8", [5, 129, 700]), ("int4", [255, 256]),
    ("fp8_e4m3", [33, 0, 96, 400, 2]), ("bf16", [4096]),
]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_inputs(seed: int = 0):
    from tests.cpu.kernels.decode.cases import make_case

    cases = []
    for i, (fmt, lens) in enumerate(SHAPES):
        case = make_case(lens, fmt=fmt, head_dim=128, kv_heads=2, group=4, page_size=16, req_idx=i % 2 == 1,
                         device="cuda", seed=seed + i)
        cases.append(case)
    return cases


def call(case, out, validate):
    return decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, validate=validate,
                  **case.kwargs)


def soak(calls: int = 1_000_000, threads: int = 4, streams: int = 2, check_every: int = 10_000,
         rss_slack_mb: float = 64.0) -> dict:
    cases = make_inputs()
    expected = [call(c, torch.empty_like(c.q), True).clone() for c in cases]  # single-threaded, default stream
    torch.cuda.synchronize()
    pool = [torch.cuda.Stream() for _ in range(streams)]
    outs = [[torch.empty_like(c.q) for c in cases] for _ in range(threads)]
    mismatches: list[str] = []
    errors: list[BaseException] = []
    per_thread = calls // threads

    def check(t: int, stream) -> None:
        stream.synchronize()
        for i, (got, want) in enumerate(zip(outs[t], expected)):
            if not torch.equal(got, want):
                mismatches.append(f"thread {t} input {i} ({SHAPES[i][0]}, lens {SHAPES[i][1]}): "
                                  f"{(got != want).sum().item()} elements differ from the single-threaded run")

    def worker(t: int, n: int) -> None:
        stream = pool[t % streams]
        try:
            with torch.cuda.stream(stream):
                for j in range(n):
                    i = (t + j) % len(cases)
                    call(cases[i], outs[t][i], j % 64 == 0)
                    if check_every and j and j % check_every == 0:
                        check(t, stream)
            check(t, stream)
        except BaseException as e:  # noqa: BLE001 - reported after the join
            errors.append(e)

    def run(n_each: int) -> float:
        started = time.perf_counter()
        ts = [threading.Thread(target=worker, args=(t, n_each)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        torch.cuda.synchronize()
        return time.perf_counter() - started

    run(4 * len(cases))  # warm-up: every plan, workspace and stream lock exists afterwards
    import gc

    gc.collect()
    before = {"rss": rss_bytes(), "cuda_allocated": torch.cuda.memory_allocated(), "plans": len(decode_mod._plans)}
    seconds = run(per_thread)
    gc.collect()
    after = {"rss": rss_bytes(), "cuda_allocated": torch.cuda.memory_allocated(), "plans": len(decode_mod._plans)}
    report = {"calls": per_thread * threads, "threads": threads, "streams": streams, "seconds": round(seconds, 2),
              "calls_per_s": round(per_thread * threads / seconds), "before": before, "after": after,
              "max_plans": decode_mod._plans.limit, "mismatches": mismatches[:20], "n_mismatches": len(mismatches),
              "errors": [repr(e) for e in errors], "gpu": torch.cuda.get_device_name()}
    problems = []
    if mismatches or errors:
        problems.append("results differ from the single-threaded run or a call failed")
    if after["cuda_allocated"] != before["cuda_allocated"]:
        problems.append(f"device memory grew {before['cuda_allocated']} -> {after['cuda_allocated']} bytes")
    if after["plans"] > before["plans"]:
        problems.append(f"plan cache grew {before['plans']} -> {after['plans']}")
    if after["rss"] - before["rss"] > rss_slack_mb * 2 ** 20:
        problems.append(f"host RSS grew {(after['rss'] - before['rss']) / 2 ** 20:.1f} MB")
    report["problems"] = problems
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--check-every", type=int, default=10_000)
    parser.add_argument("--rss-slack-mb", type=float, default=64.0)
    parser.add_argument("--json", default=None, help="append the report as one JSON line here")
    a = parser.parse_args()
    report = soak(a.calls, a.threads, a.streams, a.check_every, a.rss_slack_mb)
    line = json.dumps(report)
    print(line)
    if a.json:
        with open(a.json, "a") as f:
            f.write(line + "\n")
    if report["problems"]:
        print("SOAK FAILED: " + "; ".join(report["problems"]), file=sys.stderr)
        sys.exit(1)
    print(f"soak ok: {report['calls']} calls in {report['seconds']} s ({report['calls_per_s']}/s), "
          f"RSS {report['before']['rss'] / 2 ** 20:.1f} -> {report['after']['rss'] / 2 ** 20:.1f} MB, "
          f"CUDA allocated {report['before']['cuda_allocated']} -> {report['after']['cuda_allocated']} B, "
          f"plans {report['before']['plans']} -> {report['after']['plans']}")


if __name__ == "__main__":
    main()
