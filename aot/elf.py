"""Reading the facts `aotc verify` checks in a binary: its ELF machine and flags (for the target's
vendor and arch, loader/targets.py) and that it defines the kernel's symbol. Stdlib only."""
from __future__ import annotations

import struct

from aotc.loader.targets import AMDGPU_MACH, EM_AMDGPU, EM_CUDA, TargetInfo

_MACHINES = {EM_CUDA: "CUDA", EM_AMDGPU: "AMDGPU"}
_GFX = {code: name for name, code in AMDGPU_MACH.items()}


class ElfError(ValueError):
    pass


def elf_info(data: bytes) -> tuple[int, int, set[str]]:
    """(e_machine, e_flags, names in the symbol table) of a 64-bit little-endian ELF."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF")
    e_machine = struct.unpack_from("<H", data, 18)[0]
    e_flags = struct.unpack_from("<I", data, 48)[0]
    e_shoff = struct.unpack_from("<Q", data, 40)[0]
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 58)
    symbols: set[str] = set()
    try:
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
        for sh in sections:
            if sh[1] != 2:  # SHT_SYMTAB
                continue
            strtab = sections[sh[6]]
            str_off, str_size = strtab[4], strtab[5]
            for off in range(sh[4], sh[4] + sh[5], sh[9] or 24):
                name_off = struct.unpack_from("<I", data, off)[0]
                end = data.index(b"\0", str_off + name_off, str_off + str_size)
                symbols.add(data[str_off + name_off:end].decode("ascii", "replace"))
    except (struct.error, IndexError, ValueError) as e:
        raise ElfError(f"malformed section or symbol table: {e}") from None
    return e_machine, e_flags, symbols


def _arch_name(machine: int, arch: int) -> str:
    if machine == EM_CUDA:
        return f"sm{arch}"
    if machine == EM_AMDGPU:
        return _GFX.get(arch, f"AMDGPU mach 0x{arch:03x}")
    return f"arch {arch}"


def check_binary(data: bytes, target: TargetInfo) -> tuple[list[str], set[str]]:
    """(problems with `data` as a binary of `target`, its symbols): ELF machine and arch field."""
    machine, flags, symbols = elf_info(data)
    problems = []
    if target.elf_machine is not None and machine != target.elf_machine:
        kind = _MACHINES.get(machine, "unknown")
        problems.append(f"e_machine {machine} ({kind}), expected {target.elf_machine} "
                        f"({_MACHINES[target.elf_machine]}) for {target.name}")
    elif target.elf_arch is not None and target.elf_arch_of(flags) != target.elf_arch:
        got = _arch_name(machine, target.elf_arch_of(flags))
        problems.append(f"is for {got}, manifest target is {target.name}")
    return problems, symbols


def cubin_info(data: bytes) -> tuple[int, set[str]]:
    """(SM number from e_flags, symbols) of a cubin; ElfError for any other ELF machine."""
    machine, flags, symbols = elf_info(data)
    if machine != EM_CUDA:
        raise ElfError(f"e_machine {machine}, expected {EM_CUDA} (CUDA)")
    return flags & 0xFF, symbols
