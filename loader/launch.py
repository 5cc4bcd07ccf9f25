"""One loaded binary on one device: arguments packed into a preallocated buffer, then launched.

The parameter buffer and the `void**` array pointing into it are built once per binary; a
launch is one `struct.pack_into` and one `cuLaunchKernel` (or `cuLaunchKernelEx` where the
binary needs clusters, cooperative launch or PDL), under a lock so threads never interleave
two calls' arguments. The driver is the target's binding (cuda_driver, or hip_driver whose
hipModuleLaunchKernel takes the same arguments), so the packing is one code for both.
"""
from __future__ import annotations

import ctypes
import struct
import threading

from . import cuda_driver
from .manifest import Entry

# One 8-byte slot per parameter: a pointer or int64 fills it, 32-bit values are padded.
_SLOT_FORMAT = {"i32": "i4x", "u32": "I4x", "fp32": "f4x", "i64": "q", "u64": "Q"}


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


class Launchable:
    """A function handle plus its packed-argument buffer.

    `launch(grid, values, stream)` takes the declared runtime arguments as plain numbers
    (pointers as ints); the two trailing scratch pointers are appended here.
    """

    def __init__(self, entry: Entry, function: int, device: int, driver=None, warp_size: int = 32):
        self.entry = entry
        self.function = function
        self.device = device
        self.driver = driver or cuda_driver.driver()
        n = len(entry.params)
        self.format = param_format(entry.params)
        self.buffer = ctypes.create_string_buffer(8 * n)
        base = ctypes.addressof(self.buffer)
        self.pointer_array = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)])
        self.pointers = ctypes.addressof(self.pointer_array)
        # Threads a block: the target's warp size (32 NVIDIA, 64 AMD CDNA and Iluvatar) x num_warps,
        # as Triton's own launchers compute it.
        self.block = warp_size * entry.num_warps
        self.shared = entry.shared
        self.lock = threading.Lock()
        self.needs_ex = entry.num_ctas != 1 or entry.launch_cooperative_grid or entry.launch_pdl
        self.scratch = entry.global_scratch_size > 0 or entry.profile_scratch_size > 0
        self.slow = self.needs_ex or self.scratch
        self.cu_launch = self.driver.launch_kernel  # cuLaunchKernel, or hipModuleLaunchKernel
        self.occupancy: int | None = None  # programs an SM, once dispatch.programs_per_sm asks

    def launch(self, grid: tuple[int, int, int], values: list, stream: int) -> None:
        gx, gy, gz = grid
        if self.slow or not gx * gy * gz:
            self._launch_general(grid, values, stream)
            return
        with self.lock:
            try:
                struct.pack_into(self.format, self.buffer, 0, *values, 0, 0)
            except struct.error as e:
                raise self._pack_error(e) from None
            # _issue's driver call, inlined: this is the launch path of every call.
            code = self.cu_launch(self.function, gx, gy, gz, self.block, 1, 1, self.shared, stream,
                                  self.pointers, None)
            if code:  # retried under the lock: the packed arguments are still this call's
                self._retry_or_raise(code, grid, stream)

    def _launch_general(self, grid, values, stream) -> None:
        """Empty grids, scratch buffers, clusters/cooperative/PDL launches."""
        gx, gy, gz = grid
        if gx * gy * gz == 0:
            return  # as Triton: an empty grid launches nothing
        keep, extra = self._scratch(gx * gy * gz) if self.scratch else (None, (0, 0))
        with self.lock:
            try:
                struct.pack_into(self.format, self.buffer, 0, *values, *extra)
            except struct.error as e:
                raise self._pack_error(e) from None
            code = self._issue(grid, stream)
            if code:
                self._retry_or_raise(code, grid, stream)
        del keep

    def _issue(self, grid, stream, pointers=None) -> int:
        """One driver launch with the arguments already packed (in this binary's buffer, or in
        the `void**` array `pointers`, a dispatch.Prepared's); the status code."""
        pointers = pointers or self.pointers
        if self.needs_ex:
            return self._launch_ex(grid, stream, pointers)
        gx, gy, gz = grid
        return self.cu_launch(self.function, gx, gy, gz, self.block, 1, 1, self.shared, stream, pointers, None)

    def _retry_or_raise(self, code, grid, stream, pointers=None) -> None:
        if code == cuda_driver.CUDA_ERROR_INVALID_CONTEXT:
            # A thread that never touched this device has no current context: adopt the
            # primary context torch uses, then retry once with the arguments still packed.
            self.driver.make_current(self.device)
            code = self._issue(grid, stream, pointers)
        if code:
            self.driver.check(f"launch of {self.entry.key}", code)

    def _pack_error(self, e) -> ValueError:
        return ValueError(f"{self.entry.kernel}: an argument does not fit its parameter type "
                          f"({', '.join(self.entry.params)}): {e}")

    def _launch_ex(self, grid, stream, pointers) -> int:
        e = self.entry
        config, _attrs = cuda_driver.cluster_launch_config(
            grid, self.block, self.shared, stream, e.num_ctas, e.launch_cooperative_grid, e.launch_pdl)
        return self.driver.cuLaunchKernelEx(ctypes.byref(config), self.function, pointers, None)

    def _scratch(self, programs: int):
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
