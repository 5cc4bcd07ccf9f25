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

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip() or os.environ.get("AOTC_COMMIT", "?")
    except OSError:
        commit = os.environ.get("AOTC_COMMIT", "?")
    info = {"date": datetime.date.today().isoformat(), "commit": os.environ.get("AOTC_COMMIT", commit),
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


def device_time(fn, warmup_ms: int = 50, rep_ms: int = 300) -> float:
    """Median device seconds per call (CUDA events, via triton.testing.do_bench)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e-3


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    src.random_(0, 255)
    dst = torch.empty_like(src)
    t = device_time(lambda: dst.copy_(src))
    return 2 * src.numel() / t
