"""Choosing the binary for a call and launching it: AOT first, then the JIT fallback.

`resolve` is the pure rule (manifest entries + argument values -> choice + why each candidate
was rejected); tests run it on manifest data with no GPU. `run_kernel` is the general path:
per (kernel, axes, device) it keeps a `Selection` holding the loaded binaries, then per call
reads pointers, checks the ALIGNED binary's assumptions and launches on the current torch
stream (or takes the JIT fallback). `prepare` is the fast path for ops that cache a plan per
checked input metadata: a `launch.Launch` has its grid and non-pointer arguments packed once,
and a call packs only the pointers.
"""
from __future__ import annotations

import struct
import threading
from typing import Mapping, Sequence

from aotc.kernels.variants import ALIGNED, GENERIC, KernelSpec, VariantKey

from . import artifacts, cuda_driver, fallback, targets
from .launch import Binary, Launch
from .manifest import Entry
from .targets import Device

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


class Resolution:
    """resolve()'s answer: the level chosen (ALIGNED, GENERIC, or None for a miss), its entry, and
    why each level was rejected (level -> reason)."""

    __slots__ = ("level", "entry", "rejected")

    def __init__(self, level: str | None, entry: Entry | None, rejected: dict[str, str] | None = None):
        self.level, self.entry, self.rejected = level, entry, rejected if rejected is not None else {}


def check_assumptions(spec: KernelSpec, divisible: Sequence[str], values: Sequence) -> str | None:
    """Why `values` (pointers as ints) break a specialization whose `divisible` arguments (a
    binary's `entry.divisible`, or `spec.divisible_args(level)`) must be divisible by 16, or None
    if they fit."""
    for name in divisible:
        v = values[spec.arg_index[name]]
        if v % 16:
            what = "data_ptr" if spec.args[spec.arg_index[name]].kind == "ptr" else "value"
            return f"{name}: {what} {v} is not divisible by 16"
    for a, v in zip(spec.args, values):
        if a.kind == "i32" and not INT32_MIN <= v <= INT32_MAX:
            return f"{a.name}: {v} does not fit in int32"
    return None


def resolve(spec: KernelSpec, axes: Mapping, entries: Mapping[str, Entry], values: Sequence) -> Resolution:
    """The most specialized built binary whose assumptions `values` satisfy."""
    res = Resolution(None, None)
    for level in (ALIGNED, GENERIC):
        key = str(VariantKey.make(spec.name, axes, level))
        entry = entries.get(key)
        if entry is None:
            res.rejected[level] = f"{key} is not built"
            continue
        why = check_assumptions(spec, entry.divisible, values)
        if why is None:
            res.level, res.entry = level, entry
            return res
        res.rejected[level] = why
    return res


def driver_for(info: targets.TargetInfo):
    """The binding that loads and launches a target's binaries (CoreX speaks the CUDA driver API)."""
    if info.driver == "hip":
        from . import hip_driver

        return hip_driver.driver()
    return cuda_driver.driver()


