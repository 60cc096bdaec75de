"""Run a server (the original, relaunched, or the clone) in a private network namespace.

Valgrind cannot attach to a running process, and validation must drive the original and the
clone under identical conditions, so both are started here from their launch spec, each in its
own network namespace (the same port never collides with the production instance) with the
load generator inside the same namespace.

A launch spec is a dict: argv, cwd, env (list of K=V), nofile (RLIMIT_NOFILE to give it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CloneError
from .target import _stat_fields
from .tools import find_loadgen, need

# valgrind keeps this many fds above the client's limit for itself (memcached sets its
# RLIMIT_NOFILE to maxconns and fails if the hard limit it sees differs).
VALGRIND_RESERVED_FDS = 12


class NetNs:
    """A private network namespace held open by a sleeping process we own."""

    def __init__(self):
        need("unshare", "ip")
        self.holder = subprocess.Popen(["unshare", "--net", "sleep", "100000"], start_new_session=True)
        time.sleep(0.05)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if os.readlink(f"/proc/{self.holder.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                break
            time.sleep(0.02)
        else:
            self.close()
            raise CloneError("could not create a network namespace (unshare --net needs root)")
        self.run(["ip", "link", "set", "lo", "up"], check=True)

    def wrap(self, cmd: list[str]) -> list[str]:
        return ["nsenter", "-t", str(self.holder.pid), "-n", "--", *cmd]

    def run(self, cmd: list[str], check: bool = False, timeout: float = 600, **kw):
        return subprocess.run(self.wrap(cmd), capture_output=True, text=True, timeout=timeout, check=check, **kw)

    def popen(self, cmd: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.wrap(cmd), start_new_session=True, **kw)

    def listener_pid(self, port: int) -> int | None:
        p = self.run(["ss", "-ltnpH", f"sport = :{port}"])
        m = re.search(r"pid=(\d+)", p.stdout)
        return int(m.group(1)) if m else None

    def close(self):
        if self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class Server:
    """A server started in a NetNs; `pid` is the listening process."""

    ns: NetNs
    proc: subprocess.Popen
    pid: int
    port: int
    log: Path
    extra_pids: list[int] = field(default_factory=list)

    def stop(self, timeout: float = 30):
        for pid in [self.pid, *self.extra_pids]:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and Path(f"/proc/{self.pid}").exists():
            try:
                if self.proc.poll() is not None and not _is_alive(self.pid):
                    break
            except Exception:
                break
            time.sleep(0.1)
        if _is_alive(self.pid):
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# PM QoS: while a process holds this open with a latency of 0 µs written to it, no CPU enters an
# idle state deeper than polling; closing it (also at exit or on a crash) lifts the request
CPU_DMA_LATENCY = Path("/dev/cpu_dma_latency")
# the kernel's cpuidle driver: only its governors read the latency request; without one the idle
# loop halts regardless (kernel/sched/idle.c: cpuidle_idle_call goes to default_idle_call)
CPUIDLE_DRIVER = Path("/sys/devices/system/cpu/cpuidle/current_driver")
IDLE_MODES = ("poll", "halt")
# A CPU kept busy at the lowest priority, for a kernel that cannot poll: a waking thread preempts a
# SCHED_IDLE task at once. It exits when its parent does (it looks every ~5 ms), so a validator
# killed outright cannot leave it spinning (session 32: a stray process spoiled a timed stage).
_SPINNER = (
    "import os, sys\n"
    "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
    "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    "parent = int(sys.argv[2])\n"
    "while os.getppid() == parent:\n"
    "    for _ in range(100000):\n"
    "        pass\n"
)


def cpuidle_driver(path: Path = CPUIDLE_DRIVER) -> str | None:
    """The kernel's cpuidle driver ("haltpoll", "intel_idle", ...); None where it has none."""
    try:
        name = path.read_text().strip()
    except OSError:
        return None
    return None if name in ("", "none") else name


@contextlib.contextmanager
def _spinners(cpus: list[int]):
    procs = []
    try:
        for c in cpus:
            procs.append(subprocess.Popen([sys.executable, "-c", _SPINNER, str(c), str(os.getpid())]))
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


