"""The JIT fallback: run a variant that was not built through Triton, warn once, log the miss.

Triton is imported here, inside the functions, and only when a fallback actually happens (or
when the ops run on CPU tensors under `TRITON_INTERPRET=1`). The miss log is JSON lines at
`AOTC_MISS_LOG`, by default `$XDG_CACHE_HOME/aotc/misses.jsonl` (`~/.cache/aotc/...`);
`aotc build --from-misses FILE` compiles what it lists. `AOTC_DISABLE_JIT=1` turns a miss into
an error naming the key and the command that would build it.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Mapping, Sequence

from aotc.kernels.variants import GENERIC, KernelSpec, VariantKey


class MissingVariantError(RuntimeError):
    """A variant that was not built, with JIT disabled."""


class AotcJitFallbackWarning(UserWarning):
    pass


def miss_log_path() -> Path:
    if os.environ.get("AOTC_MISS_LOG"):
        return Path(os.environ["AOTC_MISS_LOG"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "aotc" / "misses.jsonl"


def jit_disabled() -> bool:
    return os.environ.get("AOTC_DISABLE_JIT", "") not in ("", "0")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def record_miss(key: VariantKey, target: str, reason: str) -> None:
    """Raise if JIT is disabled; else warn once per key and append it to the miss log."""
    if jit_disabled():
        raise MissingVariantError(
            f"no built binary for {key} on {target} ({reason}) and AOTC_DISABLE_JIT is set. "
            f"Build it with: aotc build --arch {target} --from-misses FILE, where FILE holds the line "
            f'{json.dumps({"key": str(key), "target": target})}')
    ident = (str(key), target)
    with _lock:
        if ident in _warned:
            return
        _warned.add(ident)
        path = miss_log_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"key": str(key), "target": target, "reason": reason, "time": time.time()})
            with open(path, "a") as f:  # one short write per line: appends from processes don't interleave
                f.write(line + "\n")
        except OSError as e:
            reason += f"; could not write the miss log {path}: {e}"
    warnings.warn(f"aotc: {key} is not built for {target} ({reason}); running it through the Triton JIT. "
                  f"Logged to {miss_log_path()}; `aotc build --arch {target} --from-misses "
                  f"{miss_log_path()}` builds it.", AotcJitFallbackWarning, stacklevel=4)


def read_misses(path: str | os.PathLike) -> list[tuple[VariantKey, str | None]]:
    """The (key, target) pairs of a miss log, in order, without repeats."""
    out, seen = [], set()
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            item = (VariantKey.parse(doc["key"]).with_level(GENERIC), doc.get("target"))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a miss record: {e}") from None
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def jit_function(spec: KernelSpec):
    return getattr(importlib.import_module(spec.module), spec.function)


@contextlib.contextmanager
def aot_compile_options():
    """Compile as `aotc build` does: without line info, whose file paths would make the bytes
    depend on where the sources sit (the build sets the same switch in its workers). The knob
    is process-wide while this runs."""
    import triton

    with triton.knobs.compilation.scope():
        triton.knobs.compilation.disable_line_info = True
        yield


def run_jit(spec: KernelSpec, axes: Mapping, grid: tuple, args: Sequence, arch: int) -> None:
    """Launch through Triton: its JIT on a GPU (the same bytes the build makes for the key),
    its interpreter under TRITON_INTERPRET=1."""
    fn = jit_function(spec)
    cfg = spec.launch(axes, arch)
    constexprs = spec.compile_constexprs(axes, arch)
    import torch

    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    if device.type == "cuda":
        with torch.cuda.device(device), aot_compile_options():
            fn[grid](*args, **constexprs, **cfg.triton_options())
    else:
        from .interpreter import patch_interpreter

        patch_interpreter()
        fn[grid](*args, **constexprs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def jit_programs_per_sm(spec: KernelSpec, axes: Mapping, args: Sequence, arch: int) -> int:
    """What `dispatch.programs_per_sm` gives a built binary, for the binary Triton's JIT compiles
    for these arguments (the same bytes as the build's, so the same count): an op that sizes its
    grid from it launches the same grid either way, and AOT and JIT outputs stay equal bit for bit."""
    import torch

    from . import cuda_driver

    fn = jit_function(spec)
    cfg = spec.launch(axes, arch)
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    with torch.cuda.device(device), aot_compile_options():
        kernel = fn.warmup(*args, grid=(1, 1, 1), **spec.compile_constexprs(axes, arch), **cfg.triton_options())
    kernel._init_handles()
    return cuda_driver.driver().occupancy(device.index, kernel.function, 32 * cfg.num_warps, kernel.metadata.shared)