class Selection:
    """The binaries of one (kernel, axes) on one device, ready to launch."""

    def __init__(self, spec: KernelSpec, axes: Mapping, device: int, target, gpu: Device | tuple[int, int]):
        self.spec = spec
        self.axes = dict(axes)
        self.device = device
        self.target = target
        self.gpu = artifacts.as_device(gpu)
        # The target's row (the device's own when nothing is built for it: the JIT needs its backend).
        self.info = target.info if target is not None else targets.device_target(self.gpu)
        self.arch = self.info.spec_arch()  # what spec.launch(axes, arch) receives, JIT fallback included
        self.driver = driver_for(self.info)
        entries = target.entries if target is not None else {}
        self.entries = {level: entries.get(str(VariantKey.make(spec.name, axes, level))) for level in (ALIGNED, GENERIC)}
        self.loaded: dict[str, Binary] = {}
        aligned = self.entries[ALIGNED]
        self.aligned_idx = tuple(spec.arg_index[n] for n in aligned.divisible) if aligned else ()
        self.has_aligned = aligned is not None
        self.has_generic = self.entries[GENERIC] is not None
        # The loaded binaries, also as plain attributes: the hot path reads no dict.
        self.l_aligned: Binary | None = None
        self.l_generic: Binary | None = None
        self.lock = threading.Lock()
        self.values = _values_function(spec, self.aligned_idx)
        self.general: dict[str, Launch] = {}  # level -> the Launch that packs every value per call

    def binary(self, level: str) -> Binary:
        """The loaded binary of `level` (ALIGNED or GENERIC), loaded on first use."""
        got = self.l_aligned if level == ALIGNED else self.l_generic
        return got or self._load(level)

    def _load(self, level: str) -> Binary:
        with self.lock:  # one thread loads; the others wait and reuse it
            got = self.loaded.get(level)
            if got is None:
                entry = self.entries[level]
                image = self.target.read_binary(entry)  # sha256-checked before any load
                function = self.driver.load_function(self.device, image, entry.symbol, entry.shared)
                got = self.loaded[level] = Binary(entry, function, self.device, self.driver, self.info.warp_size)
                self.general[level] = Launch(None, entry.params)
                setattr(self, "l_" + level, got)
        return got

    def launch(self, grid, args: Sequence, stream: int) -> None:
        values, misaligned = self.values(args)
        if self.has_aligned and not misaligned:
            level = ALIGNED
        elif self.has_generic:
            level = GENERIC
        else:
            self.miss(grid, args, "no binary for this key")
            return
        b = self.binary(level)
        self.general[level].launch_values(b, grid, values, stream)

    def miss(self, grid, args, reason: str) -> None:
        key = VariantKey.make(self.spec.name, self.axes, GENERIC)
        target = self.info.name
        if self.target is None:
            reason = targets.no_target_message(self.gpu, artifacts.local_target_names(), artifacts.current_source())
        fallback.record_miss(key, target, reason)
        fallback.run_jit(self.spec, self.axes, grid, args, self.arch, built_with=self.built_with,
                         level=self.level_of(args))

    def level_of(self, args: Sequence) -> str:
        """The level a built binary would serve this call at (what the JIT fallback compiles): ALIGNED
        where the spec builds it and the call meets its assumptions, else GENERIC (where built)."""
        if ALIGNED in self.spec.levels:
            values = [a.data_ptr() if hasattr(a, "data_ptr") else a for a in args]
            if check_assumptions(self.spec, self.spec.divisible_args(ALIGNED), values) is None:
                return ALIGNED
        return GENERIC if GENERIC in self.spec.levels else ALIGNED

    @property
    def built_with(self) -> str | None:
        """The Triton version that built this device's artifacts (None without artifacts)."""
        return self.target.manifest.triton_version if self.target is not None else None


def _misaligned_function(idx: tuple):
    """A generated `misaligned(pointers) -> int`, nonzero when any of `idx` is not 16-byte aligned."""
    check = " | ".join(f"p[{i}]" for i in idx) or "0"
    namespace: dict = {}
    exec(compile(f"def misaligned(p):\n    return ({check}) & 15\n", "<aotc misaligned>", "exec"), namespace)  # noqa: S102
    return namespace["misaligned"]


def _needs_general_launch(entry: Entry) -> bool:
    # A PDL binary is fine: a Launch launches it through cuLaunchKernelEx with a config it keeps.
    return (entry.num_ctas != 1 or entry.launch_cooperative_grid
            or entry.global_scratch_size > 0 or entry.profile_scratch_size > 0)