@contextlib.contextmanager
def cpus_awake(
    mode: str = "poll",
    device: Path = CPU_DMA_LATENCY,
    spin_cpus: tuple[int, ...] = (),
    driver: Path = CPUIDLE_DRIVER,
):
    """Hold the CPUs out of their idle halt for the block ("poll"), or leave idle as it is ("halt").
    Yields what was in force, for the report: "poll", "poll (spinners ...)", "halt", or "halt (why
    poll could not be held)"; an unknown mode is a CloneError.

    "poll" holds a CPU latency request of 0 µs. A kernel without a cpuidle driver does not read
    it, and its idle CPUs halt anyway: there, each CPU of `spin_cpus` runs a SCHED_IDLE busy loop
    for the block instead (`_SPINNER`), so that it never idles. The validator spins the server's
    CPU only: the load generator spins on its own, and a spinner beside it took 4-ms ticks from
    it (session 33: 14-19 generator stalls in an 8-s run, 6-7 with the server's CPU alone spinning).

    Why (session 27): on this Firecracker VM an idle vCPU halts (cpuidle haltpoll, with
    guest_halt_poll_ns=0), and its wake-up on the next packet goes through the host's scheduler.
    redis at 1,800 req/s had a median latency of 67-127 µs over four 8-s runs with halting CPUs
    and 20-26 µs with polling ones, p99 189-272 µs against 87-134: most of what the timed runs
    measured was the wake-up of the server's and the load generator's vCPUs, and its tail moved
    with the host's load from minute to minute, so the original's own p99 spread was 25-54%
    between its two sessions. Latency benchmarks hold the CPUs out of deep idle the same way
    (tuned's latency-performance profile writes /dev/cpu_dma_latency); both sides run under it.
    Session 33's VM had no cpuidle driver: the request held, the CPUs halted, and the results said
    "poll" (redis at 1,800 req/s: mean 46-60 µs, p99 232-324; with the server's CPU spinning 28-29
    µs, p99 68-72)."""
    if mode not in IDLE_MODES:
        raise CloneError(f"--idle {mode}: one of {', '.join(IDLE_MODES)}")
    if mode == "halt":
        yield "halt"
        return
    if cpuidle_driver(driver) is None:
        why = "this kernel has no cpuidle driver, so a CPU latency request does not keep its CPUs from halting"
        if not spin_cpus:
            yield f"halt ({why})"
            return
        cpus = sorted(set(spin_cpus))
        with _spinners(cpus):
            yield f"poll (a SCHED_IDLE spinner on CPU {', '.join(map(str, cpus))}: {why})"
        return
    fd, why = None, None
    try:
        fd = os.open(device, os.O_WRONLY)
        os.write(fd, struct.pack("i", 0))
    except OSError as exc:
        why = f"halt (could not hold the CPUs awake: {device}: {exc.strerror})"
    try:
        yield why or "poll"
    finally:
        if fd is not None:
            os.close(fd)


