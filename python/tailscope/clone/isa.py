"""Instruction mix, branch behaviour and register dependencies from callgrind block counts.

Every executed instruction address that callgrind reports is disassembled with capstone from
the object file itself (ELF virtual address -> file offset through the PT_LOAD headers) and
put in one class (Ditto §4.4.2):

    mov arith mul div fp simd branch lock rep other

each with a memory flag: `reg` (no memory operand), `load`, `store` or `rmw` (both). Counts
are weighted by the executions callgrind measured.

Branches (Ditto §4.4.3): per conditional branch, the taken rate p = taken/executed comes
exactly from `--collect-jumps=yes`. The transition rate r (how often the outcome differs from
the previous one) needs the outcome sequence, which no stock valgrind tool records; we
approximate it by the branch's simulated misprediction rate m (callgrind `--branch-sim=yes`,
a 2-bit-counter predictor), since a branch whose outcomes come in runs costs that predictor
about one misprediction per transition: r ~= min(m, 2 min(p, 1-p)) (the upper bound is the
most transitions a sequence with taken rate p can have). docs/ditto.md discusses the bias.

Register dependencies (Ditto §4.4.6): read-after-write distances in instructions, measured
within straight-line runs of instructions with equal execution counts (an approximation of
basic blocks), binned exponentially 1, 2, 4, ... 1024.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import numpy as np

from .callgrind import ThreadCosts

CLASSES = ["mov", "arith", "mul", "div", "fp", "simd", "branch", "lock", "rep", "other"]
MEMFLAGS = ["reg", "load", "store", "rmw"]
DEP_BINS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]  # bin i holds distances [b_i, b_{i+1})

_STRING_OPS = ("movs", "stos", "cmps", "scas", "lods", "ins", "outs")
_FP_SCALAR = ("ss", "sd")
_ARITH = {
    "add",
    "sub",
    "and",
    "or",
    "xor",
    "cmp",
    "test",
    "inc",
    "dec",
    "neg",
    "not",
    "shl",
    "shr",
    "sar",
    "sal",
    "rol",
    "ror",
    "rcl",
    "rcr",
    "lea",
    "adc",
    "sbb",
    "bt",
    "bts",
    "btr",
    "btc",
    "bsf",
    "bsr",
    "tzcnt",
    "lzcnt",
    "popcnt",
    "cdq",
    "cqo",
    "cdqe",
    "cwde",
    "cbw",
    "cwd",
    "xadd",
    "bswap",
    "shld",
    "shrd",
    "andn",
    "blsr",
    "blsi",
    "blsmsk",
    "bzhi",
    "sarx",
    "shlx",
    "shrx",
    "rorx",
    "pext",
    "pdep",
    "crc32",
    "cmpxchg",
    "cmpxchg8b",
    "cmpxchg16b",
    "stc",
    "clc",
    "cmc",
    "cld",
    "std",
    "sahf",
    "lahf",
}
_MOV = {
    "mov",
    "movzx",
    "movsx",
    "movsxd",
    "movabs",
    "push",
    "pop",
    "xchg",
    "movbe",
    "leave",
    "pushfq",
    "popfq",
    "movnti",
}


class ElfImage:
    """Bytes of an ELF file addressed by virtual address (PT_LOAD segments)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self.data = Path(path).read_bytes()
        d = self.data
        if d[:4] != b"\x7fELF" or d[4] != 2:
            raise ValueError(f"{path}: not a 64-bit ELF file")
        phoff = struct.unpack_from("<Q", d, 0x20)[0]
        phentsize, phnum = struct.unpack_from("<HH", d, 0x36)
        self.segments = []
        for i in range(phnum):
            p_type, _flags, p_offset, p_vaddr, _pa, p_filesz, _memsz, _al = struct.unpack_from(
                "<IIQQQQQQ", d, phoff + i * phentsize
            )
            if p_type == 1:  # PT_LOAD
                self.segments.append((p_vaddr, p_offset, p_filesz))

    def read(self, vaddr: int, n: int) -> bytes:
        for v, off, size in self.segments:
            if v <= vaddr < v + size:
                start = off + (vaddr - v)
                return self.data[start : start + min(n, v + size - vaddr)]
        return b""


