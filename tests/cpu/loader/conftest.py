import ctypes

import pytest

from aotc.loader import cuda_driver, dispatch

from ..aot.conftest import tiny_artifacts  # noqa: F401  (the session fixture)


class FakeTensor:
    """Just enough of a tensor for the launch path: a device pointer."""

    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


class FakeDriver:
    """Records loads and launches; reads each launch's packed arguments back out of memory."""

    def __init__(self):
        self.loaded = []  # (device, sha-prefix of image, symbol, shared)
        self.launches = []  # (function, grid, block, shared, stream, [raw 8-byte slots])
        self.occupancy_calls = []  # (device, function, block, shared)
        self.ex_attributes = []  # per cuLaunchKernelEx: [(attribute id, first value word)]

    def load_function(self, device, image, symbol, shared):
        import hashlib

        self.loaded.append((device, hashlib.sha256(image).hexdigest(), symbol, shared))
        return 1000 + len(self.loaded)

    def _slots(self, params):
        pointers = (ctypes.c_void_p * self.n_params).from_address(params)
        return [ctypes.string_at(pointers[i], 8) for i in range(self.n_params)]

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.launches.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, self._slots(params)))
        return 0

    launch_kernel = property(lambda self: self.cuLaunchKernel)

    def cuLaunchKernelEx(self, config, function, params, extra):
        c = config._obj  # ctypes.byref(LaunchConfig)
        self.launches.append((function, (c.gridDimX, c.gridDimY, c.gridDimZ), (c.blockDimX, c.blockDimY, c.blockDimZ),
                              c.sharedMemBytes, c.hStream, self._slots(params)))
        self.ex_attributes.append([(c.attrs[i].id, c.attrs[i].value[0]) for i in range(c.numAttrs)])
        return 0

    def occupancy(self, device, function, block, shared):
        self.occupancy_calls.append((device, function, block, shared))
        return 3

    def check(self, call, code):
        if code:
            raise cuda_driver.CudaError(call, code, "FAKE", "fake failure")


@pytest.fixture
def fake_driver(monkeypatch):
    fake = FakeDriver()
    fake.n_params = 9
    monkeypatch.setattr(cuda_driver, "_driver", fake)
    dispatch.reset()
    yield fake
    dispatch.reset()