def host_sample(exclude: set[int]) -> dict:
    """CPU time (clock ticks) of every process on the machine but `exclude` and their children,
    and the hypervisor's steal over all CPUs: read before and after a timed run, `host_other`
    tells how much of the machine something else took meanwhile. Each process counts with the
    time of the children it reaped (cutime/cstime), so that a short-lived process that ran and
    exited between the two readings counts with its parent (init, a shell, make)."""
    procs: dict[tuple[int, int], tuple[str, int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in exclude:
            continue
        try:
            st = Path(f"/proc/{d}/stat").read_text()
        except OSError:  # exited meanwhile
            continue
        f = _stat_fields(st)
        if len(f) < 20:
            continue
        try:
            ppid, ticks, start = int(f[1]), sum(int(x) for x in f[11:15]), int(f[19])
        except ValueError:
            continue
        if ppid in exclude:
            continue
        procs[(int(d), start)] = (st[st.find("(") + 1 : st.rfind(")")][:32], ticks)
    steal = 0
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("cpu "):
                f = line.split()
                steal = int(f[8]) if len(f) > 8 else 0
                break
    except (OSError, ValueError):
        pass
    return {"procs": procs, "steal": steal, "t": time.monotonic()}


def host_other(before: dict, after: dict, hz: int) -> tuple[float, list[tuple[str, float]]]:
    """What something else took between two `host_sample`s: the share of one CPU (other
    processes' CPU time plus steal, over the elapsed time) and the largest takers (name, seconds;
    "steal" for the hypervisor), at most three."""
    took: dict[str, float] = {}
    for key, (comm, ticks) in after["procs"].items():
        d = ticks - before["procs"].get(key, (comm, 0))[1]
        if d > 0:
            took[comm] = took.get(comm, 0.0) + d / hz
    steal = max(0, after["steal"] - before["steal"]) / hz
    if steal:
        took["steal"] = steal
    elapsed = max(1e-3, after["t"] - before["t"])
    top = sorted(took.items(), key=lambda kv: -kv[1])[:3]
    return sum(took.values()) / elapsed, [(k, round(v, 2)) for k, v in top]


def steal_share(before: dict, after: dict, hz: int) -> float:
    """The hypervisor's steal between two `host_sample`s, as a share of one CPU over the elapsed
    time (it is also in `host_other`'s total; `validate.disturbed` holds it to a tighter line)."""
    elapsed = max(1e-3, after["t"] - before["t"])
    return max(0, after["steal"] - before["steal"]) / hz / elapsed


def _is_alive(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return st[st.rfind(")") + 2 :].split()[0] != "Z"


def start(
    ns: NetNs,
    launch: dict,
    port: int,
    log: Path,
    prefix: list[str] | None = None,
    cpu: int | None = None,
    startup_s: float = 60,
) -> Server:
    """Start `launch` (optionally under `prefix`, e.g. valgrind) in `ns`; wait for `port`."""
    argv = list(launch["argv"])
    if prefix:
        argv = [*prefix, *argv]
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu), *argv]
    nofile = launch.get("nofile")
    if nofile and prefix and "valgrind" in os.path.basename(prefix[0]):
        nofile = int(nofile) + VALGRIND_RESERVED_FDS
    shell = 'ulimit -n {n} 2>/dev/null || ulimit -Sn {n} 2>/dev/null; cd {cwd} && exec "$@"'.format(
        n=int(nofile) if nofile else 1024, cwd=shlex.quote(launch.get("cwd") or "/")
    )
    env = {}
    for kv in launch.get("env") or []:
        k, _, v = kv.partition("=")
        env[k] = v
    env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
    fh = open(log, "w")
    proc = ns.popen(
        ["bash", "-c", shell, "server", *argv], stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
    )
    deadline = time.monotonic() + startup_s
    pid = None
    while time.monotonic() < deadline:
        pid = ns.listener_pid(port)
        if pid:
            break
        if proc.poll() is not None and not ns.listener_pid(port):
            # daemonising servers exit their first process: give the child a moment
            time.sleep(0.5)
            pid = ns.listener_pid(port)
            if pid:
                break
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise CloneError(f"{Path(argv[0]).name} exited before listening on port {port}: {tail[0][:200]}")
        time.sleep(0.1)
    if not pid:
        proc.kill()
        raise CloneError(f"{Path(launch['argv'][0]).name} did not listen on port {port} within {startup_s:.0f} s")
    return Server(ns=ns, proc=proc, pid=pid, port=port, log=log)


def _loadgen_cmd(
    port: int,
    load_args: list[str],
    rate: float,
    duration: float,
    warmup: float,
    preload: bool,
    cpu: int | None = None,
    host: str = "127.0.0.1",
    requests_out: Path | None = None,
    stall_us: int | None = None,
) -> list[str]:
    """tailscope-loadgen's command line for one open-loop run (JSON summary on stdout)."""
    lg = find_loadgen()
    args = [a for a in load_args if a != "--preload"]
    cmd = [
        lg,
        "--target",
        f"{host}:{port}",
        *args,
        "--rate",
        f"{rate:g}",
        "--duration",
        f"{duration:g}",
        "--warmup",
        f"{warmup:g}",
        "--quiet",
        "--json",
        "-",
    ]
    if preload:
        cmd.append("--preload")
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    if requests_out is not None:
        cmd += ["--requests-out", str(requests_out)]
    if stall_us is not None:
        cmd += ["--stall-us", str(stall_us)]
    return cmd


def loadgen(
    ns: NetNs | None,
    port: int,
    load_args: list[str],
    rate: float,
    duration: float,
    out_json: Path | None = None,
    warmup: float = 0.0,
    preload: bool = False,
    cpu: int | None = None,
    host: str = "127.0.0.1",
    timeout: float | None = None,
    requests_out: Path | None = None,
    stall_us: int | None = None,
) -> dict:
    """Run tailscope-loadgen once (open loop at `rate`) and return its JSON summary. requests_out:
    where it writes each successful reply's intended time, latency and flags (docs/loadgen.md). stall_us: the generator
    spins, and keeps the replies its own stalls (a loop turn longer than this) disturbed out of the
    latencies (`--stall-us`; counted in the summary's `generator_stalls`)."""
    cmd = _loadgen_cmd(port, load_args, rate, duration, warmup, preload, cpu, host, requests_out, stall_us)
    full = ns.wrap(cmd) if ns else cmd
    try:
        p = subprocess.run(
            full, capture_output=True, text=True, timeout=timeout or (duration + warmup + 120), check=False
        )
    except subprocess.TimeoutExpired:
        raise CloneError("the load generator did not finish (server stuck?)") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise CloneError(f"load generator failed: {last[:300]}")
    try:
        summary = json.loads(p.stdout)
    except json.JSONDecodeError:
        raise CloneError("load generator printed no JSON summary") from None
    if out_json:
        out_json.write_text(p.stdout)
    return summary


def loadgen_held(
    ns: NetNs | None,
    port: int,
    load_args: list[str],
    rate: float,
    duration: float,
    at_start,
    at_end,
    warmup: float = 0.0,
    preload: bool = False,
    timeout: float | None = None,
) -> tuple[dict, float]:
    """One open-loop run held at its edges (`tailscope-loadgen --hold`): the generator preloads
    (`preload`) and warms the server for `warmup` s on its own connections, stops with every
    reply in, and `at_start()` runs; then the measured run, after which it stops again before
    closing its connections, and `at_end()` runs. Returns the run's JSON summary and the wall
    seconds between the two stops.

    Why (session 46): a callgrind window used to be counted from a `callgrind_control -z` sent
    as soon as a separate preload run had exited to the dump after the measured run's generator
    had exited, so whether the server had yet freed the preload's clients, or the run's own, fell
    to a race; redis's windows at A counted 16 to 31 client frees, and jemalloc's first
    wake-up of its background thread (lazy symbol binding, cold code: ~51 code and ~37 data LL
    misses) in 26 of 40. Held, a window counts requests only, on connections warm since the
    warm-up."""
    cmd = [*_loadgen_cmd(port, load_args, rate, duration, warmup, preload), "--hold"]
    full = ns.wrap(cmd) if ns else cmd
    p = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _await_hold(p, timeout or (warmup + 120))
        at_start()
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGCONT)
        _await_hold(p, duration + 120)
        secs = time.monotonic() - t0
        at_end()
        os.killpg(p.pid, signal.SIGCONT)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise CloneError("the load generator did not exit after its run") from None
    finally:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # a stopped process dies to SIGKILL too
            p.communicate()
    if p.returncode != 0:
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise CloneError(f"load generator failed: {last[:300]}")
    try:
        return json.loads(out), secs
    except json.JSONDecodeError:
        raise CloneError("load generator printed no JSON summary") from None


