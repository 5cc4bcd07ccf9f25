"""A ctypes binding of the few CUDA driver calls aotc needs: load a cubin, launch it. Also the
binding of Iluvatar's CoreX targets, whose runtime offers the same driver API (loader/targets.py).

Resolved lazily: importing this module on a machine without a GPU or libcuda never fails.
Every status code goes through one `check()`. Tests inject a fake driver object with the same
method names (see tests/cpu/loader/test_launch.py).
"""
from __future__ import annotations

import ctypes
import threading

from .driver_base import DriverError, LazyDriver

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_CONTEXT = 201

CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
CU_CLUSTER_SCHEDULING_POLICY_SPREAD = 1


class CudaError(DriverError):
    pass


class LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: an int id padded to 8 bytes, then a 64-byte value union.
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint32 * 16)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint),
    ]


_P = ctypes.c_void_p
_U = ctypes.c_uint
_I = ctypes.c_int
_SIGNATURES = {
    "cuInit": [_U],
    "cuDeviceGet": [ctypes.POINTER(_I), _I],
    "cuDeviceGetAttribute": [ctypes.POINTER(_I), _I, _I],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_P), _I],
    "cuCtxGetCurrent": [ctypes.POINTER(_P)],
    "cuCtxSetCurrent": [_P],
    "cuCtxPushCurrent_v2": [_P],
    "cuCtxPopCurrent_v2": [ctypes.POINTER(_P)],
    "cuModuleLoadData": [ctypes.POINTER(_P), ctypes.c_char_p],
    "cuModuleGetFunction": [ctypes.POINTER(_P), _P, ctypes.c_char_p],
    "cuFuncGetAttribute": [ctypes.POINTER(_I), _I, _P],
    "cuFuncSetAttribute": [_P, _I, _I],
    "cuLaunchKernel": [_P, _U, _U, _U, _U, _U, _U, _U, _P, _P, _P],
    "cuLaunchKernelEx": [ctypes.POINTER(LaunchConfig), _P, _P, _P],
    "cuOccupancyMaxActiveBlocksPerMultiprocessor": [ctypes.POINTER(_I), _P, _I, ctypes.c_size_t],
    "cuGetErrorName": [_I, ctypes.POINTER(ctypes.c_char_p)],
    "cuGetErrorString": [_I, ctypes.POINTER(ctypes.c_char_p)],
}


class Driver(LazyDriver):
    """The real driver: `libcuda.so.1`, opened on first use; raw entry points (driver.cuLaunchKernel)
    resolved on first use (LazyDriver)."""

    PREFIX = "cu"
    OCCUPANCY = "cuOccupancyMaxActiveBlocksPerMultiprocessor"

    def __init__(self, library: str = "libcuda.so.1"):
        self._library = library
        self._lib = None
        self._lock = threading.Lock()
        self._primary: dict[int, int] = {}

    def _open(self):
        with self._lock:
            if self._lib is None:
                try:
                    lib = ctypes.CDLL(self._library)
                except OSError as e:
                    raise RuntimeError(f"cannot open the CUDA driver ({self._library}): {e}") from None
                for name, argtypes in _SIGNATURES.items():
                    fn = getattr(lib, name)
                    fn.argtypes = argtypes
                    fn.restype = ctypes.c_int
                self._lib = lib
                self.check("cuInit", lib.cuInit(0))
        return self._lib

    def check(self, call: str, code: int) -> None:
        if code != CUDA_SUCCESS:
            lib = self._lib
            name, text = ctypes.c_char_p(), ctypes.c_char_p()
            if lib is not None:
                lib.cuGetErrorName(code, ctypes.byref(name))
                lib.cuGetErrorString(code, ctypes.byref(text))
            raise CudaError(call, code, (name.value or b"?").decode(), (text.value or b"?").decode())

    def primary_context(self, device: int) -> int:
        ctx = self._primary.get(device)
        if ctx is None:
            self._open()
            dev, handle = _I(), _P()
            self.check("cuDeviceGet", self.cuDeviceGet(ctypes.byref(dev), device))
            self.check("cuDevicePrimaryCtxRetain", self.cuDevicePrimaryCtxRetain(ctypes.byref(handle), dev))
            ctx = self._primary[device] = handle.value
        return ctx

    def load_function(self, device: int, image: bytes, symbol: str, shared: int) -> int:
        """Load a cubin into `device`'s primary context and return its function handle."""
        ctx = self.primary_context(device)
        self.check("cuCtxPushCurrent", self.cuCtxPushCurrent_v2(ctx))
        try:
            module, function = _P(), _P()
            self.check("cuModuleLoadData", self.cuModuleLoadData(ctypes.byref(module), image))
            self.check("cuModuleGetFunction",
                       self.cuModuleGetFunction(ctypes.byref(function), module, symbol.encode()))
            if shared > 49152:
                # Above 48 KB a kernel must opt in to dynamic shared memory, as Triton's loader does.
                optin, static = _I(), _I()
                self.check("cuDeviceGetAttribute", self.cuDeviceGetAttribute(
                    ctypes.byref(optin), CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device))
                if shared > optin.value:
                    raise RuntimeError(f"{symbol} needs {shared} bytes of shared memory; device {device} "
                                       f"allows {optin.value}")
                self.check("cuFuncGetAttribute", self.cuFuncGetAttribute(
                    ctypes.byref(static), CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function))
                self.check("cuFuncSetAttribute", self.cuFuncSetAttribute(
                    function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin.value - static.value))
            return function.value
        finally:
            popped = _P()
            self.check("cuCtxPopCurrent", self.cuCtxPopCurrent_v2(ctypes.byref(popped)))

    def make_current(self, device: int) -> None:
        self.check("cuCtxSetCurrent", self.cuCtxSetCurrent(self.primary_context(device)))

    @property
    def launch_kernel(self):
        """cuLaunchKernel (hip_driver.Driver's is hipModuleLaunchKernel, same arguments)."""
        return self.cuLaunchKernel

    def push(self, device: int) -> None:
        """Make `device`'s primary context current until `pop`."""
        self.check("cuCtxPushCurrent", self.cuCtxPushCurrent_v2(self.primary_context(device)))

    def pop(self) -> None:
        self.check("cuCtxPopCurrent", self.cuCtxPopCurrent_v2(ctypes.byref(_P())))


def cluster_launch_config(grid, block_x, shared, stream, num_ctas, cooperative, pdl):
    """A cuLaunchKernelEx config laid out as Triton 3.6's own launcher builds it."""
    attrs = []
    if pdl:
        attrs.append((CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, (1, 0, 0)))
    if cooperative:
        attrs.append((CU_LAUNCH_ATTRIBUTE_COOPERATIVE, (1, 0, 0)))
    if num_ctas != 1:
        attrs.append((CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, (num_ctas, 1, 1)))
        attrs.append((CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
                      (CU_CLUSTER_SCHEDULING_POLICY_SPREAD, 0, 0)))
    array = (LaunchAttribute * max(1, len(attrs)))()
    for slot, (attr_id, values) in zip(array, attrs):
        slot.id = attr_id
        slot.value[0], slot.value[1], slot.value[2] = values
    config = LaunchConfig(grid[0] * num_ctas, grid[1], grid[2], block_x, 1, 1, shared, stream,
                          array, len(attrs))
    return config, array


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
