"""The HIP binding against a fake libamdhip64 (no AMD GPU here; it has not run on AMD hardware):
the calls it makes to load and launch a code object, the LDS limit, error names, and the
launch of a gfx942 build through dispatch with the CUDA path's argument packing and
block = 64 x num_warps."""
import ctypes
import struct

import pytest

from aotc.aot.build import build
from aotc.kernels.registry import get_spec
from aotc.loader import artifacts, dispatch, hip_driver
from aotc.loader.manifest import read_manifest
from aotc.loader.targets import Device

from .conftest import FakeTensor

MI300X = Device("AMD Instinct MI300X", (9, 4), hip=True, gcn_arch="gfx942:sramecc+:xnack-")


def _out(ref):
    return ref._obj  # the ctypes object behind ctypes.byref(...)


def _handle(h):
    return getattr(h, "value", h)  # a c_void_p as the real library would see it: its address


class FakeHip:
    """Stands in for libamdhip64: records every call; launches read their packed slots back."""

    def __init__(self, lds=65536, static=0, fail=None):
        self.calls, self.launches, self.device = [], [], 0
        self.lds, self.static, self.fail, self.n_params = lds, static, fail or {}, 9

    def _rc(self, name):
        return self.fail.get(name, 0)

    def hipInit(self, flags):
        self.calls.append(("hipInit", flags))
        return self._rc("hipInit")

    def hipGetDevice(self, ref):
        _out(ref).value = self.device
        return 0

    def hipSetDevice(self, device):
        self.calls.append(("hipSetDevice", device))
        self.device = device
        return 0

    def hipDeviceGetAttribute(self, ref, attr, device):
        self.calls.append(("hipDeviceGetAttribute", attr, device))
        _out(ref).value = self.lds if attr == hip_driver.HIP_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK else -1
        return 0

    def hipModuleLoadData(self, ref, image):
        self.calls.append(("hipModuleLoadData", self.device, image[:4]))
        _out(ref).value = 0x5000
        return self._rc("hipModuleLoadData")

    def hipModuleGetFunction(self, ref, module, name):
        self.calls.append(("hipModuleGetFunction", _handle(module), name))
        _out(ref).value = 0x6000
        return 0

    def hipFuncGetAttribute(self, ref, attr, function):
        self.calls.append(("hipFuncGetAttribute", attr, _handle(function)))
        _out(ref).value = self.static
        return 0

    def hipModuleLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        pointers = (ctypes.c_void_p * self.n_params).from_address(params)
        slots = [ctypes.string_at(pointers[i], 8) for i in range(self.n_params)]
        self.launches.append((f, (gx, gy, gz), (bx, by, bz), shared, stream, slots))
        return self._rc("hipModuleLaunchKernel")

    def hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(self, ref, f, block, shared):
        self.calls.append(("occupancy", f, block, shared, self.device))
        _out(ref).value = 5
        return 0

    def hipGetErrorName(self, code):
        return b"hipErrorInvalidImage" if code == 200 else b"hipErrorUnknown"

    def hipGetErrorString(self, code):
        return b"device kernel image is invalid"


def test_load_function_sets_the_device_loads_and_restores():
    lib = FakeHip()
    lib.device = 1
    drv = hip_driver.Driver(lib=lib)
    assert drv.load_function(3, b"\x7fELF...", "kern", shared=0) == 0x6000
    assert lib.calls == [("hipInit", 0), ("hipSetDevice", 3), ("hipModuleLoadData", 3, b"\x7fELF"),
                         ("hipModuleGetFunction", 0x5000, b"kern"), ("hipSetDevice", 1)]


def test_dynamic_lds_is_checked_against_the_device_limit():
    lib = FakeHip(lds=65536, static=1024)
    drv = hip_driver.Driver(lib=lib)
    drv.load_function(0, b"x", "k", shared=64512)  # 1024 + 64512 == 64 KB fits
    assert ("hipDeviceGetAttribute", hip_driver.HIP_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 0) in lib.calls
    with pytest.raises(RuntimeError, match=r"k needs 1024 \+ 64513 bytes of shared memory \(LDS\); device 0 allows 65536"):
        drv.load_function(0, b"x", "k", shared=64513)
    assert lib.device == 0  # restored after the refusal too


