"""An ELF64 shared library read, never run: what :mod:`kernels.ggml.build` needs of a libggml-cpu whatever its
architecture — an AArch64 build cannot be loaded in an x86-64 process, but its compile-time constants can be read.

:func:`read_elf` parses the header, the section headers and ``.dynsym`` (the exported symbols' addresses);
:meth:`Elf.returned_int` reads what a function that only returns a constant returns (``ggml_cpu_has_neon`` compiles
to ``mov w0, #1; ret`` on AArch64, ``mov eax, 1; ret`` on x86-64), :meth:`Elf.returned_string` the string literal a
function returns (``ggml_version``: ``adrp x0; add x0, x0, #lo12; ret``), :meth:`Elf.compiler` who compiled it
(the ``.comment`` section: ``GCC: (Debian 12.2.0-14) 12.2.0``, ``Debian clang version 14.0.6``). Anything else is
None: the reader never guesses (the caller refuses in one line).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

X86_64, ARM64 = "x86-64", "AArch64"
#: ELF e_machine -> its name (elf.h: EM_X86_64 62, EM_AARCH64 183, EM_RISCV 243, EM_PPC64 21, EM_S390 22, …)
ELF_MACHINES = {62: X86_64, 183: ARM64, 243: "RISC-V", 21: "POWER", 22: "s390x", 3: "x86 (32-bit)", 40: "ARM (32-bit)"}


@dataclass(frozen=True)
class Elf:
    """An ELF64 little-endian shared library, read and never run: its machine, the addresses of its exported
    symbols (``.dynsym``), its sections. What a compile-time constant compiled to can be read from it whatever the
    architecture (:meth:`returned_int`, :meth:`returned_string`); so can the compiler (:meth:`compiler`)."""

    path: Path
    data: bytes
    machine: str  # ELF_MACHINES' word for e_machine ("AArch64", "x86-64", …)
    sections: dict  # name -> (address, file offset, size)
    symbols: dict  # exported name -> address

    def _at(self, address: int, n: int) -> bytes:
        for addr, off, size in self.sections.values():
            if addr and addr <= address < addr + size:
                return self.data[off + address - addr: off + min(address - addr + n, size)]
        return b""

    def section(self, name: str) -> bytes:
        _, off, size = self.sections.get(name, (0, 0, 0))
        return self.data[off:off + size]

    def returned_int(self, name: str) -> int | None:
        """The constant the exported function ``name`` returns when its body is nothing else (AArch64 ``mov w0,
        #imm`` / ``mov w0, wzr``, then ``ret``; x86-64 ``mov eax, imm32`` / ``xor eax, eax``, then ``ret``); None
        when it is not exported or computes something (``ggml_cpu_get_sve_cnt`` of an SVE build: a load)."""
        if name not in self.symbols:
            return None
        code = self._at(self.symbols[name], 12)  # x86-64: endbr64 (4) + mov eax, imm32 (5) + ret (1) at most
        if self.machine == ARM64 and len(code) >= 8:
            insn, ret = struct.unpack("<II", code[:8])
            if ret != 0xD65F03C0:  # ret
                return None
            if insn & 0xFFE0001F == 0x52800000:  # movz w0, #imm16 (hw 0)
                return (insn >> 5) & 0xFFFF
            return 0 if insn == 0x2A1F03E0 else None  # mov w0, wzr
        if self.machine == X86_64:
            code = code[4:] if code.startswith(b"\xf3\x0f\x1e\xfa") else code  # endbr64
            if code[:1] == b"\xb8" and code[5:6] == b"\xc3":
                return struct.unpack("<i", code[1:5])[0]
            return 0 if code[:3] in (b"\x31\xc0\xc3", b"\x33\xc0\xc3") else None
        return None

    def returned_string(self, name: str) -> str | None:
        """The string literal the exported function ``name`` returns (AArch64 ``adrp x0, P; add x0, x0, #O; ret``:
        ``ggml_version()``, ``ggml_commit()``), None otherwise."""
        if self.machine != ARM64 or name not in self.symbols:
            return None
        pc = self.symbols[name]
        code = self._at(pc, 12)
        if len(code) < 12:
            return None
        adrp, add, ret = struct.unpack("<III", code)
        if adrp & 0x9F00001F != 0x90000000 or add & 0xFFC003FF != 0x91000000 or ret != 0xD65F03C0:
            return None  # not adrp x0 / add x0, x0, #imm12 / ret
        page = ((adrp >> 5) & 0x7FFFF) << 2 | (adrp >> 29) & 3
        page -= (1 << 21) if page & (1 << 20) else 0  # 21-bit signed page offset
        address = (pc & ~0xFFF) + (page << 12) + ((add >> 10) & 0xFFF)
        text = self._at(address, 256)
        return text.split(b"\0", 1)[0].decode("utf-8", "replace") if b"\0" in text else None

    def compiler(self) -> str | None:
        """Who compiled the library, from its ``.comment`` strings: ``"clang 14.0.6"`` when any is clang's (a clang
        build also carries the GCC toolchain's crt objects' ``GCC: (…) 12.2.0``), else ``"GCC 12.2.0"``; None when
        it has none."""
        notes = [x.decode("utf-8", "replace") for x in self.section(".comment").split(b"\0") if x]
        for pattern, name in ((r"clang version (\d+(?:\.\d+)*)", "clang"), (r"^GCC: \(.*\) (\d+(?:\.\d+)*)", "GCC")):
            for note in notes:
                m = re.search(pattern, note)
                if m:
                    return f"{name} {m.group(1)}"
        return None


def read_elf(so: Path) -> Elf:
    """:class:`Elf` of the shared library ``so``; ValueError for a file that is not a 64-bit little-endian ELF (a
    Mach-O of macOS, a 32-bit build)."""
    data = Path(so).read_bytes()
    if data[:4] != b"\x7fELF" or data[4:6] != b"\x02\x01":
        raise ValueError(f"{so} is not a 64-bit little-endian ELF library")
    e_machine, = struct.unpack_from("<H", data, 18)
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
    # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, addralign, entsize
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def cstr(offset: int) -> str:
        return data[offset:data.index(b"\0", offset)].decode("utf-8", "replace")

    names = [cstr(heads[shstrndx][4] + h[0]) for h in heads]
    sections = {n: (h[3], h[4], h[5] if h[1] != 8 else 0) for n, h in zip(names, heads)}  # 8: SHT_NOBITS (.bss)
    symbols = {}
    if ".dynsym" in names:
        dynsym = heads[names.index(".dynsym")]
        strtab = heads[dynsym[6]][4]  # sh_link: .dynstr
        for off in range(dynsym[4], dynsym[4] + dynsym[5], 24):  # Elf64_Sym: name, info, other, shndx, value, size
            st_name, _, _, shndx, value, _ = struct.unpack_from("<IBBHQQ", data, off)
            if shndx and value:  # defined here
                symbols[cstr(strtab + st_name)] = value
    return Elf(Path(so), data, ELF_MACHINES.get(e_machine, f"e_machine {e_machine}"), sections, symbols)
