"""Parser for callgrind output files (`--dump-instr=yes --collect-jumps=yes`).

The format (valgrind docs, "Callgrind Format Specification") is line based: `ob=`, `fn=`...
name the current object and function (with `(id) name` compression), cost lines give a
position (`instr line`, each absolute, `+n`/`-n` relative to the previous one, or `*`) and
then the event counts. A cost line right after `calls=` is the *inclusive* cost of a call
and is not the instruction's own cost. `jcnd=taken/executed target` is followed by a line
giving the conditional jump's own position.

What we keep: per (object, address) self costs, and per conditional branch (taken,
executed). Addresses are object-relative (callgrind subtracts each object's load offset),
so they index the ELF file's virtual addresses directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CloneError

_NAME = re.compile(r"^\((\d+)\)(?: (.*))?$")


@dataclass
class ThreadCosts:
    """The costs of one callgrind dump (one thread, or the whole process)."""

    path: str
    events: list[str]
    thread: int = 0
    summary: dict[str, int] = field(default_factory=dict)
    # (object path, address) -> list of event counts, same order as `events`
    instr: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    # (object path, address) -> [taken, executed]
    jcnd: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    cache: dict[str, str] = field(default_factory=dict)
    # function name -> self event counts (same order as `events`), always collected
    fn_self: dict[str, list[int]] = field(default_factory=dict)

    def fn_total(self, event: str, prefix: str) -> int:
        """Self cost of `event` summed over the functions whose name starts with `prefix`."""
        if event not in self.events:
            return 0
        i = self.events.index(event)
        return sum(c[i] for f, c in self.fn_self.items() if f.startswith(prefix) and len(c) > i)

    def total(self, event: str) -> int:
        if event in self.summary:
            return self.summary[event]
        i = self.events.index(event)
        return sum(c[i] for c in self.instr.values() if len(c) > i)


def _parse_pos(tok: str, last: int) -> int:
    if tok == "*":
        return last
    if tok[0] in "+-":
        return last + int(tok, 0)
    return int(tok, 0)


def parse(path: str | Path, with_instr: bool = True) -> ThreadCosts:
    """Parse one callgrind output file; a malformed file is a one-line CloneError."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise CloneError(f"cannot read profile file {path}: {exc.strerror or exc}") from None
    lines = text.splitlines()
    if not lines or (
        not lines[0].startswith("# callgrind format") and not any(ln.startswith("events:") for ln in lines[:40])
    ):
        raise CloneError(f"{path} is not a callgrind output file (corrupt profile?)")
    tc = ThreadCosts(path=str(path), events=[])
    names: dict[str, dict[str, str]] = {"ob": {}, "fn": {}, "fl": {}}
    obj = "???"
    fn = "???"
    positions = 1
    last = [0, 0]
    skip_next = False  # the line after calls= (inclusive cost)
    jump_pending: tuple[int, int] | None = None
    nev = 0
    ran = True  # (a thread whose summary: line counts no instruction did not run in the part)
    try:
        for raw in lines:
            if not raw or raw[0] == "#":
                continue
            c0 = raw[0]
            if c0.isdigit() or c0 in "+-*":
                parts = raw.split()
                pos = []
                for i in range(positions):
                    last[i] = _parse_pos(parts[i], last[i])
                    pos.append(last[i])
                if jump_pending is not None:
                    key = (obj, pos[0])
                    cur = tc.jcnd.get(key)
                    if cur is None:
                        tc.jcnd[key] = [jump_pending[0], jump_pending[1]]
                    else:
                        cur[0] += jump_pending[0]
                        cur[1] += jump_pending[1]
                    jump_pending = None
                    if len(parts) == positions:
                        continue
                if skip_next:
                    skip_next = False
                    continue
                costs = [int(x) for x in parts[positions:]]
                if not costs:
                    continue
                fc = tc.fn_self.get(fn)
                if fc is None:
                    tc.fn_self[fn] = costs + [0] * (nev - len(costs))
                else:
                    for i, v in enumerate(costs):
                        fc[i] += v
                if not with_instr:
                    continue
                key = (obj, pos[0])
                cur = tc.instr.get(key)
                if cur is None:
                    tc.instr[key] = costs + [0] * (nev - len(costs))
                else:
                    for i, v in enumerate(costs):
                        cur[i] += v
                continue
            key, _, val = raw.partition("=")
            if key in ("ob", "fn", "fl", "fi", "fe", "cob", "cfn", "cfi", "cfl"):
                m = _NAME.match(val)
                table = names["ob" if key in ("ob", "cob") else "fn" if key in ("fn", "cfn") else "fl"]
                if m:
                    ident, name = m.group(1), m.group(2)
                    if name is not None:
                        table[ident] = name
                    name = table.get(ident, f"({ident})")
                else:
                    name = val
                if key == "ob":
                    obj = name
                elif key == "fn":
                    fn = name
                continue
            if key == "calls":
                skip_next = True
                continue
            if key in ("jump", "jcnd"):
                if key == "jcnd":
                    cnt = val.split()[0]
                    taken, _, executed = cnt.partition("/")
                    jump_pending = (int(taken), int(executed or taken))
                else:
                    jump_pending = None
                    skip_next = True  # next line: source position, no own cost
                continue
            if raw.startswith("events:"):
                tc.events = raw.split(":", 1)[1].split()
                nev = len(tc.events)
            elif raw.startswith("positions:"):
                positions = len(raw.split(":", 1)[1].split())
                last = [0] * positions
            elif raw.startswith("summary:") or raw.startswith("totals:"):
                vals = [int(x) for x in raw.split(":", 1)[1].split()]
                if raw.startswith("summary:"):
                    ran = dict(zip(tc.events, vals, strict=False)).get("Ir", 1) != 0 or "Ir" not in tc.events
                tc.summary = dict(zip(tc.events, vals, strict=False))
            elif raw.startswith("thread:"):
                tc.thread = int(raw.split(":", 1)[1])
            elif raw.startswith("desc: ") and " cache:" in raw:
                k, _, v = raw[6:].partition(":")
                tc.cache[k.strip()] = v.strip()
    except (ValueError, IndexError) as exc:
        raise CloneError(f"{path}: corrupt callgrind profile ({type(exc).__name__}: {exc})") from None
    if not tc.events:
        raise CloneError(f"{path}: corrupt callgrind profile (no events: line)")
    if not ran:
        _stale(tc)
    return tc


