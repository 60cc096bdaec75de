"""Addresses in a recorded process → function names, with file:line where debug info exists.

The agent records the target's executable mappings (meta.json `ldb.modules`: start, end,
file offset, path). An address is turned into a file offset within its module, then into the
module's virtual address through the ELF program headers (so PIE executables, ASLR and shared
libraries all resolve the same way), then looked up in the module's function symbols
(.symtab, else .dynsym) and, when the module has DWARF, its line table. All ELF and DWARF
parsing is pyelftools'. C++ names are demangled with c++filt when it is installed.

What cannot be named is still located: `module+0xOFFSET` (a stripped binary, a JIT region, a
module that changed on disk since the recording). `Symbolizer.warnings` says which modules
had no symbols, once each.
"""

from __future__ import annotations

import bisect
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

# DWARF line tables larger than this are skipped (names still resolve): pyelftools is pure
# Python, and a report should not stall on libc-sized debug info.
MAX_DWARF_BYTES = 64 << 20


@dataclass(frozen=True)
class Symbol:
    name: str  # function name, or "module+0xoff" when unknown
    module: str  # basename of the mapped file ("" when the address is in no module)
    offset: int  # file offset of the address in its module
    file: str | None = None
    line: int | None = None
    known: bool = False  # resolved to a symbol

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file and self.line else ""


class _Module:
    """One ELF file: its loadable segments, function symbols and (lazily) line table."""

    def __init__(self, path: str):
        self.path = path
        self.ok = False
        self.segments: list[tuple[int, int, int]] = []  # (p_offset, p_filesz, p_vaddr)
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.names: list[str] = []
        self._cu_lines: dict[int, tuple[list[int], list[tuple[str, int]]]] = {}
        self._dwarf = None
        self._aranges = None
        self._file = None
        self._has_dwarf = False
        self.stripped = True
        try:
            with open(path, "rb") as f:
                elf = ELFFile(f)
                for seg in elf.iter_segments():
                    if seg["p_type"] == "PT_LOAD":
                        self.segments.append((seg["p_offset"], seg["p_filesz"], seg["p_vaddr"]))
                syms = []
                for sec_name in (".symtab", ".dynsym"):
                    sec = elf.get_section_by_name(sec_name)
                    if sec is None:
                        continue
                    for s in sec.iter_symbols():
                        if s["st_info"]["type"] == "STT_FUNC" and s["st_value"] and s.name:
                            syms.append((s["st_value"], max(int(s["st_size"]), 1), s.name))
                    if sec_name == ".symtab":
                        self.stripped = False
                    if syms:
                        break
                syms.sort()
                self.starts = [s[0] for s in syms]
                self.ends = [s[0] + s[1] for s in syms]
                self.names = [s[2] for s in syms]
                info = elf.get_section_by_name(".debug_info")
                self._has_dwarf = info is not None and info.data_size <= MAX_DWARF_BYTES
                self.ok = True
        except (OSError, ELFError, ValueError):
            self.ok = False

    def vaddr(self, file_offset: int) -> int | None:
        for off, size, va in self.segments:
            if off <= file_offset < off + max(size, 1):
                return file_offset - off + va
        return None

    def function(self, vaddr: int) -> str | None:
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i >= 0 and vaddr < self.ends[i]:
            return self.names[i]
        return None

    def line(self, vaddr: int) -> tuple[str, int] | None:
        """file:line of `vaddr`. Only the compilation unit holding the address is decoded
        (found through .debug_aranges); without aranges, every unit once."""
        if not self._has_dwarf:
            return None
        if self._dwarf is None:
            self._open_dwarf()
        if self._dwarf is False:
            return None
        cu_off = None
        if self._aranges is not None:
            try:
                cu_off = self._aranges.cu_offset_at_addr(vaddr)
            except Exception:
                cu_off = None
        key = cu_off if cu_off is not None else -1
        table = self._cu_lines.get(key)
        if table is None:
            table = self._load_lines(cu_off)
            self._cu_lines[key] = table
        addrs, rows = table
        i = bisect.bisect_right(addrs, vaddr) - 1
        return rows[i] if i >= 0 else None

    def _open_dwarf(self) -> None:
        try:
            self._file = open(self.path, "rb")
            self._dwarf = ELFFile(self._file).get_dwarf_info()
            self._aranges = self._dwarf.get_aranges()
        except Exception:  # corrupt or unsupported DWARF: names only
            self._dwarf = False

    def _load_lines(self, cu_off: int | None) -> tuple[list[int], list[tuple[str, int]]]:
        pairs: list[tuple[int, str, int]] = []
        try:
            dwarf = self._dwarf
            cus = [dwarf.get_CU_at(cu_off)] if cu_off is not None else dwarf.iter_CUs()
            for cu in cus:
                lp = dwarf.line_program_for_CU(cu)
                if lp is None:
                    continue
                files = lp["file_entry"]
                base = 1 if lp.header["version"] < 5 else 0
                for entry in lp.get_entries():
                    st = entry.state
                    if st is None or st.end_sequence:
                        continue
                    idx = st.file - base
                    name = files[idx].name.decode(errors="replace") if 0 <= idx < len(files) else "?"
                    pairs.append((st.address, os.path.basename(name), st.line))
        except Exception:  # corrupt or unsupported DWARF: names only
            return [], []
        pairs.sort()
        return [p[0] for p in pairs], [(p[1], p[2]) for p in pairs]