def _await_hold(p: subprocess.Popen, timeout: float) -> None:
    """Wait until the held generator stops (SIGSTOP, state T)."""
    deadline = time.monotonic() + timeout
    while not _stopped(p.pid):
        if p.poll() is not None:
            err = p.stderr.read() if p.stderr else ""
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise CloneError(f"load generator failed: {last[:300]}")
        if time.monotonic() > deadline:
            raise CloneError("the load generator did not reach its hold (server stuck?)")
        time.sleep(0.02)


def _stopped(pid: int) -> bool:
    """Whether `pid`, or a child of it (a wrapper that forks), is stopped."""
    pids = [pid]
    with contextlib.suppress(OSError, ValueError):
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for q in pids:
        try:
            stat = Path(f"/proc/{q}/stat").read_text()
        except OSError:
            continue
        if stat.rpartition(")")[2].split()[:1] == ["T"]:
            return True
    return False


def split_load(load: str) -> list[str]:
    """The user's --load string -> loadgen arguments (without --target/--rate/--duration)."""
    try:
        args = shlex.split(load)
    except ValueError as exc:
        raise CloneError(f"--load: {exc}") from None
    out = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in ("--target", "--rate", "--duration", "--warmup", "--json", "--csv", "--steps", "--cpu"):
            skip = True
            continue
        if a.startswith(("--target=", "--rate=", "--duration=", "--warmup=", "--json=", "--csv=")):
            continue
        if a in ("-q", "--quiet"):
            continue
        out.append(a)
        if i == 0 and a.startswith("tailscope-loadgen"):
            out.pop()
    return out


def load_value(args: list[str], flag: str, default: str | None = None) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return default
