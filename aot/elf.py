"""Reading the two facts `aotc verify` checks in a cubin: it is a CUDA ELF for the right SM, and it
defines the kernel's symbol. Stdlib only."""
from __future__ import annotations

import struct

EM_CUDA = 190


class ElfError(ValueError):
    pass


def cubin_info(data: bytes) -> tuple[int, set[str]]:
    """(SM number from e_flags, names in the symbol table) of a 64-bit little-endian cubin."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF")
    e_machine = struct.unpack_from("<H", data, 18)[0]
    if e_machine != EM_CUDA:
        raise ElfError(f"e_machine {e_machine}, expected {EM_CUDA} (CUDA)")
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
    return e_flags & 0xFF, symbols
