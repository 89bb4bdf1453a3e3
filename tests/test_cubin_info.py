"""kernels.cubin_info: the register and stack-frame records of a cubin's
``.nv.info``, on a hand-built ELF file and on a real compile (no GPU)."""

import struct

import pytest

from kernels import cubin_info as ci


def _elf(sections: dict[str, bytes]) -> bytes:
    """A minimal 64-bit ELF file holding ``sections`` (plus the null section
    and ``.shstrtab``), headers at the end, as a cubin lays them out."""
    names = [""] + list(sections) + [".shstrtab"]
    shstrtab = b"\0".join(n.encode() for n in names) + b"\0"
    offsets = [sum(len(n) + 1 for n in names[:i]) for i in range(len(names))]
    body, placed = b"", []
    for data in list(sections.values()) + [shstrtab]:
        placed.append((64 + len(body), len(data)))
        body += data
    shoff = 64 + len(body)
    header = (b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
              + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64,
                            len(names), len(names) - 1))
    table = bytes(64) + b"".join(struct.pack("<IIQQQQIIQQ", offsets[i + 1], 1, 0, 0, off, size,
                                             0, 0, 1, 0)
                                 for i, (off, size) in enumerate(placed))
    return header + body + table


def _symtab(*names: str) -> tuple[bytes, bytes]:
    strtab = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    symtab = bytes(24) + b"".join(
        struct.pack("<IBBHQQ", strtab.index(n.encode() + b"\0"), 0x12, 0, 0, 0, 0)
        for n in names)
    return symtab, strtab


def _sval(attr: int, *words: int) -> bytes:
    return struct.pack("<BBH", ci._SVAL, attr, 4 * len(words)) + struct.pack(
        f"<{len(words)}I", *words)


def test_records_by_hand():
    symtab, strtab = _symtab("kernel_a", "kernel_b")
    info = (_sval(ci.EIATTR_REGCOUNT, 1, 90) + struct.pack("<BBH", ci._HVAL, 0x1B, 7)
            + struct.pack("<BB", ci._NVAL, 0x01) + _sval(ci.EIATTR_FRAME_SIZE, 1, 120)
            + _sval(ci.EIATTR_REGCOUNT, 2, 32) + _sval(0x23, 2, 5, 6))
    elf = _elf({".strtab": strtab, ".symtab": symtab, ".nv.info": info})
    assert ci.kernel_resources(elf) == {"kernel_a": ci.Resources(90, 120),
                                        "kernel_b": ci.Resources(32, 0)}
    assert ci.entry_resources(elf, "_b") == ci.Resources(32, 0)
    assert ci.entry_resources(elf, "missing") is None


def test_bad_input():
    with pytest.raises(ValueError, match="not a 64-bit ELF file"):
        ci.kernel_resources(b"// PTX, not a cubin")
    symtab, strtab = _symtab("k")
    with pytest.raises(ValueError, match="unknown .nv.info record format 0x9"):
        ci.kernel_resources(_elf({".strtab": strtab, ".symtab": symtab,
                                  ".nv.info": bytes([9, 0x2F, 0, 0])}))


def test_a_real_compile(tmp_path):
    """The DSL keeps the cubin beside the PTX; its kernel has a register
    count a 64-thread CTA can hold and no stack frame."""
    from kernels.indexer.compile import ProjectionConfig, compile_projection
    from kernels.indexer.layout import Tactic

    compile_projection.uncached(ProjectionConfig(key=128, heads=64, gate=128, k=7168, tokens=1,
                                                 tactic=Tactic(2, 16), arch="sm_90a"),
                                dump_dir=str(tmp_path))
    (cubin,) = tmp_path.glob("*.cubin")
    res = ci.entry_resources(cubin.read_bytes(), "ProjectionKernel")
    assert res is not None and 16 <= res.registers <= 255 and res.stack_bytes == 0