def _image(path: str) -> ElfImage | None:
    """The ELF image of `path`, cached by (path, size, mtime): clones are rebuilt in place."""
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return _image_at(path, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=64)
def _image_at(path: str, _size: int, _mtime: int) -> ElfImage | None:
    try:
        return ElfImage(path)
    except (OSError, ValueError, struct.error):
        return None


@lru_cache(maxsize=1)
def _cs():
    import capstone

    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    return md


def _reg_family(name: str) -> str | None:
    """rax/eax/ax/al -> a, r8d -> r8, xmm3/ymm3 -> v3; None for rip/rsp/flags."""
    n = name.lower()
    if n in ("rip", "eip", "rsp", "esp", "sp", "spl", "rflags", "eflags", "flags", "fpsw", "mxcsr"):
        return None
    if n.startswith(("xmm", "ymm", "zmm")):
        return "v" + n[3:]
    if n.startswith("r") and n[1:2].isdigit():
        return n.rstrip("dwb")
    base = {
        "rax": "a",
        "eax": "a",
        "ax": "a",
        "al": "a",
        "ah": "a",
        "rbx": "b",
        "ebx": "b",
        "bx": "b",
        "bl": "b",
        "bh": "b",
        "rcx": "c",
        "ecx": "c",
        "cx": "c",
        "cl": "c",
        "ch": "c",
        "rdx": "d",
        "edx": "d",
        "dx": "d",
        "dl": "d",
        "dh": "d",
        "rsi": "si",
        "esi": "si",
        "si": "si",
        "sil": "si",
        "rdi": "di",
        "edi": "di",
        "di": "di",
        "dil": "di",
        "rbp": "bp",
        "ebp": "bp",
        "bp": "bp",
        "bpl": "bp",
    }
    return base.get(n)


def classify(insn) -> tuple[str, str]:
    """(class, memflag) of one capstone instruction (detail mode)."""
    import capstone.x86 as x86

    m = insn.mnemonic
    prefixes = set(insn.prefix)
    base = m.split()[-1] if " " in m else m
    mem_r = mem_w = False
    has_vec = False
    for op in insn.operands:
        if op.type == x86.X86_OP_MEM:
            if base in ("lea", "nop") or base.startswith("prefetch"):
                continue
            acc = op.access
            mem_r |= bool(acc & 1)  # CS_AC_READ
            mem_w |= bool(acc & 2)  # CS_AC_WRITE
            if not acc:
                mem_r = True
        elif op.type == x86.X86_OP_REG:
            rn = insn.reg_name(op.reg) or ""
            if rn.startswith(("xmm", "ymm", "zmm")):
                has_vec = True
    if base in ("push", "call", "pushfq"):
        mem_w = True
    elif base in ("pop", "ret", "leave", "popfq"):
        mem_r = True
    if base.startswith(_STRING_OPS):
        mem_r = mem_r or base.startswith(("movs", "cmps", "scas", "lods"))
        mem_w = mem_w or base.startswith(("movs", "stos"))
    memflag = "rmw" if (mem_r and mem_w) else "load" if mem_r else "store" if mem_w else "reg"
    if 0xF0 in prefixes or (base == "xchg" and memflag != "reg"):
        return "lock", memflag
    # (not movss/movsd xmm: SSE moves whose mandatory F3/F2 a capstone may list as a prefix)
    if (0xF3 in prefixes or 0xF2 in prefixes) and base.startswith(_STRING_OPS) and not has_vec:
        return "rep", memflag
    if base.startswith("j") or base in ("call", "ret", "loop", "loope", "loopne", "jrcxz", "jecxz"):
        return "branch", memflag
    if base in ("div", "idiv"):
        return "div", memflag
    if base in ("mul", "imul", "mulx"):
        return "mul", memflag
    if base.startswith("f") and base not in ("fence",):
        return "fp", memflag
    if has_vec or (
        base.startswith(("v", "p"))
        and base not in ("pop", "push", "pause", "popcnt", "pext", "pdep", "pushfq", "popfq", "prefetcht0")
    ):
        if (
            (base.endswith(_FP_SCALAR) and not base.startswith(("p", "vp", "movs", "cmps")))
            or base in ("movss", "movsd", "vmovss", "vmovsd")
            or base.startswith(("cvt", "vcvt", "ucomis", "comis", "vucomis", "vcomis"))
        ):
            return "fp", memflag
        return "simd", memflag
    if base in _MOV or base.startswith("cmov"):
        return "mov", memflag
    if base in _ARITH or base.startswith("set"):
        return "arith", memflag
    return "other", memflag


