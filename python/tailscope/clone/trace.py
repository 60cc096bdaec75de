"""Syscall and scheduler profile of a live process from eBPF tracepoints (bpftrace front end).

One bpftrace program on `raw_syscalls:sys_enter/sys_exit` and `sched:sched_switch`,
`sched_process_fork/exit`, filtered to the target's pid, aggregates in kernel maps (no
per-event output, so a busy server does not overflow a ring):

  calls[tid, nr, fdclass]        syscalls per thread, by the class of their fd argument:
                                 0 none/other, 1 listening socket, 2 connection, 3 eventfd/pipe
  ret[nr, fdclass, size]         return values (bytes moved) for data syscalls, exact
  arg[nr, fdclass, k, value]     scalar arguments: buffer lengths, flags, timeouts, options
  eagain[tid, nr]                calls that failed with EAGAIN
  pair[reqbytes, replybytes]     for each reply written on a connection, the bytes of the last
                                 read on it (request -> reply sizes)
  sw[tid, voluntary]             context switches; wake[tid] wakeups
  fork / exit                    threads created and exited in the window
  gsleep[tid], gsw[tid], gns     while a connection is open (whatever `gate_conns` says): sleeps
                                 (nanosleep, clock_nanosleep), voluntary switches, and the
                                 time in ns (5 ms ticks): the period of timer threads under load
  slp[tid, n, us]                while a connection is open: each relative sleep a thread asks
                                 for (nanosleep, clock_nanosleep without TIMER_ABSTIME), its
                                 requested length in us (quantised, `sleep_bucket`), keyed by the
                                 replies the process wrote on connections since that thread's
                                 previous sleep, capped at SERVED_CAP: how a timer thread that
                                 adapts to the work done (memcached's LRU maintainer) sleeps
  tturn[tid, us]                 timer turns, in any window: from an epoll wait with a timeout
                                 that returned no event to the thread's next epoll wait, its
                                 length in us (quantised, `sleep_bucket`): the work an event
                                 loop does on its own timer (redis's serverCron, session 32)
  rgap[tid, us]                  reply gaps: from a thread's first connection read (bytes > 0)
                                 since its last connection write to its next connection write
                                 (that write's return), in us (`sleep_bucket`): how long a request
                                 waits in the server for its reply; a loop that runs its timer
                                 work before it writes the turn's replies (redis writes them in
                                 beforeSleep, after the time events) delays one reply by the
                                 whole timer turn (session 35)

Connection fds are learnt from accept/accept4 return values inside the window (the load
generator connects after the trace starts), the listening fds are passed in.

The window starts at the first tick of a 5 ms interval probe, the last probe attached (the
caller's wall clock also holds the attach time, 0.5-0.9 s on this machine: it deflated
time-driven rates per second by 15-45%). It ends at the SIGINT that stops bpftrace, on the same
clock (CLOCK_MONOTONIC), or the interval's last tick if that came first: the syscall probes
detach first and the interval ticks on while the others detach, ~0.55 s here with this
program's nine probes (session 32: a loop waking 39 times a second read as 31 in a 2-s window,
and redis's idle window gave its serverCron's 10 reads of /proc a second as 7.5). With
`gate_conns`, syscalls count only while a connection accepted inside the window is open: the
window is then exactly the load generator's, from its first connect to its last close, so
time-driven calls (timer threads, cron ticks) per request compare between two servers whose
traces attach and detach at different speeds.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from .errors import CloneError

# x86_64 syscall numbers we name; others are reported by number.
SYSCALLS = {
    0: "read",
    1: "write",
    3: "close",
    7: "poll",
    9: "mmap",
    10: "mprotect",
    11: "munmap",
    12: "brk",
    13: "rt_sigaction",
    14: "rt_sigprocmask",
    16: "ioctl",
    17: "pread64",
    18: "pwrite64",
    19: "readv",
    20: "writev",
    23: "select",
    24: "sched_yield",
    28: "madvise",
    32: "dup",
    35: "nanosleep",
    39: "getpid",
    41: "socket",
    42: "connect",
    43: "accept",
    44: "sendto",
    45: "recvfrom",
    46: "sendmsg",
    47: "recvmsg",
    48: "shutdown",
    49: "bind",
    50: "listen",
    51: "getsockname",
    52: "getpeername",
    54: "setsockopt",
    55: "getsockopt",
    56: "clone",
    60: "exit",
    72: "fcntl",
    74: "fsync",
    75: "fdatasync",
    96: "gettimeofday",
    98: "getrusage",
    102: "getuid",
    186: "gettid",
    201: "time",
    202: "futex",
    228: "clock_gettime",
    230: "clock_nanosleep",
    231: "exit_group",
    232: "epoll_wait",
    233: "epoll_ctl",
    257: "openat",
    262: "newfstatat",
    270: "pselect6",
    271: "ppoll",
    281: "epoll_pwait",
    284: "eventfd",
    288: "accept4",
    290: "eventfd2",
    291: "epoll_create1",
    293: "pipe2",
    302: "prlimit64",
    318: "getrandom",
    332: "statx",
    435: "clone3",
    441: "epoll_pwait2",
    5: "fstat",
    8: "lseek",
    4: "stat",
    6: "lstat",
    2: "open",
    21: "access",
    89: "readlink",
    61: "wait4",
    62: "kill",
    200: "tkill",
    234: "tgkill",
    273: "set_robust_list",
    334: "rseq",
}
NR = {v: k for k, v in SYSCALLS.items()}
READS = {0, 17, 19, 45, 47}
WRITES = {1, 18, 20, 44, 46}
DATA = READS | WRITES
# epoll_wait, epoll_pwait, epoll_pwait2: their arg 3 is the timeout (ms; a timespec pointer for
# epoll_pwait2): a call with one that returns no event woke for the loop's own timer
EPOLL_WAITS = {232, 281, 441}
# syscalls whose arg0 is an fd (for the fd class); epoll_ctl's watched fd is arg2
FD_ARG0 = DATA | {3, 5, 8, 16, 43, 48, 51, 52, 54, 55, 72, 74, 75, 288}
# (nr -> argument indexes worth a distribution: scalars only)
SCALAR_ARGS = {
    0: (2,),
    1: (2,),
    44: (2, 3),
    45: (2, 3),
    46: (2,),
    47: (2,),
    232: (2, 3),
    281: (2, 3),
    288: (3,),
    54: (1, 2),
    55: (1, 2),
    72: (1, 2),
    202: (1,),
    233: (1,),
    257: (2,),
    9: (1, 2),
    11: (1,),
    28: (1, 2),
    230: (0, 1),
    17: (2,),
    18: (2,),
    20: (2,),
    19: (2,),
    290: (1,),
    293: (1,),
}

# the replies-since-last-sleep key of @slp is capped here (the clone's table has SERVED_CAP + 1 rows)
SERVED_CAP = 12

CLASS_NAMES = {0: "other", 1: "listen", 2: "conn", 3: "notify"}
# printed by the interval probe's first tick: every probe before it in the script is attached
READY = "tailscope-trace-ready"


def bpftrace_script(pid: int, listen_fds: list[int], notify_fds: list[int], gate_conns: bool = False) -> str:
    """The bpftrace program for `pid` (see the module docstring for the maps and the gate)."""
    # every map gets a key up front: bpftrace rejects reads of a map that is never assigned
    init = "  @lfd[-1] = 0; @nfd[-1] = 0; @cfd[-1] = 0; @last[-1] = 0; @open = 0; @t0 = 0; @t1 = 0; @gns = 0;\n"
    init += "  @tw[-1] = 0; @rd[-1] = 0;\n"
    init += "  @served = 0;\n"
    init += "".join(f"  @lfd[{fd}] = 1;\n" for fd in listen_fds)
    init += "".join(f"  @nfd[{fd}] = 1;\n" for fd in notify_fds)
    arg_rules = []
    for nr, idxs in SCALAR_ARGS.items():
        body = " ".join(f"@arg[{nr}, $c, {k}, (int64)@a{k}[tid]] = count();" for k in idxs)
        arg_rules.append(f"  if ($nr == {nr}) {{ {body} }}")
    fd0 = " || ".join(f"$nr == {n}" for n in sorted(FD_ARG0))
    gate = 1 if gate_conns else 0
    reads = " || ".join(f"$nr == {n}" for n in sorted(READS))
    waits = " || ".join(f"$nr == {n}" for n in sorted(EPOLL_WAITS))
    writes = " || ".join(f"$nr == {n}" for n in sorted(WRITES))
    return f"""
