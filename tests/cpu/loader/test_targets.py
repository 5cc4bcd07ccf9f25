"""Which target each kind of GPU gets, or why none: a table of fake devices (no GPU), the vendor
decided before the capability so no binary reaches another vendor's GPU, and manifests refused
on a target they were not built for."""
import json
import types

import pytest

from aotc.loader import artifacts, targets
from aotc.loader.manifest import Manifest, ManifestError, Target, read_manifest
from aotc.loader.targets import Device

A100 = Device("NVIDIA A100-SXM4-80GB", (8, 0))
A10 = Device("NVIDIA A10", (8, 6))
L4 = Device("NVIDIA L4", (8, 9))
H100 = Device("NVIDIA H100 80GB HBM3", (9, 0))
B200 = Device("NVIDIA B200", (10, 0))
# ROCm torch reports gfx942 as capability 9.4: a capability rule alone would pick "sm94".
MI300X = Device("AMD Instinct MI300X", (9, 4), hip=True, gcn_arch="gfx942:sramecc+:xnack-")
MI250X = Device("AMD Instinct MI250X", (9, 0), hip=True, gcn_arch="gfx90a:sramecc+:xnack-")
RX7900 = Device("Radeon RX 7900 XTX", (11, 0), hip=True, gcn_arch="gfx1100")
BI_V100 = Device("Iluvatar BI-V100", (7, 1))
BI_V150 = Device("Iluvatar BI-V150", (8, 0))  # the capability of an A100
COREX_MARKED = Device("MR-V100", (8, 0), corex=True)  # no name prefix, the runtime marker says it

ALL = ["sm80", "sm90", "gfx942", "gfx90a", "ivcore11", "ivcore20"]

CASES = [
    # device, folders on offer, target picked (None: nothing runs; the JIT fallback or its error)
    (A100, ALL, "sm80"),
    (A10, ALL, "sm80"),
    (L4, ALL, "sm80"),
    (H100, ALL, "sm90"),
    (B200, ALL, None),  # SASS does not cross major versions; sm100 is not on offer
    (B200, ALL + ["sm100"], "sm100"),
    (A10, ["sm86", "sm80"], "sm86"),
    (MI300X, ALL, "gfx942"),
    (MI250X, ALL, "gfx90a"),
    (MI300X, ["gfx90a", "sm90"], None),  # code objects do not cross gfx versions
    (RX7900, ALL, None),
    (BI_V100, ALL, "ivcore11"),
    (BI_V150, ALL, "ivcore20"),
    (COREX_MARKED, ALL, "ivcore20"),
    (BI_V150, ["sm80", "sm90"], None),  # never the A100 cubins
    (H100, ["ivcore20", "gfx942"], None),
]


@pytest.mark.parametrize("device, available, expected", CASES,
                         ids=[f"{d.name}-{'+'.join(a)}" for d, a, _ in CASES])
def test_choose_picks_the_vendor_then_the_arch(device, available, expected):
    best, rejected = targets.choose(device, available)
    assert best == expected
    assert set(rejected) == set(available) - {best}
    for name, why in rejected.items():
        other = targets.get(name)
        if other.vendor != device.vendor:
            assert f"{other.vendor} {other.binary}" in why and device.vendor in why


@pytest.mark.parametrize("device, vendor, first", [
    (A100, "nvidia", ["sm80"]), (A10, "nvidia", ["sm86", "sm85", "sm84", "sm83", "sm82", "sm81", "sm80"]),
    (H100, "nvidia", ["sm90"]), (B200, "nvidia", ["sm100"]), (MI300X, "amd", ["gfx942"]),
    (MI250X, "amd", ["gfx90a"]), (RX7900, "amd", ["gfx1100"]), (BI_V100, "iluvatar", ["ivcore11"]),
    (BI_V150, "iluvatar", ["ivcore20"]), (Device("Iluvatar X", (9, 0)), "iluvatar", []),
])
def test_candidates_never_leave_the_vendor(device, vendor, first):
    assert device.vendor == vendor
    assert targets.candidates(device) == first


def test_the_error_for_an_iluvatar_gpu_with_only_nvidia_artifacts_names_both():
    msg = targets.no_target_message(BI_V150, ["sm80", "sm90"], "/x")
    assert "Iluvatar BI-V150 (iluvatar, capability 8.0)" in msg and "ivcore20" in msg
    assert "sm80 holds nvidia cubin binaries (cuda)" in msg


