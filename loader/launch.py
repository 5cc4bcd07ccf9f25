"""Loaded binaries and the one object that packs and launches them.

`Binary` is one function loaded on one device (threads a block, shared memory, whether it needs
cuLaunchKernelEx); `Launch` is the packed launch: a parameter buffer and the `void**` array
pointing into it, built once; the values that do not change between calls (a plan's ints, a
plan's fixed pointers) are packed once, and a call packs only its own pointers, picks the ALIGNED
or GENERIC binary by their alignment and makes one driver call. The general path of `run_kernel`
uses the same object with every value packed per call (`launch_values`). The driver is the
target's binding (cuda_driver, or hip_driver whose hipModuleLaunchKernel takes the same
arguments), so the packing is one code for both.
"""
from __future__ import annotations

import ctypes
import struct
import threading

from . import cuda_driver
from .manifest import Entry

# One 8-byte slot per parameter: a pointer or int64 fills it, 32-bit values are padded.
_SLOT_FORMAT = {"i32": "i4x", "u32": "I4x", "fp32": "f4x", "i64": "q", "u64": "Q"}
_PTR = struct.Struct("<Q")


def param_format(params: list[str]) -> str:
    out = ["<"]
    for p in params:
        if p.startswith("*"):
            out.append("Q")
        elif p in _SLOT_FORMAT:
            out.append(_SLOT_FORMAT[p])
        else:
            raise ValueError(f"cannot pack a kernel parameter of type {p!r}")
    return "".join(out)


