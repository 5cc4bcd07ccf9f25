"""The CUDA binding (cuda_driver.Driver) against a fake libcuda put in place of the opened library
(no GPU here): the occupancy query inside the device's primary context, error names and text in
CudaError, raw entry points resolved once, and a missing library named in the error."""
import ctypes

import pytest

from aotc.loader import cuda_driver
from aotc.loader.driver_base import DriverError


def _out(ref):
    return ref._obj  # the ctypes object behind ctypes.byref(...)


class FakeCuda:
    """Stands in for libcuda.so.1: records calls; the context stack is a list."""

    def __init__(self, fail=None):
        self.calls, self.stack, self.fail = [], [], fail or {}

    def cuCtxPushCurrent_v2(self, ctx):
        self.calls.append(("push", ctx))
        self.stack.append(ctx)
        return 0

    def cuCtxPopCurrent_v2(self, ref):
        self.calls.append(("pop",))
        _out(ref).value = self.stack.pop()
        return 0

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, ref, function, block, shared):
        self.calls.append(("occupancy", function, block, shared, self.stack[-1]))
        _out(ref).value = 3
        return self.fail.get("occupancy", 0)

    def cuGetErrorName(self, code, ref):
        _out(ref).value = b"CUDA_ERROR_INVALID_VALUE"
        return 0

    def cuGetErrorString(self, code, ref):
        _out(ref).value = b"invalid argument"
        return 0


def _driver(lib):
    drv = cuda_driver.Driver()
    drv._lib = lib  # as if libcuda.so.1 had been opened and cuInit had run
    drv._primary[1] = 0xC1  # device 1's primary context, as if retained
    return drv


def test_occupancy_runs_inside_the_devices_primary_context():
    lib = FakeCuda()
    assert _driver(lib).occupancy(1, 0x7000, 128, 4096) == 3
    assert lib.calls == [("push", 0xC1), ("occupancy", 0x7000, 128, 4096, 0xC1), ("pop",)]
    assert lib.stack == []


def test_a_failed_call_names_the_call_and_the_error_and_still_pops():
    lib = FakeCuda(fail={"occupancy": 1})
    with pytest.raises(cuda_driver.CudaError) as err:
        _driver(lib).occupancy(1, 0x7000, 128, 0)
    assert str(err.value) == ("cuOccupancyMaxActiveBlocksPerMultiprocessor failed: CUDA_ERROR_INVALID_VALUE (1): "
                              "invalid argument")
    assert err.value.code == 1 and isinstance(err.value, DriverError)
    assert lib.stack == []


def test_raw_entry_points_resolve_once_and_other_names_do_not():
    lib = FakeCuda()
    drv = _driver(lib)
    assert drv.cuCtxPushCurrent_v2 == lib.cuCtxPushCurrent_v2
    assert "cuCtxPushCurrent_v2" in drv.__dict__
    with pytest.raises(AttributeError):
        drv.launch_something


def test_a_missing_library_is_named():
    drv = cuda_driver.Driver("libcuda-does-not-exist.so.1")
    with pytest.raises(RuntimeError, match="cannot open the CUDA driver \\(libcuda-does-not-exist.so.1\\)"):
        drv.occupancy(0, 0x7000, 128, 0)