@pytest.mark.parametrize("name, backend, arch, warp, ext, machine, elf_arch, driver", [
    ("sm80", "cuda", 80, 32, ".cubin", 190, 80, "cuda"),
    ("sm90", "cuda", 90, 32, ".cubin", 190, 90, "cuda"),
    ("sm75", "cuda", 75, 32, ".cubin", 190, 75, "cuda"),  # any smNN is an NVIDIA target
    ("gfx942", "hip", "gfx942", 64, ".hsaco", 224, 0x4C, "hip"),
    ("gfx90a", "hip", "gfx90a", 64, ".hsaco", 224, 0x3F, "hip"),
    ("ivcore11", "corex", 71, 64, ".bin", None, None, "cuda"),
    ("ivcore20", "corex", 80, 64, ".bin", None, None, "cuda"),
])
def test_the_table(name, backend, arch, warp, ext, machine, elf_arch, driver):
    t = targets.get(name)
    assert (t.backend, t.arch, t.warp_size, t.ext, t.elf_machine, t.elf_arch, t.driver) == \
        (backend, arch, warp, ext, machine, elf_arch, driver)
    spec_arch = t.spec_arch()
    assert spec_arch.target == name and spec_arch.backend == backend and spec_arch.warp_size == warp
    assert int(spec_arch) == (arch if backend == "cuda" else 0)  # `arch >= 90` never holds off NVIDIA


@pytest.mark.parametrize("name", ["gfx1100", "sm", "sm9", "ivcore30", "cuda", ""])
def test_unknown_targets_are_refused_by_name(name):
    with pytest.raises(ValueError, match="unknown target"):
        targets.get(name)


def _write_manifest(folder, target: Target):
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(Manifest(target, "0.2.0", "3.6.0", []).to_json())


@pytest.mark.parametrize("device, expected", [(H100, "sm90"), (A100, "sm80"), (MI300X, "gfx942"),
                                              (MI250X, "gfx90a"), (BI_V150, "ivcore20"), (BI_V100, None),
                                              (RX7900, None), (B200, None)])
def test_load_target_reads_only_the_devices_own_folder(tmp_path, device, expected):
    for name in ("sm80", "sm90", "gfx942", "gfx90a", "ivcore20"):
        _write_manifest(tmp_path / name, Target.from_name(name))
    artifacts.set_artifacts(tmp_path)
    try:
        found = artifacts.load_target(device)
    finally:
        artifacts.set_artifacts(None)
    assert (found.name if found else None) == expected
    if found:
        assert found.info.vendor == device.vendor and found.manifest.target == Target.from_name(expected)


@pytest.mark.parametrize("folder, record, match", [
    # An A100 build copied into the Iluvatar folder: refused, never launched on the ivcore20 GPU.
    ("ivcore20", Target.from_name("sm80"), "manifest is for target sm80, expected ivcore20"),
    # A relabelled record: the name is right, the rest is not the table's.
    ("ivcore20", Target("ivcore20", "cuda", 80, 32), "records target ivcore20 as backend 'cuda'"),
    ("gfx942", Target("gfx942", "hip", "gfx942", 32), "warp size 32; gfx942 is backend 'hip', arch 'gfx942', warp size 64"),
    ("gfx942", Target("gfx942", "hip", "gfx90a", 64), "arch 'gfx90a'"),
    ("sm90", Target("sm90", "hip", 90, 32), "backend 'hip'"),
    ("gfx1100", Target("gfx1100", "hip", "gfx1100", 32), "unknown target 'gfx1100'"),
])
def test_a_manifest_is_never_loaded_on_another_target(tmp_path, folder, record, match):
    _write_manifest(tmp_path / folder, record)
    with pytest.raises(ManifestError, match=match.replace("(", r"\(").replace(")", r"\)")):
        read_manifest(tmp_path / folder, expect_target=folder)


def test_the_manifest_records_backend_and_warp_size(tmp_path):
    _write_manifest(tmp_path / "gfx942", Target.from_name("gfx942"))
    doc = json.loads((tmp_path / "gfx942" / "manifest.json").read_text())
    assert doc["target"] == {"name": "gfx942", "backend": "hip", "arch": "gfx942", "warp_size": 64}
    assert read_manifest(tmp_path / "gfx942").target.info.driver == "hip"


@pytest.mark.parametrize("name, hip, gcn, corex, vendor, first", [
    ("NVIDIA H100 80GB HBM3", None, "", None, "nvidia", "sm90"),
    ("AMD Instinct MI300X", "6.2.41133", "gfx942:sramecc+:xnack-", None, "amd", "gfx942"),
    ("Iluvatar BI-V150", None, "", None, "iluvatar", "ivcore20"),
    ("BI-V150", None, "", "4.1.0", "iluvatar", "ivcore20"),  # the runtime marker without the name
])
def test_describe_reads_vendor_markers_from_torch(monkeypatch, name, hip, gcn, corex, vendor, first):
    import torch

    cap = {"nvidia": (9, 0), "amd": (9, 4), "iluvatar": (8, 0)}[vendor]
    props = types.SimpleNamespace(name=name, gcnArchName=gcn)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: cap)
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.version, "corex", corex, raising=False)
    device = targets.describe(0)
    assert device.vendor == vendor and targets.candidates(device)[0] == first