def prepare(spec: KernelSpec, axes: Mapping, grid: tuple, scalars: Sequence, device: int,
            aligned_only: bool = False) -> Launch | None:
    """A `launch.Launch` of `spec`'s built binaries on CUDA device `device`, or None where calls
    must take `run_kernel`'s path: a key that was not built (the JIT fallback), a binary that
    needs scratch buffers or a cluster/cooperative launch, an empty grid, ints no binary takes, or
    a pointer after the leading ones that is not given as a fixed address (an int).
    A binary built for a programmatic dependent launch (PDL) is prepared: cuLaunchKernelEx.
    `aligned_only`: a spec built at the ALIGNED level alone is prepared too (its ints must meet
    the assumptions); the caller launches it only with pointers `launch.misaligned` passes."""
    gx, gy, gz = grid
    # A pointer after the leading ones is fixed for the Launch's life when given as an address (int).
    tail = zip(spec.args[spec.leading_ptrs:], scalars)
    if not gx * gy * gz or any(a.kind == "ptr" and not isinstance(v, int) for a, v in tail):
        return None
    sel = _selections.get((spec.name, tuple(axes.items()), device)) or _selection(spec, axes, device)
    if (sel.entries[GENERIC] is None and not (aligned_only and sel.entries[ALIGNED] is not None)) or any(
            _needs_general_launch(e) for e in sel.entries.values() if e):
        return None
    try:
        return _prepared(sel, grid, scalars)
    except (ValueError, struct.error):
        return None


def _prepared(sel: Selection, grid: tuple, scalars: Sequence) -> Launch:
    """The Launch of `sel` over `grid` with `scalars` (the arguments after the leading pointers)
    checked against both binaries' assumptions and packed once; pointers are checked per call."""
    spec = sel.spec
    n_ptr = spec.leading_ptrs
    if n_ptr + len(scalars) != len(spec.args):
        raise ValueError(f"{spec.name}: {len(scalars)} non-pointer arguments after {n_ptr} pointers, "
                         f"expected {len(spec.args) - n_ptr}")
    generic, aligned = sel.entries[GENERIC], sel.entries[ALIGNED]
    values = [0] * n_ptr + list(scalars)
    why = check_assumptions(spec, (generic or aligned).divisible, values)
    if why is not None:
        raise ValueError(f"{spec.name}: {why}")
    generic = generic or aligned  # an ALIGNED-only spec (prepare's aligned_only): its one binary
    if aligned is not None and aligned.params != generic.params:
        raise ValueError(f"{spec.name}: the ALIGNED and GENERIC binaries take different parameters")
    # Pointers are 0 here, so only the ints decide; pointers are checked per call.
    use_aligned = aligned is not None and check_assumptions(spec, aligned.divisible, values) is None
    ptr_idx = tuple(i for i in sel.aligned_idx if i < n_ptr) if use_aligned else ()
    launch = Launch(lambda a: sel.binary(ALIGNED if a else GENERIC), generic.params, grid, scalars, n_ptr,
                    use_aligned, _misaligned_function(ptr_idx))
    launch.sel = sel
    return launch


def is_built(spec: KernelSpec, axes: Mapping, device: int) -> bool:
    """Whether the artifacts loaded for CUDA device `device` hold a binary of `spec`'s variant
    `axes` (at any level): an op with two kernels for a call prefers the one that is built over
    the JIT fallback (which needs Triton)."""
    sel = _selections.get((spec.name, tuple(axes.items()), device)) or _selection(spec, axes, device)
    return any(e is not None for e in sel.entries.values())


def programs_per_sm(spec: KernelSpec, axes: Mapping, args: Sequence, device: int) -> int | None:
    """How many programs of the binary that `args` (CUDA tensors and ints, in `spec.args` order)
    would launch fit one SM at once: the driver's occupancy of the built binary (ALIGNED when the
    ints meet its assumptions, as `prepare` picks), or of the JIT's compile when the key is not
    built. None where the JIT is switched off or the launch takes the general path."""
    sel = _selections.get((spec.name, tuple(axes.items()), device)) or _selection(spec, axes, device)
    generic, aligned = sel.entries[GENERIC], sel.entries[ALIGNED]
    if generic is None:
        if fallback.jit_disabled():
            return None
        return fallback.jit_programs_per_sm(spec, axes, args, sel.arch, sel.driver, built_with=sel.built_with)
    if any(_needs_general_launch(e) for e in sel.entries.values() if e):
        return None
    values = [0] * spec.leading_ptrs + list(args[spec.leading_ptrs:])
    level = ALIGNED if aligned is not None and check_assumptions(spec, aligned.divisible, values) is None else GENERIC
    la = sel.binary(level)
    if la.occupancy is None:
        la.occupancy = la.driver.occupancy(sel.device, la.function, la.block, la.shared)
    return la.occupancy


