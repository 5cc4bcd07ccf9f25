"""Targets as data: which vendor, arch, warp size, binary format and driver each target means, and
which targets a device may run. Stdlib only: the build (aotc.aot) and the loader both import it.

A target's name is its artifacts folder (`sm90/`, `gfx942/`, `ivcore20/`) and its `--arch`.
Nothing outside this table assumes NVIDIA (cubin names, 32-thread warps, e_machine 190).

Choosing a target is a pure function of a `Device` (vendor markers, capability, AMD arch name)
and the targets on offer, returning the choice plus why each other target was refused
(`choose`), so every device kind is tested without hardware (tests/cpu/loader/test_targets.py).
The vendor is decided before the capability: Iluvatar GPUs report a CUDA-like capability (8.0
for ivcore20) through a CUDA-compatible driver, and picking by capability alone would launch
A100 cubins on them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

EM_CUDA = 190  # ELF e_machine of a cubin; e_flags & 0xff is the SM (90 for sm_90)
EM_AMDGPU = 224  # ELF e_machine of an AMD code object (hsaco)
EF_AMDGPU_MACH = 0x0FF  # e_flags mask of the processor (LLVM's BinaryFormat/ELF.h)
# EF_AMDGPU_MACH_AMDGCN_* (LLVM's ELF.h); read back from code objects Triton 3.6 compiled here:
# gfx942 e_flags 0x54c, gfx90a 0x53f (the bits above 0xff are the xnack/sramecc features).
AMDGPU_MACH = {"gfx90a": 0x03F, "gfx942": 0x04C}


@dataclass(frozen=True)
class TargetInfo:
    """One row of the table. `arch` is what Triton's GPUTarget takes (an int SM for cuda, the gfx
    name for hip); `driver` names the loader's binding (loader/cuda_driver.py, loader/hip_driver.py;
    CoreX speaks the CUDA driver API). `elf_machine`/`elf_arch` are what `aotc verify` checks:
    e_machine, and the arch field of e_flags (None where no public document gives it)."""

    name: str
    backend: str  # "cuda", "hip", "corex": Triton's backend name
    vendor: str  # "nvidia", "amd", "iluvatar"
    arch: int | str
    warp_size: int
    binary: str  # "cubin", "hsaco", "corex ELF"
    ext: str  # file extension of its binaries under bin/
    elf_machine: int | None
    elf_arch: int | None
    driver: str  # "cuda" or "hip"
    capability: tuple[int, int] | None = None  # CUDA-style capability the device reports (corex)
    triton_package: str = "triton"  # the distribution whose Triton compiles it
    asm: str = "cubin"  # the key of the binary in Triton's CompiledKernel.asm

    def spec_arch(self):
        """The `arch` a spec's launch(axes, arch) receives for this target (kernels.variants.TargetArch)."""
        from aotc.kernels.variants import TargetArch

        return TargetArch(self.arch if self.backend == "cuda" else 0, self.name, self.backend, self.warp_size)

    def elf_arch_of(self, e_flags: int) -> int:
        """The arch field of an ELF's e_flags, comparable with `elf_arch`."""
        return e_flags & (EF_AMDGPU_MACH if self.backend == "hip" else 0xFF)


def _cuda(sm: int) -> TargetInfo:
    return TargetInfo(f"sm{sm}", "cuda", "nvidia", sm, 32, "cubin", ".cubin", EM_CUDA, sm, "cuda")


def _hip(gfx: str) -> TargetInfo:
    # CDNA (gfx9xx) runs 64-thread wavefronts; Triton's HIP launcher uses block = warp_size * num_warps.
    return TargetInfo(gfx, "hip", "amd", gfx, 64, "hsaco", ".hsaco", EM_AMDGPU, AMDGPU_MACH[gfx], "hip", asm="hsaco")


def _corex(name: str, capability: tuple[int, int]) -> TargetInfo:
    # FlagTree's third_party/iluvatar: backend "corex", 64-thread warps, binaries loaded through CoreX's
    # CUDA-compatible cuModuleLoadData / cuLaunchKernel. Its ELF machine number is not documented
    # publicly, so `aotc verify` checks the ELF header and symbol only. Not run here (no Iluvatar GPU).
    return TargetInfo(name, "corex", "iluvatar", capability[0] * 10 + capability[1], 64, "corex ELF", ".bin",
                      None, None, "cuda", capability=capability, triton_package="flagtree")


# Named targets; any other smNN is an NVIDIA target too (`get`).
TARGETS = {t.name: t for t in (
    _cuda(80), _cuda(86), _cuda(89), _cuda(90), _cuda(100), _cuda(120),
    _hip("gfx942"), _hip("gfx90a"),
    _corex("ivcore11", (7, 1)), _corex("ivcore20", (8, 0)),
)}
_SM = re.compile(r"sm([1-9][0-9]+)")


def get(name: str) -> TargetInfo:
    """The table's row for a target name; ValueError naming the known targets otherwise."""
    info = TARGETS.get(name)
    if info is None:
        m = _SM.fullmatch(name)
        if m is None:
            raise ValueError(f"unknown target {name!r}: expected smNN (NVIDIA, e.g. sm90, sm80) or one of "
                             f"{', '.join(n for n in TARGETS if not n.startswith('sm'))}")
        info = _cuda(int(m.group(1)))
    return info


