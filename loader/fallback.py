"""The JIT fallback: run a variant that was not built through Triton, warn once, log the miss.

Triton is imported here, inside the functions, and only when a fallback actually happens (or
when the ops run on CPU tensors under `TRITON_INTERPRET=1`). aotc does not install Triton (its
runtime needs none): the fallback takes whatever Triton is installed, warns once when that is not
the version that built the artifacts (its compile is then not the AOT binary), and where there
is none raises `TritonUnavailableError` naming the key. The miss log is JSON lines at
`AOTC_MISS_LOG`, by default `$XDG_CACHE_HOME/aotc/misses.jsonl` (`~/.cache/aotc/...`);
`aotc build --from-misses FILE` compiles what it lists. `AOTC_DISABLE_JIT=1` turns a miss into
an error naming the key and the command that would build it.
"""
from __future__ import annotations

import json
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Mapping, Sequence

from aotc.kernels.variants import ALIGNED, GENERIC, KernelSpec, VariantKey, as_target_arch

from .recipe import compile_options, jit_function

aot_compile_options = compile_options  # the name tests and benches import


class MissingVariantError(RuntimeError):
    """A variant that was not built and cannot run through the JIT (disabled, or no Triton)."""


class TritonUnavailableError(MissingVariantError):
    """The JIT fallback or the interpreter was needed, and Triton cannot be imported."""


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
    for _, key, target in iter_misses(path):
        if (key, target) not in seen:
            seen.add((key, target))
            out.append((key, target))
    return out


def iter_misses(path: str | os.PathLike):
    """(line number, generic key, target or None) for each record of a miss log; ValueError
    naming the file and line for anything else (not UTF-8, not a JSON object, no string key)."""
    for n, raw in enumerate(Path(path).read_bytes().splitlines(), 1):
        try:
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            doc = json.loads(line)
            if not isinstance(doc, dict):
                raise ValueError(f"a JSON {type(doc).__name__}, not an object")
            key, target = doc.get("key"), doc.get("target")
            if not isinstance(key, str) or not (target is None or isinstance(target, str)):
                raise ValueError('expected {"key": "<variant key>", "target": "<target>"} with string values')
            yield n, VariantKey.parse(key).with_level(GENERIC), target
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{n}: not a miss record: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a miss record: {e}") from None


_warned_versions: set[tuple[str, str]] = set()


def import_triton(spec: KernelSpec, axes: Mapping, arch, built_with: str | None = None,
                  interpreter: bool = False):
    """Triton, for a JIT compile of `spec`'s variant (or an interpreter run): a clear error naming
    the key where it is missing; a warning, once per pair of versions, where it is not the Triton
    `built_with` names (the artifacts' builder), because its compile is not the AOT binary."""
    try:
        import triton
    except ImportError as e:
        key = VariantKey.make(spec.name, axes, GENERIC)
        if interpreter:
            raise TritonUnavailableError(
                f"{key}: CPU tensors run through Triton's interpreter (TRITON_INTERPRET=1), and Triton "
                f"cannot be imported ({e}). Install Triton (pip install 'aotc[build]' brings the one "
                f"aotc builds with) or pass CUDA tensors.") from None
        wanted = f"triton=={built_with}" if built_with and built_with != "?" else "triton"
        target = as_target_arch(arch).target
        raise TritonUnavailableError(
            f"no built binary for {key} on {target}, and the JIT fallback cannot compile it: Triton "
            f"cannot be imported ({e}). Either build it (aotc build --arch {target} --from-misses "
            f"{miss_log_path()}, in a build environment: pip install 'aotc[build]') or install "
            f"Triton here (pip install '{wanted}' compiles the artifacts' exact binary).") from None
    installed = getattr(triton, "__version__", "?")
    if not interpreter and built_with and built_with != "?" and installed != built_with:
        pair = (installed, built_with)
        with _lock:
            new = pair not in _warned_versions
            _warned_versions.add(pair)
        if new:
            warnings.warn(
                f"aotc: the JIT fallback compiles with the installed Triton {installed}, but the artifacts "
                f"were built with Triton {built_with}: a variant it compiles is not the AOT binary (its "
                f"output may differ in the last bits). Build the missing variants with Triton {built_with} "
                f"(aotc build --from-misses {miss_log_path()}) to run the exact binaries.",
                AotcJitFallbackWarning, stacklevel=4)
    return triton