BEGIN {{
{init}  @go = 1;
}}
tracepoint:raw_syscalls:sys_enter /pid == {pid}/ {{
  if ({waits.replace("$nr", "args->id")}) {{
    if (@tw[tid] != 0) {{
      $us = (int64)((nsecs - @tw[tid]) / 1000);
{_bucket("$us", "      ")}      @tturn[tid, $q] = count();
    }}
    @tw[tid] = 0;
  }}
  @nr[tid] = args->id;
  @a0[tid] = args->args[0]; @a1[tid] = args->args[1]; @a2[tid] = args->args[2]; @a3[tid] = args->args[3];
}}
tracepoint:raw_syscalls:sys_exit /pid == {pid} && @nr[tid] == args->id/ {{
  $nr = args->id; $r = args->ret;
  $fd = (int64)-1;
  if ({fd0}) {{ $fd = (int64)@a0[tid]; }}
  if ($nr == 233) {{ $fd = (int64)@a2[tid]; }}
  $c = 0;
  if ($fd >= 0) {{
    if (@lfd[$fd] == 1) {{ $c = 1; }}
    if (@cfd[$fd] == 1) {{ $c = 2; }}
    if (@nfd[$fd] == 1) {{ $c = 3; }}
  }}
  if (($nr == 43 || $nr == 288) && $r >= 0) {{ @open = @open + 1; }}
  if ({gate} == 0 || @open > 0) {{
  @calls[tid, $nr, $c] = count();
  if ($r == -11) {{ @eagain[tid, $nr, $c] = count(); }}
  if (($nr == 43 || $nr == 288) && $r >= 0) {{ @cfd[$r] = 1; @accepts = count(); }}
  if (($c == 2 || $c == 3) && ({reads} || {writes})) {{ @ret[$nr, $c, $r > 0 ? $r : ($r == 0 ? 0 : -1)] = count(); }}
  if ($c == 2 && ({reads}) && $r > 0) {{ @last[$fd] = $r; }}
  if ($c == 2 && ({writes}) && $r > 0) {{ @pair[@last[$fd], $r] = count(); @bytes_out = sum($r); }}
  if ($c == 2 && ({writes}) && $r > 0) {{ @served = @served + 1; }}
  if ($c == 2 && ({reads}) && $r > 0) {{ @bytes_in = sum($r); }}
  if ($c == 2 && ({reads}) && $r > 0 && @rd[tid] == 0) {{ @rd[tid] = nsecs; }}
  if ($c == 2 && ({writes}) && $r > 0 && @rd[tid] != 0) {{
    $us = (int64)((nsecs - @rd[tid]) / 1000);
{_bucket("$us", "    ")}    @rgap[tid, $q] = count();
    @rd[tid] = 0;
  }}
{chr(10).join(arg_rules)}
  if ($nr == 54) {{ @sso[$c, (int64)@a1[tid], (int64)@a2[tid]] = count(); }}
  }}
  if (@open > 0 && ($nr == 35 || $nr == 230)) {{ @gsleep[tid] = count(); }}
  if (({waits}) && $r == 0 && (int64)@a3[tid] != 0) {{ @tw[tid] = nsecs; }}
  if ($nr == 3 && $c == 2) {{ delete(@cfd[$fd]); @open = @open - 1; }}
  delete(@nr[tid]);
}}
tracepoint:syscalls:sys_enter_nanosleep /pid == {pid} && @open > 0/ {{
  $us = (int64)args->rqtp->tv_sec * 1000000 + (int64)args->rqtp->tv_nsec / 1000;
{_sleep_rule()}}}
tracepoint:syscalls:sys_enter_clock_nanosleep /pid == {pid} && @open > 0 && (args->flags & 1) == 0/ {{
  $us = (int64)args->rqtp->tv_sec * 1000000 + (int64)args->rqtp->tv_nsec / 1000;
{_sleep_rule()}}}
tracepoint:sched:sched_switch /pid == {pid}/ {{
  @sw[tid, args->prev_state > 0 ? 1 : 0] = count();
  if (@open > 0 && args->prev_state > 0) {{ @gsw[tid] = count(); }}
}}
tracepoint:sched:sched_wakeup /args->pid != 0/ {{ @wake[args->pid] = count(); }}
tracepoint:sched:sched_process_fork /pid == {pid}/ {{ @fork = count(); }}
tracepoint:sched:sched_process_exit /pid == {pid}/ {{ @exit = count(); }}
interval:ms:5 {{
  if (@t0 == 0) {{ @t0 = nsecs; printf("{READY}\\n"); }}
  @t1 = nsecs;
  if (@open > 0) {{ @gns = @gns + 5000000; }}
}}
END {{ @ns = @t1 - @t0 + 5000000; clear(@t1); clear(@open);
      clear(@nr); clear(@a0); clear(@a1); clear(@a2); clear(@a3);
      clear(@lfd); clear(@nfd); clear(@last); clear(@cfd); clear(@served); clear(@sv); clear(@svseen);
      clear(@tw); clear(@rd); }}