@lru_cache(maxsize=64)
def _module(path: str) -> _Module:
    return _Module(path)


class Symbolizer:
    def __init__(self, modules: list[dict] | None, lines: bool = True):
        mods = []
        for m in modules or []:
            try:
                mods.append((int(m["start"]), int(m["end"]), int(m["offset"]), str(m["path"])))
            except (KeyError, TypeError, ValueError):
                continue
        mods.sort()
        self._mods = mods
        self._starts = [m[0] for m in mods]
        self._lines = lines
        self._cache: dict[int, Symbol] = {}
        self.warnings: list[str] = []
        self._warned: set[str] = set()

    def _warn(self, path: str, why: str) -> None:
        if path not in self._warned:
            self._warned.add(path)
            self.warnings.append(f"{path}: {why}; addresses shown as module+offset")

    def lookup(self, addr: int) -> Symbol:
        addr = int(addr)
        hit = self._cache.get(addr)
        if hit is not None:
            return hit
        sym = self._resolve(addr)
        self._cache[addr] = sym
        return sym

    def _resolve(self, addr: int) -> Symbol:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0 or addr >= self._mods[i][1]:
            return Symbol(name=f"0x{addr:x}", module="", offset=addr)
        start, _end, off, path = self._mods[i]
        file_off = addr - start + off
        base = os.path.basename(path)
        fallback = Symbol(name=f"{base}+0x{file_off:x}", module=base, offset=file_off)
        mod = _module(path)
        if not mod.ok:
            self._warn(path, "cannot read the ELF file")
            return fallback
        va = mod.vaddr(file_off)
        if va is None:
            return fallback
        if mod.stripped:
            self._warn(path, "no symbols (stripped)")
        name = mod.function(va)
        if name is None:
            return fallback
        fl = mod.line(va) if self._lines else None
        return Symbol(
            name=name, module=base, offset=file_off, file=fl[0] if fl else None, line=fl[1] if fl else None, known=True
        )

    def names(self, addrs) -> dict[int, Symbol]:
        """Resolve many addresses at once (and demangle C++ names in one c++filt call)."""
        out = {int(a): self.lookup(int(a)) for a in addrs}
        mangled = sorted({s.name for s in out.values() if s.known and s.name.startswith("_Z")})
        if mangled:
            plain = demangle(tuple(mangled))
            out = {
                a: (
                    Symbol(plain.get(s.name, s.name), s.module, s.offset, s.file, s.line, True)
                    if s.name in plain
                    else s
                )
                for a, s in out.items()
            }
        return out


@lru_cache(maxsize=16)
def demangle(names: tuple[str, ...]) -> dict[str, str]:
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {}
    try:
        res = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    lines = res.stdout.splitlines()
    return dict(zip(names, lines, strict=False)) if len(lines) == len(names) else {}


def modules_of(meta: dict) -> list[dict]:
    ldb = meta.get("ldb") if isinstance(meta, dict) else None
    mods = ldb.get("modules") if isinstance(ldb, dict) else None
    return mods if isinstance(mods, list) else []


def exists(path: str) -> bool:
    return Path(path).is_file()
