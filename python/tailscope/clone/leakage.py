"""The leakage check: nothing of the original's strings, symbols or data is in the clone.

Scanned: every file of the clone directory except private/ (sources, headers, body.S,
scripts, clone.json) and the built binary. Looked for:

  strings  printable runs of >= MIN_STRING characters from the original binary;
  symbols  the original's defined symbol names (.symtab and .dynsym, >= 4 characters) as
           whole words;
  data     16-byte windows of the original's .rodata/.data/.data.rel.ro (low-entropy windows,
           with fewer than 6 distinct bytes, skipped) found at any offset of the clone binary;
  code     64-byte windows of the original's .text (alignment padding skipped).

A hit is allowed only if tailscope's own template produces it without seeing the target:
it also occurs in the template sources or in a reference binary built from the template with
a neutral profile (e.g. libc symbol names both import, protocol tokens of the load such as
"NOT_FOUND" that the skeleton's reply builder writes). Allowed hits are listed, not hidden.
"""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

MIN_STRING = 8
WINDOW = 16
CODE_WINDOW = 64
_PRINTABLE = re.compile(rb"[\x20-\x7e\t]{%d,}" % MIN_STRING)


def strings_of(data: bytes, min_len: int = MIN_STRING) -> set[str]:
    pat = _PRINTABLE if min_len == MIN_STRING else re.compile(rb"[\x20-\x7e\t]{%d,}" % min_len)
    return {m.group().decode("ascii").strip() for m in pat.finditer(data) if len(m.group().strip()) >= min_len}


def symbols_of(path: Path) -> set[str]:
    out: set[str] = set()
    for args in (["nm", "--defined-only", str(path)], ["nm", "-D", "--defined-only", str(path)]):
        try:
            p = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        for line in p.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3:
                name = parts[2].split("@")[0]
                if len(name) >= 4:
                    out.add(name)
    return out


