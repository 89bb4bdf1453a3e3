"""What ptxas gave each kernel of a cubin: registers a thread and stack
frame bytes, read from the cubin's ``.nv.info`` attributes (no GPU, no CUDA
tool: the cubin is an ELF file).

The DSL keeps the cubin of a compile next to its PTX (``--keep-cubin``,
:func:`kernels.lamport.compile._options`), and ``jobs compile-check`` reports
these per variant. Registers bound occupancy (the fused indexer's 512-thread
CTAs can use at most 128 a thread); the stack frame is a thread's local
memory: registers ptxas spilled, or arrays it could not keep in registers
(the fused indexer has no local arrays, so a frame above zero there means
spills; some Lamport consumers keep 8-16 bytes at 32-64 registers). Checked
against ``ptxas -v`` on the same PTX: the same register counts and the same
frame sizes.
"""

from __future__ import annotations

import dataclasses
import struct

#: ``.nv.info`` attribute codes (EIATTR_*) read here.
EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F
#: ``.nv.info`` record formats: EIFMT_NVAL (no value), EIFMT_BVAL (1 byte),
#: EIFMT_HVAL (2 bytes), EIFMT_SVAL (a sized value).
_NVAL, _BVAL, _HVAL, _SVAL = 1, 2, 3, 4


@dataclasses.dataclass(frozen=True)
class Resources:
    """One kernel's registers a thread and stack frame bytes."""
    registers: int
    stack_bytes: int


def _sections(elf: bytes) -> dict[str, bytes]:
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not a 64-bit ELF file (a cubin)")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)
               for i in range(shnum)]
    names = headers[shstrndx][4]

    def name(offset: int) -> str:
        return elf[names + offset:elf.index(b"\0", names + offset)].decode()
    return {name(h[0]): elf[h[4]:h[4] + h[5]] for h in headers}


def _symbols(elf: bytes, sections: dict[str, bytes]) -> list[str]:
    table, strings = sections.get(".symtab", b""), sections.get(".strtab", b"")
    out = []
    for i in range(0, len(table), 24):
        (offset,) = struct.unpack_from("<I", table, i)
        out.append(strings[offset:strings.index(b"\0", offset)].decode() if strings else "")
    return out


def _records(data: bytes):
    """(attribute, value bytes) of every ``.nv.info`` record."""
    i = 0
    while i + 2 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == _SVAL:
            (size,) = struct.unpack_from("<H", data, i + 2)
            yield attr, data[i + 4:i + 4 + size]
            i += 4 + size
        elif fmt in (_BVAL, _HVAL):
            yield attr, data[i + 2:i + 4]
            i += 4
        elif fmt == _NVAL:
            i += 2
        else:
            raise ValueError(f"unknown .nv.info record format {fmt:#x} at byte {i}")


def kernel_resources(cubin: bytes) -> dict[str, Resources]:
    """Kernel (function symbol) name -> its :class:`Resources`, for every
    function the cubin's ``.nv.info`` gives a register count. ValueError if
    ``cubin`` is not a 64-bit ELF file."""
    sections = _sections(cubin)
    symbols = _symbols(cubin, sections)
    regs: dict[int, int] = {}
    frames: dict[int, int] = {}
    for name, data in sections.items():
        if name != ".nv.info" and not name.startswith(".nv.info."):
            continue
        for attr, value in _records(data):
            if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and len(value) >= 8:
                symbol, amount = struct.unpack_from("<II", value)
                (regs if attr == EIATTR_REGCOUNT else frames)[symbol] = amount
    return {symbols[s] if s < len(symbols) else f"#{s}": Resources(n, frames.get(s, 0))
            for s, n in regs.items()}


def entry_resources(cubin: bytes, entry: str) -> Resources | None:
    """The :class:`Resources` of the first kernel whose name contains
    ``entry`` (as :func:`kernels.ptx_checks.entry_body` finds the PTX
    ``.entry``), or None if the cubin has no such kernel."""
    return next((r for name, r in kernel_resources(cubin).items() if entry in name), None)