def test_a_failing_call_raises_with_the_hip_error_name():
    drv = hip_driver.Driver(lib=FakeHip(fail={"hipModuleLoadData": 200}))
    with pytest.raises(hip_driver.HipError, match=r"hipModuleLoadData failed: hipErrorInvalidImage \(200\): "
                                                  r"device kernel image is invalid"):
        drv.load_function(0, b"x", "k", shared=0)


def test_a_missing_runtime_is_a_clear_error():
    drv = hip_driver.Driver(libraries=("libamdhip64-does-not-exist.so",))
    with pytest.raises(RuntimeError, match="cannot open the HIP runtime"):
        drv.load_function(0, b"x", "k", shared=0)


def test_occupancy_asks_for_the_blocks_of_a_compute_unit():
    lib = FakeHip()
    assert hip_driver.Driver(lib=lib).occupancy(2, 0x6000, 256, 4096) == 5
    assert ("occupancy", 0x6000, 256, 4096, 2) in lib.calls


def test_cluster_or_cooperative_launches_are_refused():
    with pytest.raises(NotImplementedError, match="plain kernels only"):
        hip_driver.Driver(lib=FakeHip()).cuLaunchKernelEx(None, 0, 0, None)


@pytest.fixture(scope="module")
def gfx942_artifacts(tmp_path_factory):
    """The tiny kernel compiled for gfx942 (Triton 3.6's HIP backend runs on the CPU)."""
    out = tmp_path_factory.mktemp("amd")
    report = build(out, ["gfx942"], kernels=["tiny_axpy"], jobs=1, progress=False)
    assert report.ok, report.failed
    return out


def test_a_gfx942_build_launches_through_hip_with_64_thread_warps(gfx942_artifacts, monkeypatch):
    lib = FakeHip()
    monkeypatch.setattr(hip_driver, "_driver", hip_driver.Driver(lib=lib))
    artifacts.set_artifacts(gfx942_artifacts)
    dispatch.reset()
    try:
        target = artifacts.load_target(MI300X)
        assert target.name == "gfx942" and target.info.driver == "hip"
        spec = get_spec("tiny_axpy")
        axes = {"block": 64, "dtype": "fp16"}
        sel = dispatch.Selection(spec, axes, 0, target, MI300X)
        assert sel.driver is hip_driver.driver()
        sel.launch((3, 2, 1), [FakeTensor(0x1000), FakeTensor(0x2002), FakeTensor(0x3000), 128, 100, 3, 0.5], 77)
    finally:
        artifacts.set_artifacts(None)
        dispatch.reset()
    entry = target.entries["tiny_axpy(block=64,dtype=fp16)@aligned"]
    assert entry.path.endswith(".hsaco") and entry.num_warps == 2  # the tiny spec's warps below sm90
    loaded = [c for c in lib.calls if c[0] == "hipModuleLoadData"]
    assert loaded == [("hipModuleLoadData", 0, b"\x7fELF")]
    (f, grid, block, shared, stream, slots), = lib.launches
    assert (f, grid, block, shared, stream) == (0x6000, (3, 2, 1), (64 * 2, 1, 1), entry.shared, 77)
    # The CUDA path's packing: 8-byte slots, pointers, int32s, an fp32, then the two scratch pointers.
    assert [struct.unpack("<Q", s)[0] for s in slots[:3]] == [0x1000, 0x2002, 0x3000]
    assert [struct.unpack("<i", s[:4])[0] for s in slots[3:6]] == [128, 100, 3]
    assert struct.unpack("<f", slots[6][:4])[0] == 0.5
    assert [struct.unpack("<Q", s)[0] for s in slots[7:]] == [0, 0]


def test_the_manifest_of_a_gfx942_build(gfx942_artifacts):
    m = read_manifest(gfx942_artifacts / "gfx942", expect_target="gfx942")
    assert (m.target.backend, m.target.arch, m.target.warp_size) == ("hip", "gfx942", 64)
    e = m.get("tiny_axpy(block=64,dtype=fp32)@generic")
    assert e.param_names[-2:] == ["global_scratch", "profile_scratch"] and e.params[-2:] == ["*i8", "*i8"]
    assert e.global_scratch_size == 0 and e.launch_pdl is False and e.cluster_dims == [1, 1, 1]