"""


def _sleep_rule() -> str:
    """The @slp update for one sleep of `$us` requested microseconds (see the module docstring);
    a thread's first sleep in the window has no previous one to count from and is skipped."""
    return f"""  $n = @served - @sv[tid];
  if (@svseen[tid] == 1) {{
    if ($n > {SERVED_CAP}) {{ $n = {SERVED_CAP}; }}
{_bucket("$us", "    ")}    @slp[tid, $n, $q] = count();
  }}
  @sv[tid] = @served; @svseen[tid] = 1;
"""


def _bucket(var: str, indent: str) -> str:
    """bpftrace lines that set `$q` to the bucket centre of the microseconds in `var` (clamped to
    0..10 s): the arithmetic of `sleep_bucket`."""
    q = f"{var} < 4096 ? {var} / 16 * 16 + 8 : ({var} < 65536 ? {var} / 256 * 256 + 128 : {var} / 4096 * 4096 + 2048)"
    return (
        f"{indent}if ({var} > 10000000) {{ {var} = 10000000; }}\n"
        f"{indent}if ({var} < 0) {{ {var} = 0; }}\n{indent}$q = {q};\n"
    )


def sleep_bucket(us: int) -> int:
    """The bucket centre the trace keys a requested sleep of `us` microseconds by (16 us wide
    below 4 ms, 256 us below 64 ms, 4 ms above): the same arithmetic as `_sleep_rule`."""
    us = min(max(int(us), 0), 10_000_000)
    if us < 4096:
        return us // 16 * 16 + 8
    if us < 65536:
        return us // 256 * 256 + 128
    return us // 4096 * 4096 + 2048