class Binary:
    """A function handle on one device and how to launch it (no arguments: a `Launch` packs them)."""

    def __init__(self, entry: Entry, function: int, device: int, driver=None, warp_size: int = 32):
        self.entry = entry
        self.function = function
        self.device = device
        self.driver = driver or cuda_driver.driver()
        # Threads a block: the target's warp size (32 NVIDIA, 64 AMD CDNA and Iluvatar) x num_warps,
        # as Triton's own launchers compute it.
        self.block = warp_size * entry.num_warps
        self.shared = entry.shared
        self.needs_ex = entry.num_ctas != 1 or entry.launch_cooperative_grid or entry.launch_pdl
        self.scratch = entry.global_scratch_size > 0 or entry.profile_scratch_size > 0
        self.cu_launch = self.driver.launch_kernel  # cuLaunchKernel, or hipModuleLaunchKernel
        self.occupancy: int | None = None  # programs an SM, once dispatch.programs_per_sm asks

    def issue(self, grid, stream, pointers) -> int:
        """One driver launch with the arguments already packed behind `pointers`; the status code."""
        if self.needs_ex:
            e = self.entry
            config, _attrs = cuda_driver.cluster_launch_config(
                grid, self.block, self.shared, stream, e.num_ctas, e.launch_cooperative_grid, e.launch_pdl)
            return self.driver.cuLaunchKernelEx(ctypes.byref(config), self.function, pointers, None)
        gx, gy, gz = grid
        return self.cu_launch(self.function, gx, gy, gz, self.block, 1, 1, self.shared, stream, pointers, None)

    def retry_or_raise(self, code, grid, stream, pointers) -> None:
        if code == cuda_driver.CUDA_ERROR_INVALID_CONTEXT:
            # A thread that never touched this device has no current context: adopt the
            # primary context torch uses, then retry once with the arguments still packed.
            self.driver.make_current(self.device)
            code = self.issue(grid, stream, pointers)
        if code:
            self.driver.check(f"launch of {self.entry.key}", code)

    def scratch_buffers(self, programs: int):
        """Triton's two trailing scratch pointers for a grid of `programs`: (tensors to hold, pointers)."""
        import torch

        e = self.entry
        bufs, ptrs = [], []
        for size, align in ((e.global_scratch_size, e.global_scratch_align),
                            (e.profile_scratch_size, e.profile_scratch_align)):
            if size > 0:
                # Triton sizes scratch per program (times num_ctas); over-allocate to align.
                t = torch.empty(programs * e.num_ctas * size + align, dtype=torch.uint8,
                                device=f"cuda:{self.device}")
                bufs.append(t)
                ptrs.append((t.data_ptr() + align - 1) // align * align)
            else:
                ptrs.append(0)
        return bufs, tuple(ptrs)


class Launch:
    """One kernel's packed launch over a pair of binaries (ALIGNED and GENERIC of one key).

    `binary(aligned)` returns the loaded `Binary` (loaded once, by the owner's loader). Built with
    a grid and the non-pointer values (`scalars`, packed once after `n_ptr` pointers), a call
    `launch(pointers, stream)` packs the leading pointers and launches; a plan may `fix` some
    pointers once and `per_call(first, n)` choose which it packs per run, then call
    `pack(buffer, offset, *pointers)` and `go(aligned)(stream)` itself under its own lock.
    Built without a grid, `launch_values(binary, grid, values, stream)` packs everything (the
    general path: any grid, scratch buffers, cluster launches). Thread safe under `lock`: the
    driver copies the arguments during the call.
    """

    def __init__(self, binary, params: list[str], grid=None, scalars=(), n_ptr: int = 0,
                 use_aligned: bool = False, misaligned=None):
        self.binary = binary
        self.use_aligned = use_aligned
        self.misaligned = misaligned or (lambda p: 1)
        self.grid = tuple(grid) if grid is not None else None
        n = len(params)
        self.format = param_format(params)
        self.buffer = ctypes.create_string_buffer(8 * n)
        if grid is not None:
            struct.pack_into(self.format, self.buffer, 0, *([0] * n_ptr), *scalars, 0, 0)
        base = ctypes.addressof(self.buffer)
        self.pointer_array = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)])
        self.pointers = ctypes.addressof(self.pointer_array)
        self.lock = threading.Lock()
        self.ex_configs: dict = {}  # Binary -> (cuLaunchKernelEx config, its attributes): PDL binaries
        self.calls = [None, None]  # [generic, aligned] driver calls, resolved on first use
        self.per_call(0, n_ptr)

    # -- a fixed grid: scalars packed once, pointers per call ------------------------------------
    def fix(self, pointers: dict) -> None:
        """Pack pointers a plan keeps for its lifetime (slot index -> address), once."""
        for i, p in pointers.items():
            _PTR.pack_into(self.buffer, 8 * i, p)

    def per_call(self, first: int, n: int) -> None:
        """The slots a call packs: `n` pointers from slot `first` (`pack(buffer, offset, *ptrs)`)."""
        self.pack = struct.Struct("<" + "Q" * n).pack_into
        self.offset = 8 * first

    def launch(self, pointers: tuple, stream: int) -> None:
        aligned = self.use_aligned and not self.misaligned(pointers)
        lock = self.lock
        lock.acquire()  # acquire/release: half the cost of `with` (BENCHMARKS.md "Launch overhead")
        try:
            self.pack(self.buffer, self.offset, *pointers)
            (self.calls[aligned] or self._resolve(aligned))(stream)
        finally:
            lock.release()

    __call__ = launch

    def go(self, aligned: bool):
        """The driver call of the ALIGNED (when the plan's ints allow it) or GENERIC binary, taking the stream."""
        aligned = bool(aligned and self.use_aligned)
        return self.calls[aligned] or self._resolve(aligned)

    def _resolve(self, aligned: bool):
        b, grid, pointers = self.binary(aligned), self.grid, self.pointers
        function = b.function
        if b.needs_ex:
            config = (self.ex_configs.get(b) or self._ex_config(b))[0]
            ref, launch_ex = ctypes.byref(config), b.driver.cuLaunchKernelEx

            def call(stream):
                config.hStream = stream
                code = launch_ex(ref, function, pointers, None)
                if code:  # retried under the caller's lock: the packed arguments are still this call's
                    b.retry_or_raise(code, grid, stream, pointers)
        else:
            gx, gy, gz = grid
            block, shared, launch = b.block, b.shared, b.cu_launch

            def call(stream):
                code = launch(function, gx, gy, gz, block, 1, 1, shared, stream, pointers, None)
                if code:
                    b.retry_or_raise(code, grid, stream, pointers)
        self.calls[aligned] = call
        return call

    def _ex_config(self, b: Binary):
        e = b.entry
        pair = cuda_driver.cluster_launch_config(self.grid, b.block, b.shared, None, e.num_ctas,
                                                 e.launch_cooperative_grid, e.launch_pdl)
        self.ex_configs[b] = pair
        return pair

    # -- any grid: every value packed per call ---------------------------------------------------
    def launch_values(self, b: Binary, grid, values, stream: int) -> None:
        """Launch `b` over `grid` with `values` (the declared arguments, pointers as ints)."""
        gx, gy, gz = grid
        if not gx * gy * gz:
            return  # as Triton: an empty grid launches nothing
        keep, extra = b.scratch_buffers(gx * gy * gz) if b.scratch else (None, (0, 0))
        with self.lock:
            try:
                struct.pack_into(self.format, self.buffer, 0, *values, *extra)
            except struct.error as e:
                raise ValueError(f"{b.entry.kernel}: an argument does not fit its parameter type "
                                 f"({', '.join(b.entry.params)}): {e}") from None
            if b.needs_ex:
                code = b.issue(grid, stream, self.pointers)
            else:  # issue(), inlined: this is the launch path of every general call
                code = b.cu_launch(b.function, gx, gy, gz, b.block, 1, 1, b.shared, stream, self.pointers, None)
            if code:
                b.retry_or_raise(code, grid, stream, self.pointers)
        del keep
