"""Shared benchmark plumbing: provenance, long-format rows, host and device timers."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import time
from pathlib import Path


def provenance() -> dict:
    import torch

    # AOTC_COMMIT, else the checkout's .commit (device.sh's carry: the device copy's git state, if
    # any, is not this checkout's), else git.
    stamp = Path(__file__).parent.parent / ".commit"
    commit = os.environ.get("AOTC_COMMIT") or (stamp.read_text().strip() if stamp.is_file() else "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).parent).stdout.strip() or "?"
        except OSError:
            commit = "?"
    info = {"date": datetime.date.today().isoformat(), "commit": commit,
            "torch": torch.__version__}
    try:
        import importlib.metadata

        info["triton"] = importlib.metadata.version("triton")
    except Exception:  # noqa: BLE001
        info["triton"] = "?"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sms=p.multi_processor_count)
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True).stdout.strip()
        except OSError:
            pass
    return info


class Rows:
    """Long-format results: one row per (op, variant, provider, shape, metric)."""

    def __init__(self, path: str | None):
        self.path = path
        self.rows = []
        self.meta = provenance()

    def add(self, op, variant, provider, shape, metric, value):
        row = dict(self.meta, op=op, variant=variant, provider=provider, shape=shape, metric=metric, value=value)
        self.rows.append(row)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")


def host_time_per_call(fn, iters: int = 2000, repeats: int = 7) -> float:
    """Median over repeats of host seconds per call; the device is drained before and after."""
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters)
        torch.cuda.synchronize()
    samples.sort()
    return samples[len(samples) // 2]


class L2Flush:
    """Empties the L2 between timed calls through a 256 MB buffer (five times an H100's L2).

    clean: reads the buffer, so the L2 holds clean lines of other data, as after the weight-reading
    kernels that precede decode in a serving step. dirty: writes zeros to it, as Triton's do_bench
    does; the timed call then also pays for writing up to the whole L2 back to DRAM as its reads
    evict it (H100, ncu: 25 MB of DRAM writes inside decode's split kernel at batch 32 x 4K, next
    to 139 MB of reads; measured in session 6, BENCHMARKS.md's history)."""

    _buffers: dict = {}

    def __init__(self, how: str = "clean", nbytes: int = 256 << 20):
        import torch

        if how not in ("clean", "dirty"):
            raise ValueError(f"flush must be 'clean' or 'dirty', got {how!r}")
        self.how = how
        if nbytes not in self._buffers:
            self._buffers[nbytes] = (torch.ones(nbytes // 4, dtype=torch.int32, device="cuda"),
                                     torch.empty((), dtype=torch.int64, device="cuda"))
        self.buf, self.sink = self._buffers[nbytes]

    def __call__(self):
        import torch

        if self.how == "clean":
            torch.sum(self.buf, 0, dtype=torch.int64, out=self.sink)
        else:
            self.buf.zero_()


def device_time(fn, flush: str = "clean", rep_ms: int = 300, max_reps: int = 1000) -> float:
    """Median device seconds of one call (CUDA events around each call), the L2 emptied before
    every call (L2Flush: `flush` is "clean" or "dirty")."""
    import torch

    empty = L2Flush(flush)
    fn()
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(5):
        fn()
    t1.record()
    torch.cuda.synchronize()
    reps = int(min(max_reps, max(10, rep_ms / max(t0.elapsed_time(t1) / 5, 1e-3))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        empty()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[len(times) // 2] * 1e-3


def chained_time(fn, reps: int = 60, rounds: int = 7) -> float:
    """Device seconds of one call that follows another kernel on the stream with no event between
    them, as in a serving step (device_time puts an event pair around each call): the median over
    rounds of (reps x (flush, fn) - reps x flush) / reps, the L2 emptied by a read (L2Flush)."""
    import torch

    flush = L2Flush("clean")
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(rounds):
        pair = []
        for body in ((lambda: (flush(), fn())), flush):
            torch.cuda.synchronize()
            t0.record()
            for _ in range(reps):
                body()
            t1.record()
            torch.cuda.synchronize()
            pair.append(t0.elapsed_time(t1) * 1e-3 / reps)
        out.append(pair[0] - pair[1])
    return sorted(out)[len(out) // 2]


def kernel_times(fn, iters: int = 20) -> dict:
    """{kernel name: device seconds a call} of one call's kernels (torch.profiler's CUDA kernel
    records; memcpys and the gaps between kernels left out), the mean over `iters` calls after 3
    warm-up calls, L2 not emptied."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    times: dict = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("Memcpy"):
            times[e.name] = times.get(e.name, 0.0) + e.device_time * 1e-6 / iters
    return times


def kernel_time(fn, iters: int = 20) -> float:
    """Device seconds of one call's kernels, summed (`kernel_times`). For a peer whose host side can
    outrun its kernels (device_time then times the host: its events wait on Python between
    launches)."""
    return sum(kernel_times(fn, iters).values())


def timed(rows, op, variant, provider, shape, fn) -> tuple[float, float]:
    """fn's CUDA-event time (device_time: the L2 emptied) and summed kernel time (kernel_time), both
    added to rows as "seconds" and "kernel_seconds"."""
    t, kt = device_time(fn), kernel_time(fn)
    rows.add(op, variant, provider, shape, "seconds", t)
    rows.add(op, variant, provider, shape, "kernel_seconds", kt)
    return t, kt


def copy_bandwidth(nbytes: int = 2 << 30, flush: str = "clean") -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    src.random_(0, 255)
    dst = torch.empty_like(src)
    t = device_time(lambda: dst.copy_(src), flush=flush)
    return 2 * src.numel() / t


def start(description: str | None = None) -> tuple[Rows, float]:
    """The head of a benchmark whose only option is --out: its rows, and the copy bandwidth
    measured (and printed) at the start of the run."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=None, help="append result rows (JSON lines) to this file")
    rows = Rows(ap.parse_args().out)
    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s")
    return rows, copy_bw


def record_build(out: str, seconds: float, jobs: int, summary: str) -> None:
    """Rows of one `aotc build`: its wall seconds (device.sh times it) and, per target and kernel,
    the variants, binaries and bytes of `aotc list --json`'s `summary` (a file), so the build
    figures in BENCHMARKS.md come from a results file like the timings."""
    rows = Rows(out)
    for target, info in sorted(json.loads(Path(summary).read_text()).items()):
        if "error" in info:
            raise ValueError(f"{target}: {info['error']}")
        shape = f"{target} -j{jobs}"
        rows.add("build", "all", "aotc_build", shape, "seconds", seconds)
        rows.add("build", "all", "aotc_build", shape, "binaries", info["binaries"])
        rows.add("build", "all", "aotc_build", shape, "bytes", info["bytes"])
        for kernel, k in sorted(info["kernels"].items()):
            for metric in ("variants", "binaries", "bytes"):
                rows.add("build", kernel, "aotc_build", shape, metric, k[metric])