def launch_config(spec: KernelSpec, axes: Mapping, arch):
    """The spec's launch config on target `arch` (a TargetArch, or an int SM); NotImplementedError
    naming the target where the spec declares no such variant there."""
    cfg = spec.launch_config(axes, arch)
    if cfg is None:
        arch = as_target_arch(arch)
        raise NotImplementedError(f"{VariantKey.make(spec.name, axes, GENERIC)} does not exist on target "
                                  f"{arch.target} ({arch.backend}): its spec declares no launch config there")
    return cfg


_unspecialized: dict[str, object] = {}


def jit_kernel(spec: KernelSpec, level: str = ALIGNED):
    """The JIT function a fallback compiles `spec` with for a call that a built binary would serve
    at `level`. ALIGNED: the kernel's own (its decorator specializes exactly the arguments the spec
    declares aligned, all of which such a call meets). GENERIC: a copy that specializes nothing, as
    the build compiles GENERIC keys; the kernel's own would specialize whatever of the call happens
    to be aligned (a 16-byte-aligned pointer beside a head size of 100), another binary, whose
    outputs differed from the built one in the last bits on the H100 (BENCHMARKS.md, Kernel
    choices: head sizes and fp32)."""
    fn = jit_function(spec)
    if level != GENERIC or spec.kind != "triton" or type(fn).__name__ == "InterpretedFunction":
        return fn
    got = _unspecialized.get(spec.name)
    if got is None:
        import triton

        got = _unspecialized[spec.name] = triton.jit(
            do_not_specialize=[a.name for a in spec.args if a.kind == "i32"],
            do_not_specialize_on_alignment=[a.name for a in spec.args if a.kind == "ptr"])(fn.fn)
    return got


def run_jit(spec: KernelSpec, axes: Mapping, grid: tuple, args: Sequence, arch,
            built_with: str | None = None, level: str = ALIGNED) -> None:
    """Launch through Triton: its JIT on a GPU (the same bytes the build makes for the key at
    `level`, the level a built binary would serve the call at, when the installed Triton is
    `built_with`, the artifacts' builder), its interpreter under TRITON_INTERPRET=1. `arch`: the
    target's TargetArch (an int: smN)."""
    import torch

    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    import_triton(spec, axes, arch, built_with, interpreter=device.type != "cuda")
    cfg = launch_config(spec, axes, arch)
    constexprs = spec.compile_constexprs(axes, arch)
    if device.type == "cuda":
        fn = jit_kernel(spec, level)
        with torch.cuda.device(device), compile_options():
            fn[grid](*args, **constexprs, **cfg.triton_options())
    else:
        from .interpreter import patch_interpreter

        patch_interpreter()
        jit_function(spec)[grid](*args, **constexprs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def jit_programs_per_sm(spec: KernelSpec, axes: Mapping, args: Sequence, arch, driver=None,
                        built_with: str | None = None) -> int:
    """What `dispatch.programs_per_sm` gives a built binary, for the binary Triton's JIT compiles
    for these arguments (the same bytes as the build's, so the same count): an op that sizes its
    grid from it launches the same grid either way, and AOT and JIT outputs stay equal bit for bit."""
    import torch

    from . import cuda_driver

    import_triton(spec, axes, arch, built_with)
    fn = jit_function(spec)
    arch = as_target_arch(arch)
    cfg = launch_config(spec, axes, arch)
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    with torch.cuda.device(device), compile_options():
        kernel = fn.warmup(*args, grid=(1, 1, 1), **spec.compile_constexprs(axes, arch), **cfg.triton_options())
    kernel._init_handles()
    driver = driver or cuda_driver.driver()
    # the binary's warps: a Gluon kernel's partitions add up to more than the launch's num_warps
    return driver.occupancy(device.index, kernel.function, arch.warp_size * kernel.metadata.num_warps,
                            kernel.metadata.shared)