def _values_function(spec: KernelSpec, aligned_idx: tuple):
    """A generated `values(args) -> (packed values, misaligned bits)` for one kernel: pointers
    read with data_ptr(), the ALIGNED binary's assumptions OR-ed into one test. Straight-line
    code, as Triton generates its binder, because a loop over 30 arguments costs microseconds."""
    items = [f"a[{i}].data_ptr()" if arg.kind == "ptr" else f"a[{i}]" for i, arg in enumerate(spec.args)]
    check = " | ".join(f"v[{i}]" for i in aligned_idx) or "0"
    src = f"def values(a):\n    v = ({', '.join(items)},)\n    return v, ({check}) & 15\n"
    namespace: dict = {}
    exec(compile(src, f"<aotc values {spec.name}>", "exec"), namespace)  # noqa: S102 - built from the spec
    return namespace["values"]


_selections: dict[tuple, Selection] = {}
_selections_lock = threading.Lock()
_devices: dict[int, Device] = {}


def device_of(index: int) -> Device:
    """The `Device` (vendor markers, capability, AMD arch) of torch's device `index`, read once."""
    gpu = _devices.get(index)
    if gpu is None:
        gpu = _devices[index] = targets.describe(index)
    return gpu


def _selection(spec: KernelSpec, axes: Mapping, device: int) -> Selection:
    gpu = device_of(device)
    with _selections_lock:
        sel = _selections.get((spec.name, tuple(axes.items()), device))
        if sel is None:
            sel = Selection(spec, axes, device, artifacts.load_target(gpu), gpu)
            _selections[(spec.name, tuple(axes.items()), device)] = sel
    return sel


_plan_caches: list[dict] = []


def register_plan_cache(cache: dict) -> dict:
    """An op's cache of plans holding prepared `Launch`es: `reset` empties it with the selections."""
    _plan_caches.append(cache)
    return cache


def reset() -> None:
    """Forget loaded selections and the op plans built on them (after `set_artifacts`, or in tests)."""
    with _selections_lock:
        _selections.clear()
        for cache in _plan_caches:
            cache.clear()


_get_stream = None


def run_kernel(spec: KernelSpec, axes: Mapping, grid: tuple, args: Sequence) -> None:
    """Launch `spec`'s variant for `axes` over `grid` with `args` (in `spec.args` order).

    CUDA tensors: the built binary (ALIGNED when the call meets its assumptions, else
    GENERIC), on the current stream of the tensors' device; a key that was not built runs
    through the Triton JIT (see fallback.py). CPU tensors: Triton's interpreter when
    TRITON_INTERPRET=1, else a ValueError.
    """
    global _get_stream
    first = args[spec.first_ptr]
    if first.is_cuda:
        device = first.get_device()
        sel = _selections.get((spec.name, tuple(axes.items()), device)) or _selection(spec, axes, device)
        if _get_stream is None:
            import torch

            _get_stream = (torch._C._cuda_getCurrentRawStream, torch._C._cuda_getDevice)
        if _get_stream[1]() == device:
            sel.launch(grid, args, _get_stream[0](device))
        else:
            # Tensors on another GPU than torch's current one: launch in their device's context.
            sel.driver.push(device)
            try:
                sel.launch(grid, args, _get_stream[0](device))
            finally:
                sel.driver.pop()
    elif fallback.interpreting():
        fallback.run_jit(spec, axes, grid, args, arch=90)
    else:
        raise ValueError(f"{spec.name}: tensors are on {first.device}; aotc kernels run on CUDA devices "
                         f"(or on the CPU under TRITON_INTERPRET=1 for reference runs)")