@dataclass(frozen=True)
class Device:
    """What the loader knows of a GPU when it picks a target (read by `describe`; tests build it)."""

    name: str
    capability: tuple[int, int]
    hip: bool = False  # torch is a ROCm build
    gcn_arch: str = ""  # AMD: "gfx942:sramecc+:xnack-"
    corex: bool = False  # a CoreX runtime marker was found (see describe)

    @property
    def vendor(self) -> str:
        # Iluvatar first: its capability and driver API look like NVIDIA's.
        if self.corex or self.name.startswith("Iluvatar"):
            return "iluvatar"
        return "amd" if self.hip else "nvidia"

    @property
    def label(self) -> str:
        major, minor = self.capability
        arch = self.gcn_arch.split(":")[0] if self.vendor == "amd" else f"capability {major}.{minor}"
        return f"{self.name or 'GPU'} ({self.vendor}, {arch})"


def candidates(device: Device) -> list[str]:
    """Target names `device` can run, best first.

    NVIDIA M.m: smMx for x <= m (SASS runs within one major version only). AMD: exactly its gfx
    arch (code objects do not run across gfx versions). Iluvatar: the ivcore target of its
    reported capability, and no sm target ever.
    """
    vendor = device.vendor
    if vendor == "nvidia":
        major, minor = device.capability
        return [f"sm{major}{m}" for m in range(minor, -1, -1)]
    if vendor == "amd":
        gfx = device.gcn_arch.split(":")[0]
        return [gfx] if gfx else []
    return [t.name for t in TARGETS.values() if t.vendor == "iluvatar" and t.capability == tuple(device.capability)]


def refusal(device: Device, name: str) -> str | None:
    """Why `device` cannot run target `name`, or None when it can."""
    try:
        info = get(name)
    except ValueError as e:
        return str(e)
    if info.vendor != device.vendor:
        return (f"{name} holds {info.vendor} {info.binary} binaries ({info.backend}); this device is "
                f"{device.label}")
    if name not in candidates(device):
        if device.vendor == "amd":
            return f"{name} code objects run on {name} only; this device is {device.label}"
        return f"{name} binaries do not run on {device.label}"
    return None


def choose(device: Device, available) -> tuple[str | None, dict[str, str]]:
    """(the best target of `available` that `device` runs, or None; why each other one was refused)."""
    order = candidates(device)
    rejected = {name: refusal(device, name) for name in sorted(available)}
    ok = [n for n in order if n in rejected and rejected[n] is None]
    best = ok[0] if ok else None
    return best, {n: r or f"{best} is preferred" for n, r in rejected.items() if n != best}


def device_target(device: Device) -> TargetInfo:
    """The target `device` runs best, from the table; for a device no aotc target serves (gfx1100,
    an Iluvatar of another capability) a row made up for the JIT fallback, which needs the backend
    and warp size only."""
    for name in candidates(device):
        try:
            return get(name)
        except ValueError:
            break
    vendor = device.vendor
    if vendor == "amd":
        gfx = device.gcn_arch.split(":")[0] or "gfx"
        # RDNA (gfx10+) runs 32-thread waves in Triton (HIPOptions.warp_size), CDNA 64.
        warp = 32 if gfx[3:-2].isdigit() and int(gfx[3:-2]) >= 10 else 64
        return TargetInfo(gfx, "hip", "amd", gfx, warp, "hsaco", ".hsaco", EM_AMDGPU, None, "hip", asm="hsaco")
    if vendor == "iluvatar":
        major, minor = device.capability
        return TargetInfo(f"corex{major}{minor}", "corex", "iluvatar", major * 10 + minor, 64, "corex ELF", ".bin",
                          None, None, "cuda", capability=tuple(device.capability), triton_package="flagtree")
    major, minor = device.capability
    return _cuda(major * 10 + minor)


def describe(index: int) -> Device:
    """The `Device` of torch's CUDA/ROCm device `index` (imports torch)."""
    import torch

    props = torch.cuda.get_device_properties(index)
    hip = bool(getattr(torch.version, "hip", None))
    # CoreX builds of torch report CUDA; their device names start with "Iluvatar" (BI-V100/V150,
    # MR-V100). Runtime markers too: a `corex` version attribute, or a CUDA library mapped from the
    # CoreX SDK (installed under /usr/local/corex). Unverified on Iluvatar hardware.
    corex = bool(getattr(torch.version, "corex", None)) or corex_runtime_mapped()
    return Device(name=str(props.name), capability=tuple(torch.cuda.get_device_capability(index)),
                  hip=hip, gcn_arch=str(getattr(props, "gcnArchName", "") or "") if hip else "", corex=corex)


def corex_runtime_mapped(maps: str | None = None) -> bool:
    """Whether this process has a CUDA runtime or driver library from a CoreX SDK mapped."""
    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return False
    return any("/corex" in line and "libcuda" in line for line in maps.splitlines())


def no_target_message(device: Device, available, source: str) -> str:
    """Why no target of `source` runs on `device`, each folder's reason included."""
    best, rejected = choose(device, available)
    want = ", ".join(candidates(device)) or "none: aotc has no target for this device"
    reasons = "; ".join(f"{n}: {r}" for n, r in rejected.items()) or "it has no target folders"
    return f"no artifacts for {device.label} in {source} (targets it runs: {want}); {reasons}"
