"""A ctypes binding of the HIP module API for AMD targets: load a code object, launch it.

The same methods as cuda_driver.Driver (load_function, launch_kernel, occupancy, check,
make_current, push/pop), so launch.py and dispatch.py pack and launch either the same way.
Chosen when torch is a ROCm build (dispatch.driver_for). Resolved lazily: importing it never
opens libamdhip64. Enum values read from the HIP headers bundled with Triton 3.6
(triton/backends/amd/include/hip/hip_runtime_api.h, compiled and printed here).

Not run on AMD hardware: no AMD GPU was reachable; tests/cpu/loader/test_hip_driver.py checks
the calls and the packed arguments against a fake libamdhip64.
"""
from __future__ import annotations

import ctypes
import threading

from .driver_base import DriverError, LazyDriver

HIP_SUCCESS = 0
HIP_ERROR_INVALID_CONTEXT = 201  # as CUDA's, so launch.py's one retry rule serves both
HIP_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 74  # hipDeviceAttributeMaxSharedMemoryPerBlock
HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1  # static LDS of a function

_P = ctypes.c_void_p
_U = ctypes.c_uint
_I = ctypes.c_int
_SIGNATURES = {
    "hipInit": ([_U], _I),
    "hipGetDevice": ([ctypes.POINTER(_I)], _I),
    "hipSetDevice": ([_I], _I),
    "hipDeviceGetAttribute": ([ctypes.POINTER(_I), _I, _I], _I),
    "hipModuleLoadData": ([ctypes.POINTER(_P), ctypes.c_char_p], _I),
    "hipModuleGetFunction": ([ctypes.POINTER(_P), _P, ctypes.c_char_p], _I),
    "hipFuncGetAttribute": ([ctypes.POINTER(_I), _I, _P], _I),
    "hipModuleLaunchKernel": ([_P, _U, _U, _U, _U, _U, _U, _U, _P, _P, _P], _I),
    "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor": ([ctypes.POINTER(_I), _P, _I, ctypes.c_size_t], _I),
    "hipGetErrorName": ([_I], ctypes.c_char_p),
    "hipGetErrorString": ([_I], ctypes.c_char_p),
}
LIBRARIES = ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6")


class HipError(DriverError):
    pass


class Driver(LazyDriver):
    """The HIP runtime (`libamdhip64.so`), opened on first use; `lib` injects a fake in tests. Raw
    entry points (driver.hipModuleLaunchKernel) resolved on first use (LazyDriver)."""

    PREFIX = "hip"
    OCCUPANCY = "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor"

    def __init__(self, libraries=LIBRARIES, lib=None):
        self._libraries = tuple(libraries)
        self._lib = None
        self._given = lib
        self._lock = threading.Lock()
        self._saved: list[int] = []  # devices to restore, one per push
        self._lds_limit: dict[int, int] = {}

    def _open(self):
        with self._lock:
            if self._lib is None:
                lib, errors = self._given, []
                for name in self._libraries if lib is None else ():
                    try:
                        lib = ctypes.CDLL(name)
                        break
                    except OSError as e:
                        errors.append(str(e))
                if lib is None:
                    raise RuntimeError(f"cannot open the HIP runtime ({', '.join(self._libraries)}): "
                                       f"{'; '.join(errors)}")
                if isinstance(lib, ctypes.CDLL):  # a test's fake takes the ctypes values as they come
                    for name, (argtypes, restype) in _SIGNATURES.items():
                        fn = getattr(lib, name)
                        fn.argtypes, fn.restype = argtypes, restype
                self._lib = lib
                self.check("hipInit", lib.hipInit(0))
        return self._lib

    def check(self, call: str, code: int) -> None:
        if code != HIP_SUCCESS:
            lib = self._lib
            name = lib.hipGetErrorName(code) if lib is not None else None
            text = lib.hipGetErrorString(code) if lib is not None else None
            raise HipError(call, code, (name or b"?").decode(), (text or b"?").decode())

    @property
    def launch_kernel(self):
        """hipModuleLaunchKernel: cuLaunchKernel's arguments in cuLaunchKernel's order."""
        return self.hipModuleLaunchKernel

    def cuLaunchKernelEx(self, *args):  # noqa: N802 - the name launch.py calls for the Ex path
        # Triton 3.6's HIP launcher uses hipDrvLaunchKernelEx for num_ctas > 1 only, which no
        # aotc kernel asks for, and AMD has no PDL; a cooperative launch would need
        # hipModuleLaunchCooperativeKernel. None is built for AMD, so none is bound here.
        raise NotImplementedError("aotc's HIP binding launches plain kernels only "
                                  "(no cluster, cooperative or programmatic dependent launch)")

    def push(self, device: int) -> None:
        """Make `device` current, remembering the previous one for `pop`."""
        cur = _I()
        self.check("hipGetDevice", self.hipGetDevice(ctypes.byref(cur)))
        self._saved.append(cur.value)
        self.check("hipSetDevice", self.hipSetDevice(device))

    def pop(self) -> None:
        self.check("hipSetDevice", self.hipSetDevice(self._saved.pop()))

    def make_current(self, device: int) -> None:
        self.check("hipSetDevice", self.hipSetDevice(device))

    def load_function(self, device: int, image: bytes, symbol: str, shared: int) -> int:
        """Load a code object on `device` and return its function handle. AMD needs no opt-in for
        dynamic LDS (Triton's HIP loader sets no attribute): static + dynamic must fit the device's
        per-block limit (64 KB on gfx90a/gfx942), refused here with a clear error otherwise."""
        self._open()
        self.push(device)
        try:
            module, function = _P(), _P()
            self.check("hipModuleLoadData", self.hipModuleLoadData(ctypes.byref(module), image))
            self.check("hipModuleGetFunction",
                       self.hipModuleGetFunction(ctypes.byref(function), module, symbol.encode()))
            if shared:
                limit = self._lds_limit.get(device)
                if limit is None:
                    value = _I()
                    self.check("hipDeviceGetAttribute", self.hipDeviceGetAttribute(
                        ctypes.byref(value), HIP_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, device))
                    limit = self._lds_limit[device] = value.value
                static = _I()
                self.check("hipFuncGetAttribute", self.hipFuncGetAttribute(
                    ctypes.byref(static), HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function))
                if static.value + shared > limit:
                    raise RuntimeError(f"{symbol} needs {static.value} + {shared} bytes of shared memory (LDS); "
                                       f"device {device} allows {limit} a block")
            return function.value
        finally:
            self.pop()


_driver: Driver | None = None


def driver() -> Driver:
    global _driver
    if _driver is None:
        _driver = Driver()
    return _driver


def set_driver(d) -> None:
    """Swap the driver (tests inject a fake one)."""
    global _driver
    _driver = d