def _stale(tc: ThreadCosts) -> None:
    """A thread that ran no instruction in the part (`summary:` counts none): its cost lines are
    stale, and it costs nothing.

    Session 47: callgrind's cost lines (and `totals:`, their sum) keep the last block a thread ran
    before it blocked in a system call, through a `callgrind_control -z`, until a dump: a thread
    idle since start-up counts its few start-up instructions again in every window. The clone's
    idle thread (`pause()` in bg_main) counted 5 instructions with a data write miss at every LL
    (its first push on a stack line nothing touched since), 1 data-side LL miss a window where
    memcached's whole data side at B is 0.1; the original's idle threads counted 1 code-side one.
    `summary:` leaves those out, but it also leaves out the jumps through the PLT of every
    thread (memcached's workers: ~37,700 of 4.34 M instructions a window, and 10 code-side LL
    misses of the main thread's 21,700), so the threads that ran keep `totals:` and their cost
    lines, and only a thread with no instruction in `summary:` is zeroed."""
    tc.summary = dict.fromkeys(tc.events, 0)
    tc.instr.clear()
    tc.jcnd.clear()
    tc.fn_self.clear()


def dumps(prefix: str | Path) -> list[Path]:
    """The dump files written for `--callgrind-out-file=PREFIX` after a `callgrind_control -d`.

    With --separate-threads=yes, files are PREFIX.1-01, PREFIX.1-02, ... (part 1, thread n).
    The part-0 files (the final dump at exit) are ignored: the window is the dump we asked for.
    """
    prefix = Path(prefix)
    files = sorted(prefix.parent.glob(prefix.name + ".1*"))
    return [f for f in files if re.search(r"\.1(-\d+)?$", f.name)]