@lru_cache(maxsize=1 << 20)
def _decode_at(obj: str, _size: int, _mtime: int, addr: int):
    return _decode_uncached(obj, addr)


def _decode(obj: str, addr: int):
    try:
        st = Path(obj).stat()
    except OSError:
        return None
    return _decode_at(obj, st.st_size, st.st_mtime_ns, addr)


def _decode_uncached(obj: str, addr: int):
    img = _image(obj)
    if img is None:
        return None
    code = img.read(addr, 16)
    if not code:
        return None
    for insn in _cs().disasm(code, addr, 1):
        return insn
    return None


_REP_WIDTH = {"b": 1, "w": 2, "d": 4, "q": 8}


def analyse(costs: list[ThreadCosts]) -> dict:
    """Instruction mix, branch table and dependency histogram of the merged dumps.

    Returns plain JSON-able data (see the keys below); instructions in objects that cannot
    be read (vdso, deleted files) are counted in `undecoded` and left out of the mix.
    """
    ev = costs[0].events if costs else ["Ir"]
    i_ir = ev.index("Ir")
    i_bc = ev.index("Bc") if "Bc" in ev else None
    i_bcm = ev.index("Bcm") if "Bcm" in ev else None
    i_d1 = [ev.index(e) for e in ("D1mr", "D1mw") if e in ev]
    # Ir, Bc, Bcm, D1 misses (the last used for the rep instructions)
    per_instr: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    taken: dict[tuple[str, int], int] = defaultdict(int)
    for tc in costs:
        for key, c in tc.instr.items():
            slot = per_instr[key]
            slot[0] += c[i_ir] if len(c) > i_ir else 0
            if i_bc is not None and len(c) > i_bcm:
                slot[1] += c[i_bc]
                slot[2] += c[i_bcm]
            slot[3] += sum(c[i] for i in i_d1 if len(c) > i)
        for key, (t, _e) in tc.jcnd.items():
            taken[key] += t
    mix = {f"{c}/{m}": 0 for c in CLASSES for m in MEMFLAGS}
    undecoded = 0
    total = 0
    size_sum = 0
    branches = []  # [p, r_est, executed, mispredict_rate]
    rep_iters = rep_execs = rep_bytes = rep_bc = rep_bcm = rep_d1 = 0
    decoded: dict[str, list[tuple[int, int, object]]] = defaultdict(list)
    for (obj, addr), (ir, bc, bcm, d1m) in per_instr.items():
        if ir <= 0:
            continue
        total += ir
        insn = _decode(obj, addr)
        if insn is None:
            undecoded += ir
            continue
        cls, mem = classify(insn)
        mix[f"{cls}/{mem}"] += ir
        size_sum += insn.size * ir
        decoded[obj].append((addr, ir, insn))
        if cls == "rep":
            # a rep instruction counts one Ir and one Bc per iteration, plus one per execution
            # (callgrind, measured: n iterations are n + 1 of each, n bytes written by stosb). Its
            # executions are its exits, the conditional jump's not-taken count (--collect-jumps),
            # else those of the next instruction (glibc's memset/memmove return right after it;
            # not exact when that instruction is a jump target too)
            # Kept out of the branch table: redis's one 'rep stosb' (a ~10 KB memset every ~7
            # requests) was 63% of the table's weight as an always-taken branch, and its
            # iterations 0.18 of the 0.28 conditional branches per instruction
            nxt = per_instr.get((obj, addr + insn.size))
            t = taken.get((obj, addr))
            if t is not None and 0 < bc - t <= ir:
                execs = bc - t
            else:
                execs = nxt[0] if nxt and 0 < nxt[0] <= ir else max(1, ir // 33)
            rep_iters += ir
            rep_execs += execs
            rep_bytes += (ir - execs) * _REP_WIDTH.get(insn.mnemonic[-1:], 1)
            rep_bc += bc
            rep_bcm += bcm
            rep_d1 += d1m
            continue
        if bc > 0:
            t = min(taken.get((obj, addr), 0), bc)
            p = t / bc
            mrate = bcm / bc
            r = min(mrate, 2 * min(p, 1 - p))
            branches.append([round(p, 6), round(r, 6), int(bc), round(mrate, 6)])
    deps = _dependencies(decoded)
    known = total - undecoded
    lines = {(obj, a >> 6) for (obj, a) in per_instr}
    return {
        "instructions": int(total),
        "undecoded": int(undecoded),
        "mix": {k: int(v) for k, v in mix.items()},
        "mix_fraction": {k: (v / known if known else 0.0) for k, v in mix.items()},
        "avg_insn_bytes": (size_sum / known) if known else 4.0,
        "branches": branches,
        "cond_branches": int(sum(b[2] for b in branches)),
        "cond_mispredicts": int(sum(round(b[2] * b[3]) for b in branches)),
        "static_cond_branches": len(branches),
        # rep string instructions (left out of the branches above): Ir, executions, bytes moved,
        # and their conditional branches and mispredictions as callgrind counts them
        "rep": {
            "instructions": int(rep_iters),
            "executions": int(rep_execs),
            "bytes": int(rep_bytes),
            "cond_branches": int(rep_bc),
            "mispredicts": int(rep_bcm),
            "d1_misses": int(rep_d1),  # at the window's D1 (the profile's: A)
        },
        "raw_dep_hist": deps,
        "code_footprint_bytes": 64 * len(lines),
    }


def _dependencies(decoded: dict[str, list[tuple[int, int, object]]]) -> list[int]:
    """RAW distance histogram over DEP_BINS, weighted by executions."""
    hist = np.zeros(len(DEP_BINS), dtype=np.int64)
    for rows in decoded.values():
        rows.sort(key=lambda r: r[0])
        run_last_write: dict[str, int] = {}
        prev_end = None
        prev_ir = None
        idx = 0
        for addr, ir, insn in rows:
            if addr != prev_end or ir != prev_ir:
                run_last_write = {}
                idx = 0
            try:
                regs_read, regs_write = insn.regs_access()
            except Exception:  # capstone raises on a few exotic encodings
                regs_read, regs_write = [], []
            for r in regs_read:
                fam = _reg_family(insn.reg_name(r) or "")
                if fam is None or fam not in run_last_write:
                    continue
                d = idx - run_last_write[fam]
                b = min(int(np.log2(d)), len(DEP_BINS) - 1) if d >= 1 else 0
                hist[b] += ir
            for r in regs_write:
                fam = _reg_family(insn.reg_name(r) or "")
                if fam is not None:
                    run_last_write[fam] = idx
            idx += 1
            prev_end = addr + insn.size
            prev_ir = ir
    return [int(x) for x in hist]
