"""Where a small-batch decode call's time goes: split kernel, merge kernel, and the gaps around
them (torch.profiler kernel records, L2 emptied before each call), beside the CUDA-event time of
the call and of a CUDA graph replaying it, and a call over zero-length requests (the launches
and the first dependent reads, no cache traffic).

    python3 profile_batch1.py [--out ROWS]

Shapes: decode 32 query / 8 KV heads, D 128, page 16 (bf16, int8 one scale a token, int4 groups
of 8) at batch 1 x 8K and 32K; MLA 16 heads over the bf16 latent cache at 1 x 4K, 1 x 32K, 32 x 4K.
"""
from __future__ import annotations

import argparse
import statistics
import warnings

import torch

from aotc import loader
from bench_decode import make
from bench_mla import D_QK, D_V, problem
from harness import L2Flush, Rows, copy_bandwidth, device_time

DECODE = [(fmt, g, 1, ctx) for fmt, g in (("bf16", 0), ("int8", 128), ("int4", 8)) for ctx in (8192, 32768)]
MLA = [(16, 1, 4096), (16, 1, 32768), (16, 32, 4096)]


def graph_time(fn) -> float:
    """Event time of a CUDA graph of one call, replayed after an L2 flush."""
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return device_time(g.replay, rep_ms=100)


def kernel_split(fn, reps: int = 30) -> dict:
    """Median per call of: each kernel's duration (by name), the gap from the flush's end to the
    first kernel's start, between consecutive kernels (negative: overlap under PDL), and the span
    from the first kernel's start to the last one's end."""
    flush = L2Flush("clean")
    for _ in range(3):
        flush()
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            fn()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                     and e.device_time_total > 0 and "Memcpy" not in e.name and "Memset" not in e.name),
                    key=lambda e: e.time_range.start)
    calls, cur = [], None
    for e in events:
        if "split" not in e.name and "merge" not in e.name and "fused" not in e.name:  # the flush
            cur = {"flush_end": e.time_range.end, "k": []}
            calls.append(cur)
        elif cur is not None:
            cur["k"].append(e)
    out: dict = {}
    for c in calls:
        ks = c["k"]
        if not ks:
            continue
        rec = {"lead_gap": ks[0].time_range.start - c["flush_end"],
               "span": ks[-1].time_range.end - ks[0].time_range.start}
        for i, e in enumerate(ks):
            name = "split" if i == 0 else ("merge" if i == 1 else f"k{i}")
            rec[name] = e.time_range.end - e.time_range.start
            if i:
                rec[f"gap{i}"] = e.time_range.start - ks[i - 1].time_range.end
        rec["names"] = "|".join(e.name[:40] for e in ks)
        for k, v in rec.items():
            out.setdefault(k, []).append(v)
    return {k: (statistics.median(v) if k != "names" else v[0]) for k, v in out.items()}


def report(rows, label, variant, shape, fn, zero_fn, nbytes, copy_bw):
    ev = device_time(fn, rep_ms=100)
    gr = graph_time(fn)
    z = device_time(zero_fn, rep_ms=100)
    ks = kernel_split(fn)
    zk = kernel_split(zero_fn)
    line = (f"{label:>6} {shape:>14}: event {ev * 1e6:6.1f} us ({100 * nbytes / ev / copy_bw:5.1f}%) graph "
            f"{gr * 1e6:6.1f} | zero-len event {z * 1e6:5.1f} | split {ks.get('split', 0):6.1f} merge "
            f"{ks.get('merge', 0):5.1f} lead {ks.get('lead_gap', 0):5.1f} gap {ks.get('gap1', 0):5.1f} span "
            f"{ks.get('span', 0):6.1f} | zero: split {zk.get('split', 0):4.1f} merge {zk.get('merge', 0):4.1f} "
            f"span {zk.get('span', 0):4.1f}")
    print(line, flush=True)
    for metric, value in (("event_us", ev * 1e6), ("graph_us", gr * 1e6), ("zero_len_event_us", z * 1e6),
                          ("pct_copy", 100 * nbytes / ev / copy_bw), ("pct_copy_graph", 100 * nbytes / gr / copy_bw)):
        rows.add(label, variant, "aot", shape, metric, value)
    for k, v in ks.items():
        if k != "names":
            rows.add(label, variant, "aot", shape, f"prof_{k}_us", v)
    for k, v in zk.items():
        if k != "names":
            rows.add(label, variant, "aot", shape, f"zero_prof_{k}_us", v)
    print("        kernels:", ks.get("names"), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default="", help="decode, mla (default both)")
    a = ap.parse_args()
    rows = Rows(a.out)
    copy_bw = copy_bandwidth()
    print(f"copy {copy_bw / 1e9:.0f} GB/s")
    rows.add("copy", "d2d", "copy", "2GiB", "GBps", copy_bw / 1e9)
    one = torch.zeros(1, device="cuda")  # the floor of one launch timed this way
    floor = device_time(lambda: one.add_(1.0), rep_ms=100)
    print(f"one-element add (a launch): event {floor * 1e6:.1f} us")
    rows.add("launch", "add_1", "torch", "1", "event_us", floor * 1e6)
    warnings.simplefilter("ignore")
    if a.only in ("", "decode"):
        for fmt, group, batch, ctx in DECODE:
            args, kw, nbytes = make(fmt, batch, ctx, 32, 8, 128, 16, group=group or 64)
            out = torch.empty_like(args[0])
            zero = torch.zeros_like(args[4])
            zargs = (*args[:4], zero)
            report(rows, "decode", f"{fmt} group{group}" if group else fmt, f"b{batch} ctx{ctx}",
                   lambda: loader.decode(*args, **kw, out=out, validate=False),
                   lambda: loader.decode(*zargs, **kw, out=out, validate=False), nbytes, copy_bw)
            del args, kw, out
            torch.cuda.empty_cache()
    if a.only in ("", "mla"):
        for heads, batch, ctx in MLA:
            q, kv, table, lens = problem(batch, heads, ctx)
            out = torch.empty(batch, heads, D_V, dtype=q.dtype, device="cuda")
            zero = torch.zeros_like(lens)
            report(rows, "mla", f"h{heads}", f"b{batch} ctx{ctx}",
                   lambda: loader.mla_decode(q, kv, table, lens, v_head_dim=D_V, out=out, validate=False),
                   lambda: loader.mla_decode(q, kv, table, zero, v_head_dim=D_V, out=out, validate=False),
                   batch * ctx * D_QK * 2, copy_bw)
            del q, kv, table, lens
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