def _relabel(tiny_artifacts, root, name):
    """The tiny sm90 build's manifest and files under another target's folder (the loader checks
    sha256 before a load, not the ELF: verify does that)."""
    import shutil

    m = read_manifest(tiny_artifacts / "sm90")
    shutil.copytree(tiny_artifacts / "sm90" / "bin", root / name / "bin")
    (root / name / "manifest.json").write_text(Manifest(Target.from_name(name), m.aotc_version, m.triton_version,
                                                        m.entries).to_json())


def test_an_iluvatar_gpu_launches_its_ivcore_binary_through_the_cuda_api_with_64_thread_warps(
        tiny_artifacts, tmp_path, fake_driver):
    from aotc.kernels.registry import get_spec
    from aotc.loader import dispatch

    from .conftest import FakeTensor

    _relabel(tiny_artifacts, tmp_path, "ivcore20")
    _write_manifest(tmp_path / "sm80", Target.from_name("sm80"))
    artifacts.set_artifacts(tmp_path)
    try:
        target = artifacts.load_target(BI_V150)
        sel = dispatch.Selection(get_spec("tiny_axpy"), {"block": 64, "dtype": "fp16"}, 0, target, BI_V150)
        sel.launch((2, 1, 1), [FakeTensor(0x1000), FakeTensor(0x2000), FakeTensor(0x3000), 128, 100, 3, 0.5], 5)
    finally:
        artifacts.set_artifacts(None)
    assert target.name == "ivcore20" and sel.driver is fake_driver
    entry = target.entries["tiny_axpy(block=64,dtype=fp16)@aligned"]
    (_, grid, block, *_), = fake_driver.launches
    assert grid == (2, 1, 1) and block == (64 * entry.num_warps, 1, 1)


def test_an_iluvatar_gpu_with_only_nvidia_artifacts_never_loads_them(tiny_artifacts, tmp_path, fake_driver,
                                                                      monkeypatch):
    from aotc.kernels.registry import get_spec
    from aotc.loader import dispatch, fallback

    from .conftest import FakeTensor

    monkeypatch.setenv("AOTC_DISABLE_JIT", "1")
    monkeypatch.setitem(dispatch._devices, 0, BI_V150)
    artifacts.set_artifacts(tiny_artifacts)  # sm80 and sm90: A100 and H100 cubins
    try:
        sel = dispatch._selection(get_spec("tiny_axpy"), {"block": 64, "dtype": "fp16"}, 0)
        with pytest.raises(fallback.MissingVariantError) as err:
            sel.launch((1, 1, 1), [FakeTensor(0x1000), FakeTensor(0x2000), FakeTensor(0x3000), 16, 1, 1, 1.0], 0)
    finally:
        artifacts.set_artifacts(None)
        dispatch.reset()
    assert sel.target is None and fake_driver.loaded == [] and fake_driver.launches == []
    msg = str(err.value)
    assert "Iluvatar BI-V150 (iluvatar, capability 8.0)" in msg and "sm80 holds nvidia cubin binaries" in msg
    assert "on corex80" not in msg and "on ivcore20" in msg  # the miss names the target to build


def test_a_variant_a_spec_leaves_out_on_a_target_raises_naming_it():
    from aotc.kernels.decode import spec as decode_spec
    from aotc.kernels.variants import KernelSpec
    from aotc.loader import fallback

    split = decode_spec.SPLIT
    cuda_int8_only = KernelSpec(  # decode's split kernel with int8 caches left out off CUDA
        name=split.name, module=split.module, function=split.function, args=split.args,
        constexpr_names=split.constexpr_names, constexprs=split.constexprs, variants=split.variants,
        launch=lambda axes, arch: None if axes["kv"] == "int8" and arch.backend != "cuda" else split.launch(axes, arch),
        folder=str(split.folder), target_constexprs=split.target_constexprs)
    axes = next(a for a in decode_spec.split_variants() if a["kv"] == "int8")
    arch = targets.get("gfx942").spec_arch()
    with pytest.raises(NotImplementedError, match=r"does not exist on target gfx942 \(hip\)"):
        fallback.launch_config(cuda_int8_only, axes, arch)
    assert fallback.launch_config(cuda_int8_only, axes, targets.get("sm90").spec_arch()) is not None
    assert fallback.launch_config(split, axes, arch) is not None  # the real spec declares it everywhere


@pytest.mark.parametrize("maps, expected", [
    ("7f00-7f10 r-xp 0 08:01 1 /usr/local/corex/lib64/libcuda.so.1\n", True),
    ("7f00-7f10 r-xp 0 08:01 1 /usr/local/corex-4.1.0/lib/libcudart.so.10.2\n", True),
    ("7f00-7f10 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54\n", False),
    ("", False),
])
def test_the_corex_runtime_marker(maps, expected):
    assert targets.corex_runtime_mapped(maps) is expected