class TraceError(CloneError):
    """bpftrace did not start, attach, or print its maps: a window to try again (its callers do,
    up to TRACE_TRIES times)."""


# tries of one eBPF window. Session 5's bench once had bpftrace print nothing while other eBPF jobs
# loaded their programs; session 23's had bpftrace hang for 60 s after the SIGINT that ends redis's
# 1.5-s idle window (killed, no maps) and the whole pipeline fail on it
TRACE_TRIES = 3


class SyscallTrace:
    """A running bpftrace session; `stop()` returns the parsed maps."""

    def __init__(
        self,
        bpftrace: str,
        pid: int,
        listen_fds: list[int],
        notify_fds: list[int],
        workdir: Path,
        gate_conns: bool = False,
    ):
        self.script = workdir / "syscalls.bt"
        self.script.write_text(bpftrace_script(pid, listen_fds, notify_fds, gate_conns))
        self.out = workdir / "syscalls.txt"
        self.fh = open(self.out, "w")
        # -B none: the ready line must reach the file at once (a file is block-buffered)
        self.proc = subprocess.Popen(
            [bpftrace, "-B", "none", str(self.script)],
            stdout=self.fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.t_start = None
        self.hung = ""
        # wait for the first tick of the interval probe, the last one in the script: "Attaching N
        # probes" comes before the probes are attached, and a SIGINT during the attach (which
        # takes seconds while other eBPF programs load) ends bpftrace without printing any map
        deadline = time.monotonic() + 60
        while True:
            time.sleep(0.1)
            if self.proc.poll() is not None:
                self.fh.close()
                raise TraceError(f"bpftrace failed to start: {_cause(self.out)}")
            if READY in self.out.read_text(errors="replace"):
                break
            if time.monotonic() > deadline:
                self._kill()
                raise TraceError(f"bpftrace attached no probe within 60 s: {_cause(self.out)}")
        self.t_start = time.monotonic()

    def _kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.fh.close()

    def stop(self) -> dict:
        dur = time.monotonic() - (self.t_start or time.monotonic())
        stop_ns = time.monotonic_ns()  # bpf_ktime_get_ns's clock
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.hung = _where(self.proc.pid)
                self.proc.kill()
                self.proc.wait()
        self.fh.close()
        text = self.out.read_text(errors="replace")
        try:
            return parse_maps(text, dur, stop_ns)
        except CloneError:
            why = f"bpftrace (exit {self.proc.returncode}) printed no maps: {_cause(self.out)}"
            if self.hung:
                why += f"; hung {STOP_WAIT_S} s after the SIGINT in {self.hung}"
            raise TraceError(f"the syscall trace is empty: {why}") from None


# seconds bpftrace has to print its maps and exit after the SIGINT (0.7 s on an idle machine;
# the rare hang, sessions 23 and 36's CI, never ended within 60)
STOP_WAIT_S = 30


def _where(pid: int) -> str:
    """Where a hung bpftrace's threads wait (/proc: wchan and the syscall number each is in), so
    that the error that ends the window says what bpftrace was stuck in."""
    got = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return "an unknown place (its /proc entry is gone)"
    for tid in tids[:8]:
        try:
            wchan = Path(f"/proc/{pid}/task/{tid}/wchan").read_text().strip() or "-"
            nr = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[0]
        except (OSError, IndexError):
            continue
        got.append(f"{tid}:{wchan}/sys{nr}")
    return " ".join(got) or "an unknown place"


def _cause(out: Path) -> str:
    """The last line bpftrace wrote that says what went wrong (an error line when there is one)."""
    lines = [x.strip() for x in out.read_text(errors="replace").splitlines() if x.strip() and READY not in x]
    # (bpftrace always warns about RLIMIT_MEMLOCK on this kernel; that is not the cause)
    errs = [x for x in lines if "rror" in x and "RLIMIT_MEMLOCK" not in x]
    return ((errs or lines)[-1:] or ["no output"])[0][:200]


_MAP = re.compile(r"^@(\w+)(?:\[([^\]]*)\])?:\s*(-?\d+)\s*$")


def parse_maps(text: str, duration_s: float, stop_ns: int | None = None) -> dict:
    """bpftrace's map printout -> {name: {key tuple: value}} plus the window length: from the
    interval's first tick (@t0) to `stop_ns` (the SIGINT, CLOCK_MONOTONIC ns) or its last tick
    (@ns after @t0), whichever is first; the caller's `duration_s` without them."""
    maps: dict[str, dict] = defaultdict(dict)
    for line in text.splitlines():
        m = _MAP.match(line.strip())
        if not m:
            continue
        name, key, val = m.group(1), m.group(2), int(m.group(3))
        k = tuple(int(x) for x in key.split(",")) if key else ()
        maps[name][k] = val
    if "go" not in maps and not maps:
        raise CloneError("the syscall trace is empty or corrupt (bpftrace printed no maps)")
    ns = maps.pop("ns", {}).get((), 0)
    t0 = maps.pop("t0", {}).get((), 0)
    if ns > 0 and t0 > 0 and stop_ns is not None and stop_ns > t0:
        ns = min(ns, stop_ns - t0)
    out = {k: dict(v) for k, v in maps.items()}
    # bpftrace's own window (attach to END) when it printed one, else the caller's clock
    out["duration_s"] = ns / 1e9 if ns > 0 else duration_s
    return out


def summarise(maps: dict, tids: list[int] | None = None) -> dict:
    """Per-thread syscall counts by name and fd class, JSON-able."""
    per_thread: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for (tid, nr, c), n in maps.get("calls", {}).items():
        if tids is not None and tid not in tids:
            continue
        per_thread[tid][f"{SYSCALLS.get(nr, f'sys{nr}')}:{CLASS_NAMES.get(c, c)}"] += n
    return {str(t): dict(v) for t, v in per_thread.items()}


def perf_stacks(perf: str, pid: int, seconds: float, workdir: Path) -> dict[int, dict[str, int]]:
    """Per-thread call-edge counts from `perf record -e cpu-clock -g` (caller>callee frames)."""
    data = workdir / "perf.data"
    try:
        subprocess.run(
            [
                perf,
                "record",
                "-q",
                "-e",
                "cpu-clock",
                "-F",
                "997",
                "-g",
                "-p",
                str(pid),
                "-o",
                str(data),
                "--",
                "sleep",
                f"{seconds:.1f}",
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=False,
        )
        p = subprocess.run(
            [perf, "script", "-i", str(data), "-F", "tid,ip,sym,dso"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CloneError(f"perf record failed: {exc}") from None
    if not data.exists():
        raise CloneError("perf record wrote no data (is perf_event_paranoid too strict? run as root)")
    edges: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    tid = None
    frames: list[str] = []

    def flush():
        if tid is not None and frames:
            for callee, caller in itertools.pairwise(frames):
                edges[tid][f"{caller}>{callee}"] += 1
            edges[tid][f"leaf:{frames[0]}"] += 1

    for line in p.stdout.splitlines():
        if not line.strip():
            flush()
            tid, frames = None, []
            continue
        if not line.startswith((" ", "\t")):
            flush()
            frames = []
            try:
                tid = int(line.split()[0])
            except (ValueError, IndexError):
                tid = None
            continue
        parts = line.split()
        if len(parts) >= 2:
            sym = parts[1] if parts[1] != "[unknown]" else parts[0]
            dso = parts[-1].strip("()")
            frames.append(f"{os.path.basename(dso)}:{sym.split('+')[0]}")
    flush()
    return {t: dict(v) for t, v in edges.items()}


def tmpdir(prefix: str = "tailscope-clone-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