def imported_symbols(path: Path) -> set[str]:
    try:
        p = subprocess.run(
            ["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {ln.split()[-1].split("@")[0] for ln in p.stdout.splitlines() if ln.strip()}


def _elf_sections(d: bytes) -> list[tuple[str, int, bytes]]:
    """(name, flags, bytes) of every section with contents of a 64-bit ELF image."""
    shoff = struct.unpack_from("<Q", d, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
    if not hdrs:
        return []
    strtab_off = hdrs[shstrndx][4]
    out = []
    for h in hdrs:
        nm_off = strtab_off + h[0]
        name = d[nm_off : d.index(b"\0", nm_off)].decode("ascii", "replace")
        if h[1] != 8:  # not NOBITS
            out.append((name, h[2], d[h[4] : h[4] + h[5]]))
    return out


def text_bytes(path: Path) -> bytes:
    """What to search for strings: an ELF file's non-executable sections (machine code is not
    text, and prologues such as push r14..rbx read as 'AVAUATUSH'), any other file whole."""
    d = path.read_bytes()
    if d[:4] != b"\x7fELF" or d[4] != 2:
        return d
    return b"\n".join(sec for _n, flags, sec in _elf_sections(d) if not flags & 0x4)


def _is_padding(w: bytes) -> bool:
    """A window of alignment padding (multi-byte NOPs), which every compiler emits alike."""
    import capstone

    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    insns = list(md.disasm(w, 0))
    return bool(insns) and all(i.mnemonic in ("nop", "xchg", "int3") or i.mnemonic.startswith("data16") for i in insns)


def sections(path: Path, names=(".rodata", ".data", ".text")) -> list[bytes]:
    """Raw bytes of the named ELF sections (64-bit little-endian ELF)."""
    d = path.read_bytes()
    if d[:4] != b"\x7fELF" or d[4] != 2:
        return [d]
    shoff = struct.unpack_from("<Q", d, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
    if not hdrs:
        return [d]
    strtab_off = hdrs[shstrndx][4]
    out = []
    for h in hdrs:
        nm_off = strtab_off + h[0]
        name = d[nm_off : d.index(b"\0", nm_off)].decode("ascii", "replace")
        if name in names and h[1] != 8:  # not NOBITS
            out.append(d[h[4] : h[4] + h[5]])
    return out


def windows_of(blobs: list[bytes], step: int = 4, size: int = WINDOW) -> set[bytes]:
    out = set()
    for b in blobs:
        for i in range(0, max(0, len(b) - size + 1), step):
            w = b[i : i + size]
            if len(set(w)) >= 6:
                out.add(w)
    return out


def _scan_windows(blob: bytes, wins: set[bytes], size: int = WINDOW) -> list[bytes]:
    hits = []
    for i in range(0, max(0, len(blob) - size + 1)):
        w = blob[i : i + size]
        if w in wins:
            hits.append(w)
    return hits


def check(
    original: Path, clone_dir: Path, reference: Path | None = None, extra_public: list[Path] | None = None
) -> dict:
    """Run the check; `reference` is a binary built from the template with a neutral profile."""
    orig_strings = strings_of(text_bytes(original))
    orig_syms = symbols_of(original)
    # data: 16-byte windows of the original's initialised data; code: 64-byte windows of its
    # machine code (shorter code windows match compiler/crt boilerplate every binary shares)
    orig_windows = windows_of(sections(original, (".rodata", ".data", ".data.rel.ro")))
    orig_code = windows_of(sections(original, (".text",)), step=16, size=CODE_WINDOW)
    files = [
        p
        for p in sorted(clone_dir.rglob("*"))
        if p.is_file() and "private" not in p.relative_to(clone_dir).parts and p.name != "clone-replay.dat"
    ]
    public_text = ""
    public_bin = b""
    from .generate import TEMPLATES

    for t in sorted(TEMPLATES.glob("*")):
        public_text += t.read_text(errors="replace")
    if reference and reference.exists():
        public_bin = reference.read_bytes()
    for p in extra_public or []:
        public_bin += p.read_bytes()
    public_strings = strings_of(public_text.encode()) | (
        strings_of(text_bytes(reference)) if reference and reference.exists() else set()
    )
    public_syms = symbols_of(reference) if reference and reference.exists() else set()
    # names the clone imports from shared libraries (libc's API) are public by definition
    for f in files:
        if f.read_bytes()[:4] == b"\x7fELF":
            public_syms |= imported_symbols(f)
    public_strings |= public_syms
    public_windows = set(_scan_windows(public_bin, orig_windows)) if public_bin else set()
    found_strings, allowed_strings = set(), set()
    found_syms, allowed_syms = set(), set()
    data_hits, allowed_data, code_hits = 0, 0, 0
    for f in files:
        blob = f.read_bytes()
        cs = strings_of(text_bytes(f))
        for s in orig_strings & cs:
            (allowed_strings if s in public_strings else found_strings).add(s)
        # substrings: an original string embedded in a longer clone string
        text = text_bytes(f).decode("latin-1")
        for s in orig_strings:
            if len(s) >= 12 and s in text and s not in cs:
                (allowed_strings if s in public_strings or s in public_text else found_strings).add(s)
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_.]{3,}", text))
        for s in orig_syms & words:
            (allowed_syms if (s in public_syms or s in public_text or s in public_strings) else found_syms).add(s)
        if blob[:4] == b"\x7fELF":
            for w in _scan_windows(blob, orig_windows):
                if w in public_windows or _is_padding(w):
                    allowed_data += 1
                else:
                    data_hits += 1
            for w in _scan_windows(blob, orig_code, CODE_WINDOW):
                if not _is_padding(w):
                    code_hits += 1
    return {
        "original": str(original),
        "files": [str(f.relative_to(clone_dir)) for f in files],
        "original_strings": len(orig_strings),
        "original_symbols": len(orig_syms),
        "original_windows": len(orig_windows),
        "leaked_strings": sorted(found_strings),
        "leaked_symbols": sorted(found_syms),
        "leaked_data_windows": data_hits,
        "allowed_strings": sorted(allowed_strings),
        "allowed_symbols": sorted(allowed_syms),
        "allowed_data_windows": allowed_data,
        "leaked_code_windows": code_hits,
        "original_code_windows": len(orig_code),
        "ok": not found_strings and not found_syms and data_hits == 0 and code_hits == 0,
    }
