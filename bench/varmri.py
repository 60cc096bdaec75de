#!/usr/bin/env python3
"""`make bench`, part `varmri`: what recording costs, against the tools a user
would otherwise reach for, measured in one run.

Workloads: redis GET (Debian redis-server) and memcached GET (Debian
memcached, and memcached built from its Debian source with the request-marker
patch in bench/memcached/). The server is pinned to CPU 0, the load generator
to CPU 1; tracers run unpinned, as they would in production.

For each setup we measure, interleaving setups within each repetition so drift
hits all of them alike, and take the median of --runs repetitions:
  - max throughput: closed-loop saturation (tailscope-loadgen --rate max);
  - p99 at 80% of the untraced max: open-loop Poisson, timed from intended send;
  - trace volume: bytes the tracer wrote per second and per recorded request.

Setups: none; tailscope zero-instrumentation at 1% and 100%; tailscope marker
mode at 1% and 100% (memcached-marked); bpftrace printing every syscall of the
target; `perf record -F 4000 -g`; ftrace of sched + irq + irq_vectors events
(raw per-CPU buffers, as trace-cmd records them; bench/ftrace/record.sh).

Writes bench/results/varmri.json and bench/results/varmri.md (with the command
that reproduces them) and prints the table as ratios to no tracing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# VARMRI_BENCH_AGENT / _LOADGEN: copies to use (the shared target/ may be rebuilt mid-run by others).
AGENT = Path(os.environ.get("VARMRI_BENCH_AGENT") or ROOT / "target" / "release" / "tailscope-agent")
LOADGEN = Path(os.environ.get("VARMRI_BENCH_LOADGEN") or ROOT / "target" / "release" / "tailscope-loadgen")
MEMCACHED_MARKED = ROOT / "build" / "memcached-marked"
# The same source, configure line and flags, without the patch or the runtime
# (bench/memcached/build.sh builds both): the control for the marker rows.
MEMCACHED_PLAIN = ROOT / "build" / "memcached-plain"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.3).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server on port {port} did not come up")


def dir_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Server:
    """A server process pinned to CPU 0."""

    def __init__(self, kind: str, port: int, env: dict | None = None):
        self.kind, self.port = kind, port
        if kind == "redis":
            cmd = [
                shutil.which("redis-server"),
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                "/dev/null",
            ]
        elif kind == "memcached":
            cmd = [shutil.which("memcached"), "-p", str(port), "-U", "0", "-t", "1", "-u", "root"]
        elif kind == "memcached-marked":
            cmd = [str(MEMCACHED_MARKED), "-p", str(port), "-U", "0", "-t", "1", "-u", "root"]
        elif kind == "memcached-plain":
            cmd = [str(MEMCACHED_PLAIN), "-p", str(port), "-U", "0", "-t", "1", "-u", "root"]
        else:
            raise ValueError(kind)
        self.proc = subprocess.Popen(
            ["taskset", "-c", "0", *cmd],
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(port)
        time.sleep(0.2)

    @property
    def protocol(self) -> str:
        return "redis" if self.kind == "redis" else "memcached"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


WARMUP_S = 0.5


def server_cpu_ns(pid: int) -> int | None:
    """CPU time the server (all its threads) has run, from schedstat."""
    try:
        return sum(
            int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0]) for t in os.listdir(f"/proc/{pid}/task")
        )
    except (OSError, ValueError, IndexError):
        return None


def loadgen(
    server: Server, rate: str, seconds: float, out: Path, preload: bool = False, warmup: float = WARMUP_S
) -> dict:
    cmd = [
        str(LOADGEN),
        "--protocol",
        server.protocol,
        "--target",
        f"127.0.0.1:{server.port}",
        "--rate",
        rate,
        "--duration",
        str(seconds),
        "--warmup",
        str(warmup),
        "--cpu",
        "1",
        "--connections",
        "16",
        "--json",
        str(out),
        "--quiet",
    ]
    if preload:
        cmd.append("--preload")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


class Tracer:
    """One tracing setup attached to a running server; returns bytes written."""

    def __init__(self, setup: str, pid: int, workdir: Path):
        self.setup, self.pid, self.dir = setup, pid, workdir
        self.proc = None
        self.out = workdir / "trace"
        if setup in ("none", "none-marked", "none-plain"):
            return
        if setup.startswith("tailscope"):
            rate = "1%" if "-1%" in setup else "100%"
            mode = "marker" if "marker" in setup else "infer"
            cmd = [
                str(AGENT),
                "record",
                "-o",
                str(self.out),
                "--force",
                "-p",
                str(pid),
                "--sample",
                rate,
                "--mode",
                mode,
                "--quiet",
            ]
            if setup.endswith("-continuous"):
                # every request drawn independently, programs always attached
                cmd += ["--burst", "off"]
        elif setup == "bpftrace":
            prog = (
                f'tracepoint:raw_syscalls:sys_enter /pid == {pid}/ {{ printf("%d %d %ld\\n", tid, args->id, nsecs); }}'
            )
            cmd = ["bpftrace", "-o", str(self.out), "-e", prog]
        elif setup == "perf":
            cmd = ["perf", "record", "-F", "4000", "-g", "-p", str(pid), "-o", str(self.out), "-q"]
        elif setup == "ftrace":
            # trace-cmd cannot run in this VM (see bench/ftrace/record.sh);
            # the script drives the same tracefs machinery directly.
            cmd = [str(ROOT / "bench" / "ftrace" / "record.sh"), str(self.out)]
        else:
            raise ValueError(setup)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(2.0 if setup in ("bpftrace", "ftrace") else 1.0)
        if self.proc.poll() is not None:
            raise RuntimeError(f"{setup} failed to start: {self.proc.stderr.read().decode()[-300:]}")

    def stop(self) -> dict:
        info = {"bytes": 0, "requests": None}
        if self.proc is None:
            return info
        # SIGTERM for the ftrace script: a shell started with SIGINT ignored
        # (this bench run in the background, nohup, CI) cannot trap it, so
        # its tracefs instance would outlive it and trace every CPU forever.
        self.proc.send_signal(signal.SIGTERM if self.setup == "ftrace" else signal.SIGINT)
        # Reap it ourselves for its rusage: the tracer's whole-life CPU,
        # including the work it does after SIGINT (the agent encodes and
        # writes its last row group then).
        deadline = time.time() + 60
        while True:
            pid, status, ru = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                info["cpu_s"] = ru.ru_utime + ru.ru_stime
                break
            if time.time() > deadline:
                self.proc.kill()
                self.proc.wait()
                break
            time.sleep(0.02)
        info["rc"] = self.proc.returncode
        if self.out.exists():
            info["bytes"] = dir_bytes(self.out)
            meta = self.out / "meta.json"
            if meta.exists():
                m = json.loads(meta.read_text())
                info["requests"] = m.get("requests_recorded")
                info["bytes"] = dir_bytes(self.out / "requests") if (self.out / "requests").exists() else info["bytes"]
        return info


SETUPS = {
    "redis": [
        "none",
        "tailscope-infer-1%",
        "tailscope-infer-1%-continuous",
        "tailscope-infer-100%",
        "bpftrace",
        "perf",
        "ftrace",
    ],
    "memcached": [
        "none",
        "none-plain",
        "none-marked",
        "tailscope-infer-1%",
        "tailscope-infer-1%-continuous",
        "tailscope-infer-100%",
        "tailscope-marker-1%",
        "tailscope-marker-1%-continuous",
        "tailscope-marker-100%",
        "bpftrace",
        "perf",
        "ftrace",
    ],
}


def server_kind(workload: str, setup: str) -> str:
    if workload == "memcached" and ("marker" in setup or setup == "none-marked"):
        return "memcached-marked"
    if workload == "memcached" and setup == "none-plain":
        return "memcached-plain"
    return workload


def baseline_of(setup: str, setups) -> str:
    """What a setup is compared with. Marker rows (and the marked build
    without an agent) against the unpatched build of the same source and
    flags, when it was built: the difference between that build and Debian's
    package (other flags, TLS and SASL compiled in) is not tailscope's cost.
    Everything else against the Debian server it runs."""
    if ("marker" in setup or setup == "none-marked") and "none-plain" in setups:
        return "none-plain"
    return "none"


def measure(workload: str, setup: str, port: int, seconds: float, rate80: float | None, tmp: Path) -> dict:
    env = {"TAILSCOPE_SAMPLE": "1%"} if "marker" in setup else {}
    srv = Server(server_kind(workload, setup), port, env)
    try:
        loadgen(srv, "2000", 0.5, tmp / "preload.json", preload=True)
        tr = Tracer(setup, srv.proc.pid, tmp)
        t0 = time.time()
        try:
            cpu0 = server_cpu_ns(srv.proc.pid)
            mx = loadgen(srv, "max", seconds, tmp / "max.json", warmup=0.0)
            cpu1 = server_cpu_ns(srv.proc.pid)
            p = loadgen(srv, str(int(rate80)), seconds, tmp / "p99.json") if rate80 else None
        finally:
            elapsed = time.time() - t0
            info = tr.stop()
    finally:
        srv.stop()
    res = {"max_rps": mx["achieved_rps"], "bytes": info["bytes"], "elapsed_s": elapsed, "recorded": info["requests"]}
    if p:
        res["p99_us"] = p["latency_us"]["p99"]
        res["rate80_achieved"] = p["achieved_rps"]
    # Server CPU per request at saturation (the max run has no warmup, so
    # every request it completed is in the CPU time): what tracing adds to
    # each request's cost. Much less sensitive than max throughput to other
    # load on the machine, which steals the server's wall time, not its CPU
    # time.
    if cpu0 is not None and cpu1 is not None and mx.get("completed"):
        res["cpu_ns_per_req"] = (cpu1 - cpu0) / mx["completed"]
    return res


# Setups measured a second way: attach and detach the agent on ONE running
# server, alternating short halves (see attach_pairs).
ATTACH_SETUPS = {
    "redis": ["tailscope-infer-1%", "tailscope-infer-1%-continuous", "tailscope-infer-100%"],
    "memcached": [
        "tailscope-infer-1%",
        "tailscope-infer-1%-continuous",
        "tailscope-infer-100%",
        "tailscope-marker-1%",
        "tailscope-marker-1%-continuous",
        "tailscope-marker-100%",
    ],
}


def bpf_prog_ns(pid: int) -> tuple[int, int] | None:
    """(run_time_ns, run_cnt) summed over the BPF programs process `pid` holds,
    from the kernel's own accounting; None unless kernel.bpf_stats_enabled=1
    (bpftool omits run_time_ns of a program that has not run, or without stats,
    so missing means 0 only while stats are on)."""
    try:
        r = subprocess.run(["bpftool", "prog", "show", "--json"], capture_output=True, text=True, timeout=10)
        progs = json.loads(r.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    # The programs whose fds (program or link) the process holds: Debian's
    # bpftool prints no `pids`, fdinfo names the program of each.
    ids = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fdinfo"):
            try:
                for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
                    if line.startswith("prog_id:"):
                        ids.add(int(line.split()[1]))
            except (OSError, ValueError, IndexError):
                continue
    except OSError:
        return None
    mine = [p for p in progs if p.get("id") in ids]
    if not mine or not BpfStats.active:
        return None
    return sum(int(p.get("run_time_ns", 0)) for p in mine), sum(int(p.get("run_cnt", 0)) for p in mine)


class BpfStats:
    """kernel.bpf_stats_enabled=1 for the duration (restored after): the
    kernel then times every BPF program run (two clock reads each, which
    tailscope's attached halves pay: conservative)."""

    PATH = Path("/proc/sys/kernel/bpf_stats_enabled")
    active = False  # stats known to be on (inside a BpfStats block)

    def __enter__(self):
        self.enabled = False
        try:
            self.old = self.PATH.read_text().strip()
            self.PATH.write_text("1")
            self.enabled = self.PATH.read_text().strip() == "1"
        except OSError:
            self.old = None
        if not self.enabled:
            log("bench: cannot enable kernel.bpf_stats_enabled: BPF cost unmeasured")
        BpfStats.active = self.enabled
        return self

    def __exit__(self, *exc):
        BpfStats.active = False
        if self.old is not None:
            try:
                self.PATH.write_text(self.old)
            except OSError:
                pass


def attach_half(srv: Server, setup: str, on: bool, seconds: float, tmp: Path) -> dict:
    """One half of an attach pair: the closed-loop maximum of `srv`, with the
    agent of `setup` attached (on) or not. With the agent: its BPF programs'
    run time over the half (bpf_stats) and its CPU from the half's start to
    its exit (whole-life rusage minus what it had used before), per request.
    Raises if the agent did not run through the half and exit cleanly."""
    trace = tmp / "trace"
    if trace.is_dir():
        shutil.rmtree(trace)
    tr = Tracer(setup, srv.proc.pid, tmp) if on else None
    own: dict = {}
    alive, info = True, None
    try:
        apid = tr.proc.pid if tr is not None else None
        b0 = bpf_prog_ns(apid) if apid else None
        a0 = server_cpu_ns(apid) if apid else None
        cpu0 = server_cpu_ns(srv.proc.pid)
        mx = loadgen(srv, "max", seconds, tmp / "max.json", warmup=0.0)
        cpu1 = server_cpu_ns(srv.proc.pid)
        b1 = bpf_prog_ns(apid) if apid else None
        a1 = server_cpu_ns(apid) if apid else None
        alive = tr is None or tr.proc.poll() is None
    finally:
        if tr is not None:
            info = tr.stop()
    n = mx.get("completed") or 0
    if tr is not None:
        if not alive or info.get("rc") != 0:
            raise RuntimeError(f"the agent did not record through the half (exit {info.get('rc')})")
        if n and b0 and b1 and b1[1] > b0[1]:
            own["bpf_ns_per_req"] = (b1[0] - b0[0]) / n
            own["bpf_runs_per_req"] = (b1[1] - b0[1]) / n
        if n and a0 is not None and info.get("cpu_s") is not None:
            own["agent_ns_per_req"] = (info["cpu_s"] * 1e9 - a0) / n
            if a1 is not None:
                # while the load ran, and from SIGINT to its exit
                own["agent_steady_ns_per_req"] = (a1 - a0) / n
                own["agent_exit_ns"] = info["cpu_s"] * 1e9 - a1
                own["requests"] = n
    cpu = (cpu1 - cpu0) / n if cpu0 is not None and cpu1 is not None and n else None
    return {"max_rps": mx["achieved_rps"], "cpu_ns_per_req": cpu, **own}


def idle_exit_ns(srv: Server, setup: str, seconds: float, tmp: Path, runs: int = 3) -> float | None:
    """The agent's fixed cost of stopping (detach, file footers, meta.json):
    its CPU from SIGINT to its exit after a half with no load (median of
    `runs`). A recording pays it once, not per request; the attach pairs'
    1.5 s halves would otherwise charge it to the half's requests. What the
    exit costs beyond this (encoding the half's last records) stays charged."""
    got = []
    for _ in range(runs):
        trace = tmp / "trace"
        if trace.is_dir():
            shutil.rmtree(trace)
        tr = Tracer(setup, srv.proc.pid, tmp)
        time.sleep(seconds)
        a1 = server_cpu_ns(tr.proc.pid)
        info = tr.stop()
        if a1 is not None and info.get("rc") == 0 and info.get("cpu_s") is not None:
            got.append(info["cpu_s"] * 1e9 - a1)
    return statistics.median(got) if got else None


def attach_pairs(workload: str, setup: str, port: int, pairs: int, seconds: float, tmp: Path) -> dict:
    """The agent's cost as a user meets it: attach to a running server, record,
    detach. One server process serves every half, so its start-up, memory
    layout and warm caches are the same with and without the agent, and the
    halves of a pair are seconds apart, so the host's drift (±20% between
    minutes on this VM) mostly cancels. The half order alternates each pair.

    For the marker rows the detached halves still run the marked build's idle
    path (no sampled request without an agent: request.c), whose cost the
    runtime microbenchmark gives per request; the table adds it (see render)."""
    srv = Server(server_kind(workload, setup), port)
    out: dict = {"pairs": []}
    try:
        loadgen(srv, "2000", 0.5, tmp / "preload.json", preload=True)
        out["idle_exit_ns"] = idle_exit_ns(srv, setup, seconds, tmp)
        for i in range(pairs):
            try:
                half = {
                    state: attach_half(srv, setup, state == "on", seconds, tmp)
                    for state in (("off", "on") if i % 2 == 0 else ("on", "off"))
                }
            except Exception as e:  # one bad pair is dropped and counted, not the setup
                log(f"bench: {workload} attach pair {i + 1}/{pairs} {setup}: {e}")
                out["failed_pairs"] = out.get("failed_pairs", 0) + 1
                continue
            out["pairs"].append(half)
            log(
                f"bench: {workload} attach pair {i + 1}/{pairs} {setup}: "
                f"off {half['off']['max_rps']:.0f} on {half['on']['max_rps']:.0f} req/s"
            )
    finally:
        srv.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--workloads", default="redis,memcached")
    ap.add_argument(
        "--pairs", type=int, default=8, help="attach/detach pairs per tailscope setup on one running server (0: skip)"
    )
    ap.add_argument("--pair-seconds", type=float, default=1.5, help="length of each half of an attach pair")
    ap.add_argument(
        "--keep-others",
        action="store_true",
        help="keep the results of workloads not measured now (from an earlier run, one per invocation)",
    )
    ap.add_argument(
        "--setups",
        default=None,
        help="comma-separated setups to measure now (with the baselines they are compared with); "
        "the other setups of the workload keep their rows from the earlier results file, "
        "each row paired with the baseline runs of its own invocation",
    )
    args = ap.parse_args()
    if args.setups is not None and args.workloads.count(",") > 0:
        sys.exit("bench: --setups needs a single --workloads")
    command = " ".join(["python", "bench/varmri.py", *sys.argv[1:]])
    for exe in (AGENT, LOADGEN):
        if not exe.exists():
            sys.exit(f"bench: {exe} not built; run `make build`")
    if MEMCACHED_MARKED.exists():
        # Rebuild if libtailscope changed since (idempotent; `make bench` runs
        # it too): a stale build has another region layout and the agent
        # refuses it.
        b = subprocess.run(
            [str(ROOT / "bench" / "memcached" / "build.sh")],
            env={**os.environ, "TS_NO_APT": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if b.returncode != 0:
            log(f"bench: memcached-marked rebuild failed: {b.stderr.strip()[-300:]}")
    have_marked = MEMCACHED_MARKED.exists() and MEMCACHED_PLAIN.exists()
    RESULTS.mkdir(parents=True, exist_ok=True)
    table: dict = {}
    port = 17000
    with tempfile.TemporaryDirectory(prefix="ts-bench-") as td:
        tmp = Path(td)
        for workload in args.workloads.split(","):
            setups = [
                s for s in SETUPS[workload] if have_marked or not ("marker" in s or s in ("none-marked", "none-plain"))
            ]
            if not have_marked and workload == "memcached":
                log("bench: build/memcached-marked or -plain missing (bench/memcached/build.sh); marker rows skipped")
            if args.setups is not None:
                wanted = set(args.setups.split(","))
                unknown = wanted - set(SETUPS[workload])
                if unknown:
                    sys.exit(f"bench: unknown setups for {workload}: {', '.join(sorted(unknown))}")
                # A setup's baseline is measured with it (paired by round).
                wanted |= {baseline_of(s, setups) for s in wanted}
                setups = [s for s in setups if s in wanted]
            # Untraced max throughput first: it sets the 80% open-loop rate,
            # for each baseline (a setup runs at 80% of its own baseline's).
            rate80 = {}
            for b in sorted({baseline_of(s, setups) for s in setups}):
                base = []
                for _ in range(3):
                    port += 1
                    base.append(measure(workload, b, port, args.seconds, None, tmp)["max_rps"])
                rate80[b] = 0.8 * statistics.median(base)
                log(f"bench: {workload}: {b} max {statistics.median(base):.0f} req/s; open-loop rate {rate80[b]:.0f}")
            runs: dict = {s: [] for s in setups}
            for r in range(args.runs):
                # Rotate the order each repetition: pairing cancels drift
                # between repetitions, rotation the drift within one.
                k = r % len(setups)
                for s in setups[k:] + setups[:k]:
                    port += 1
                    trace = tmp / "trace"
                    if trace.is_dir():
                        shutil.rmtree(trace)
                    elif trace.exists():
                        trace.unlink()
                    try:
                        res = measure(workload, s, port, args.seconds, rate80[baseline_of(s, setups)], tmp)
                    except Exception as e:
                        log(f"bench: {workload}/{s} run {r}: {e}")
                        res = {"failed": str(e)[-300:]}
                    runs[s].append({**res, "round": r})
                    log(f"bench: {workload} run {r + 1}/{args.runs} {s}: {res.get('max_rps', 'failed')}")
            attach = {}
            for s in ATTACH_SETUPS[workload] if args.pairs > 0 else []:
                if s not in setups:
                    continue
                port += 1
                try:
                    with BpfStats():
                        attach[s] = attach_pairs(workload, s, port, args.pairs, args.pair_seconds, tmp)
                except Exception as e:
                    log(f"bench: {workload}/{s} attach pairs: {e}")
                    attach[s] = {"failed": str(e)[-300:], "pairs": []}
            table[workload] = {
                "rate80": rate80,
                "runs": runs,
                "command": command,
                "repetitions": args.runs,
                "attach": attach,
            }
            if args.setups is not None:
                table[workload] = merge_earlier(workload, table[workload])
    if args.keep_others:
        # Workloads measured by an earlier invocation stay (each keeps its own command).
        try:
            old = json.loads((RESULTS / "varmri.json").read_text()).get("raw", {})
        except (OSError, ValueError):
            old = {}
        for w, t in old.items():
            if w not in table and "round" in str(t):
                t.setdefault("command", "(unrecorded)")
                table[w] = t
        table = {w: table[w] for w in SETUPS if w in table}
    summary = summarise(table)
    attach_summary = summarise_attach(table)
    out = {
        "command": command,
        "attach_summary": attach_summary,
        "host": os.uname().nodename,
        "kernel": os.uname().release,
        "runs": args.runs,
        "seconds": args.seconds,
        "summary": summary,
        "raw": table,
    }
    (RESULTS / "varmri.json").write_text(json.dumps(out, indent=2))
    commands = sorted({t.get("command", command) for t in table.values()})
    md = render(summary, " ; ".join(f"`{c}`" for c in commands), attach_summary)
    (RESULTS / "varmri.md").write_text(md)
    print(md)


def merge_earlier(workload: str, new: dict) -> dict:
    """The rows of setups not measured now, from the earlier results file.
    A kept row keeps its own baseline's runs (it is paired by round with
    them), so a kept setup whose baseline was measured now is dropped."""
    try:
        old = json.loads((RESULTS / "varmri.json").read_text()).get("raw", {}).get(workload, {})
    except (OSError, ValueError):
        old = {}
    measured = set(new["runs"])
    old_runs = old.get("runs", {})
    dropped = []
    for s, rs in old_runs.items():
        if s in measured:
            continue
        if baseline_of(s, list(old_runs)) in measured:
            dropped.append(s)
            continue
        new["runs"][s] = rs
        base = baseline_of(s, list(old_runs))
        if base not in new["runs"] and base in old_runs:
            new["runs"][base] = old_runs[base]
        if base in old.get("rate80", {}) and base not in measured:
            # the open-loop rate the kept rows ran at
            new["rate80"][base] = old["rate80"][base]
    dropped = [s for s in dropped if s not in new["runs"]]  # (a kept row's baseline came back)
    if dropped:
        # (said, not silent: the results file loses these rows until they are measured again)
        log(
            f"bench: {workload}: earlier rows not kept, their baseline was measured again now "
            f"(add them to --setups to measure them with it): {', '.join(sorted(dropped))}"
        )
    for s, a in old.get("attach", {}).items():
        new["attach"].setdefault(s, a)
    new["runs"] = {s: new["runs"][s] for s in SETUPS[workload] if s in new["runs"]}
    new["attach"] = {s: new["attach"][s] for s in ATTACH_SETUPS[workload] if s in new["attach"]}
    if old.get("command") and old["command"] != new["command"]:
        new["command"] = f"{old['command']} (rows not re-measured) ; {new['command']}"
    return new


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def paired_ratios(rs: list[dict], base: list[dict], key: str) -> list[float]:
    """setup/baseline for each repetition where both were measured (the
    setups of a repetition run back to back, so slow drift in the machine's
    speed, which shifts whole repetitions, cancels out). A measured 0 counts
    (a 100% loss); a failed run, or a failed baseline, leaves its pair out,
    and the caller reports how many pairs remain."""
    by_round = {r.get("round"): r.get(key) for r in base if not r.get("failed")}
    return [
        r[key] / by_round[r.get("round")]
        for r in rs
        if not r.get("failed") and r.get(key) is not None and by_round.get(r.get("round"))
    ]


def paired(rs: list[dict], base: list[dict], key: str):
    """Median of the paired ratios."""
    ratios = paired_ratios(rs, base, key)
    return statistics.median(ratios) if ratios else None


def summarise(table: dict) -> list[dict]:
    rows = []
    for workload, t in table.items():
        runs = t["runs"]
        reps = t.get("repetitions") or max((len(v) for v in runs.values()), default=0)
        for s, all_rs in runs.items():
            rs = [r for r in all_rs if not r.get("failed")]
            if not rs:
                rows.append({"workload": workload, "setup": s, "failed": True})
                continue
            base_name = baseline_of(s, runs)
            base = runs.get(base_name) or []
            tput = paired(rs, base, "max_rps")
            mx, p99 = med([r["max_rps"] for r in rs]), med([r.get("p99_us") for r in rs])
            mbps = med([r["bytes"] / r["elapsed_s"] / 1e6 for r in rs])
            cpu = med([r.get("cpu_ns_per_req") for r in rs])
            per_req = med([r["bytes"] / r["recorded"] for r in rs if r.get("recorded")])
            cpu_ratio = paired(rs, base, "cpu_ns_per_req")
            losses = [100 * (1 - x) for x in paired_ratios(rs, base, "max_rps")]
            # Fewer than half the repetitions paired: not a measurement.
            if len(losses) * 2 < reps:
                tput = None
            rows.append(
                {
                    "workload": workload,
                    "setup": s,
                    "baseline": base_name,
                    "max_rps": mx,
                    "p99_us": p99,
                    "throughput_ratio": tput,
                    "throughput_loss_pct": 100 * (1 - tput) if tput else None,
                    "loss_range_pct": [min(losses), max(losses)] if losses else None,
                    "losses_pct": losses,
                    "pairs": len(losses),
                    "repetitions": reps,
                    "p99_ratio": paired(rs, base, "p99_us"),
                    "rate80_ratio": paired(rs, base, "rate80_achieved"),
                    "trace_MB_per_s": mbps,
                    "bytes_per_recorded_request": per_req,
                    "cpu_ns_per_req": cpu,
                    "cpu_ratio": cpu_ratio,
                }
            )
    return rows


def runtime_pair_ns(case: str) -> float | None:
    """ns per begin/end pair of a runtime microbenchmark case, from its last
    results (bench/results/runtime.json): `unsampled` is the marked build's
    idle cost per request, `sampled_100pct` a sampled request's (rings drained
    from another core)."""
    try:
        cases = json.loads((RESULTS / "runtime.json").read_text())["cases"]
        return next(float(c["ns_per_pair_median"]) for c in cases if c["case"] == case)
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return None


def median_ci(xs: list[float], coverage: float = 0.9) -> tuple[float, float] | None:
    """Distribution-free confidence interval of the median: the order
    statistics x_(k), x_(n+1-k) with the largest k whose coverage (binomial,
    p = 1/2) is at least `coverage`. None when n is too small for it."""
    n = len(xs)
    xs = sorted(xs)
    best = None
    for k in range(1, n // 2 + 1):
        tail = sum(math.comb(n, i) for i in range(k)) / 2**n
        if 1 - 2 * tail >= coverage:
            best = (xs[k - 1], xs[n - k])
    return best


def summarise_attach(table: dict) -> list[dict]:
    """Per setup: the median over pairs of on/off throughput (and server CPU
    per request), with the range. The marker rows add the idle path's share
    (unsampled pair ns / server CPU ns per request): the detached halves run
    it too, and the issue's baseline is no tracing at all."""
    idle_ns = runtime_pair_ns("unsampled")
    # a sampled request with its kernel counters snapshotted: the real
    # array when the microbenchmark ran beside an agent, else its stand-in
    sampled_ns = runtime_pair_ns("sampled_100pct_kcounters") or runtime_pair_ns("sampled_100pct_fake_kc")
    rows = []
    for workload, t in table.items():
        for s, a in (t.get("attach") or {}).items():
            ps = [p for p in a.get("pairs", []) if p.get("on") and p.get("off") and p["off"]["max_rps"]]
            if not ps:
                rows.append({"workload": workload, "setup": s, "failed": a.get("failed", "no pairs")})
                continue
            losses = [100 * (1 - p["on"]["max_rps"] / p["off"]["max_rps"]) for p in ps]
            cpus = [
                p["on"]["cpu_ns_per_req"] / p["off"]["cpu_ns_per_req"]
                for p in ps
                if p["on"].get("cpu_ns_per_req") and p["off"].get("cpu_ns_per_req")
            ]
            off_cpu = med([p["off"].get("cpu_ns_per_req") for p in ps])
            idle_pct = (
                100 * idle_ns / off_cpu
                if "marker" in s and idle_ns is not None and off_cpu
                else 0.0
                if "marker" not in s
                else None
            )
            loss = statistics.median(losses)
            ci = median_ci(losses)
            # tailscope's own CPU per request, as the kernel accounts it: its
            # BPF programs (bpf_stats) and the agent's threads (schedstat);
            # marker rows add the runtime's sampled path in the server.
            # The agent's part: its CPU while the load ran, plus what its exit
            # cost beyond the fixed exit of an idle recording (idle_exit_ns).
            fixed_exit = a.get("idle_exit_ns")
            for p in ps:
                on = p["on"]
                on["agent_charged_ns_per_req"] = (
                    on["agent_steady_ns_per_req"] + max(0.0, on["agent_exit_ns"] - fixed_exit) / on["requests"]
                    if fixed_exit is not None and on.get("agent_steady_ns_per_req") is not None and on.get("requests")
                    else on.get("agent_ns_per_req")
                )
            own = [
                p["on"]["bpf_ns_per_req"] + p["on"]["agent_charged_ns_per_req"]
                for p in ps
                if p["on"].get("bpf_ns_per_req") is not None and p["on"].get("agent_charged_ns_per_req") is not None
            ]
            own_ns = statistics.median(own) if own else None
            if own_ns is not None and "marker" in s:
                rate = 1.0 if "100%" in s else 0.01
                own_ns = own_ns + rate * sampled_ns if sampled_ns is not None else None
            accounted = 100 * own_ns / off_cpu + (idle_pct or 0.0) if own_ns is not None and off_cpu else None
            rows.append(
                {
                    "workload": workload,
                    "setup": s,
                    "pairs": len(ps),
                    "loss_pct": loss,
                    "loss_range_pct": [min(losses), max(losses)],
                    "loss_ci90_pct": list(ci) if ci else None,
                    "off_rps": med([p["off"]["max_rps"] for p in ps]),
                    "on_rps": med([p["on"]["max_rps"] for p in ps]),
                    "cpu_increase_pct": 100 * (statistics.median(cpus) - 1) if cpus else None,
                    "idle_path_pct": idle_pct,
                    "total_loss_pct": loss + idle_pct if idle_pct is not None else None,
                    "own_ns_per_req": own_ns,
                    "bpf_ns_per_req": med([p["on"].get("bpf_ns_per_req") for p in ps]),
                    "agent_ns_per_req": med([p["on"].get("agent_charged_ns_per_req") for p in ps]),
                    "agent_whole_life_ns_per_req": med([p["on"].get("agent_ns_per_req") for p in ps]),
                    "agent_exit_fixed_ms": a.get("idle_exit_ns") / 1e6 if a.get("idle_exit_ns") is not None else None,
                    "server_ns_per_req": off_cpu,
                    "accounted_pct": accounted,
                    "failed_pairs": a.get("failed_pairs", 0),
                }
            )
    return rows


def render_attach(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = [
        "",
        "## Attach pairs: the agent attached to and detached from one running server",
        "",
        "Each pair measures the closed-loop maximum of ONE server process twice, seconds apart: "
        "with the agent attached (started with `-p PID`) and without (half order alternating). "
        "This cancels what the table above cannot: differences between server starts and the "
        "host's drift between minutes. Loss is the median over pairs, with the range and a 90% "
        "confidence interval of the median (order statistics); the measured verdict needs the whole "
        "interval on one side of the goal, else it says `inconclusive (noise)`. For the "
        "marker rows the detached server still runs the marked build's idle path (no request is "
        "sampled without an agent); `idle path` adds its cost, one unsampled begin/end pair from "
        "the runtime microbenchmark (`bench/results/runtime.json`) over the server's CPU time "
        "per request, so `total` is the loss against no tracing at all.",
        "",
        "`accounted` is tailscope's own CPU per request as the kernel counts it, which host "
        "noise barely moves: its BPF programs (`bpf_stats`, on every CPU), the agent's CPU from "
        "the half's start to its exit (schedstat, rusage) less its fixed cost of stopping (`exit ms`: "
        "SIGINT to exit after an idle half, median of 3; a recording pays it once, the 1.5 s halves "
        "would charge it to ~60k requests; what the exit costs beyond it, the half's last records, "
        "stays charged) and, for marker rows, the runtime's sampled path (microbenchmark) and idle "
        "path; as a % of the untraced server's CPU per request it is the capacity loss if all of "
        "it came out of the server's core. It is the DIRECT cost only: it leaves out cache and "
        "TLB pollution, the IPIs of attaching and detaching burst windows and the agent's "
        "preemption of the server, so above the goal it shows the goal is not met, and below "
        "it only that the direct part fits (`direct cost within`). Pairs whose agent did not "
        "record through its half are dropped and counted.",
        "",
        "| workload | setup | pairs | max req/s off → on | loss % (range) | CPU/request increase | "
        "idle path % | total loss % | verdict (measured) | BPF + agent ns/req | agent exit ms | "
        "server ns/req | accounted % | goal | verdict (accounted) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        goal = GOALS.get(r["setup"])
        if r.get("failed"):
            lines.append(
                f"| {r['workload']} | {r['setup']} | 0 | failed: {r['failed']} | | | | | unmeasured "
                "| | | | | | unmeasured |"
            )
            continue
        tot = r["total_loss_pct"]
        ci = r.get("loss_ci90_pct")
        idle = r.get("idle_path_pct") or 0.0
        # met / NOT met only when the whole 90% interval of the median is on
        # one side of the goal; with this host's noise it often is not
        verdict = (
            ""
            if goal is None
            else "unmeasured"
            if tot is None or ci is None
            else "met"
            if ci[1] + idle <= goal
            else "NOT met"
            if ci[0] + idle > goal
            else "inconclusive (noise)"
        )
        acc = r.get("accounted_pct")
        # Direct CPU leaves out indirect costs (cache and TLB pollution, the
        # IPIs of burst attach/detach, preemption by the agent): over the
        # goal it is certainly NOT met; under it, only the direct part is.
        acc_verdict = (
            ""
            if goal is None
            else "unmeasured"
            if acc is None or r["pairs"] < 3
            else "direct cost within"
            if acc <= goal
            else "NOT met"
        )
        parts = f"{fmt(r.get('bpf_ns_per_req'), '.0f')} + {fmt(r.get('agent_ns_per_req'), '.0f')}"
        lo, hi = r["loss_range_pct"]
        ci_text = f"; 90% CI {ci[0]:.1f} to {ci[1]:.1f}" if ci else ""
        lines.append(
            f"| {r['workload']} | {r['setup']} | {r['pairs']}"
            f"{' (' + str(r['failed_pairs']) + ' failed)' if r.get('failed_pairs') else ''} | "
            f"{r['off_rps']:.0f} → {r['on_rps']:.0f} | "
            f"{r['loss_pct']:.1f} ({lo:.1f} to {hi:.1f}{ci_text}) | "
            f"{fmt(r['cpu_increase_pct'], '+.1f')}% | "
            f"{fmt(r['idle_path_pct'], '.2f')} | {fmt(tot, '.1f')} | {verdict} | {parts} | "
            f"{fmt(r.get('agent_exit_fixed_ms'), '.1f')} | {fmt(r.get('server_ns_per_req'), '.0f')} | "
            f"{fmt(acc, '.2f')} | "
            f"{'≤ ' + format(goal, 'g') + '%' if goal is not None else '—'} | {acc_verdict} |"
        )
    return lines


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def render(rows: list[dict], command: str, attach_rows: list[dict] | None = None) -> str:
    lines = [
        "# varmri: cost of recording (medians; ratios to no tracing)",
        "",
        f"Reproduce: {command} (part of `make bench`)",
        "",
        "Ratios are paired: each is the median, over repetitions, of the setup against its "
        "baseline measured in the same repetition (setups run back to back), so drift in the "
        "machine's speed cancels. The baseline is the untraced Debian server, except for the "
        "marker rows: memcached-marked is built from the Debian source with configure's "
        "default flags, so it is compared with `none-plain`, the same source and flags "
        "without the patch (Debian's package is built with other flags and with TLS and SASL).",
        "",
        "The `1%` rows use the default, burst sampling (50 ms windows sampled at 20%, about "
        "every second; between windows the per-request and per-packet programs are detached). "
        "`-continuous` rows use `--burst off`: every request drawn at 1%, programs always attached.",
        "",
        "| workload | setup | baseline | max req/s | throughput ratio | loss % | p99 @80% (µs) | p99 ratio "
        "| throughput ratio @80% | server CPU ns/req at max | CPU ratio | trace MB/s | B/recorded req |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("failed"):
            lines.append(f"| {r['workload']} | {r['setup']} | | failed | | | | | | | | | |")
            continue
        lines.append(
            f"| {r['workload']} | {r['setup']} | {r['baseline']} | {fmt(r['max_rps'], '.0f')} | "
            f"{fmt(r['throughput_ratio'], '.3f')} | "
            f"{fmt(r['throughput_loss_pct'], '.1f')} | {fmt(r['p99_us'], '.0f')} | {fmt(r['p99_ratio'], '.2f')} | "
            f"{fmt(r.get('rate80_ratio'), '.3f')} | "
            f"{fmt(r.get('cpu_ns_per_req'), '.0f')} | {fmt(r.get('cpu_ratio'), '.3f')} | "
            f"{fmt(r['trace_MB_per_s'], '.3f')} | {fmt(r['bytes_per_recorded_request'], '.1f')} |"
        )
    lines += [
        "",
        "## Goals (issue 2)",
        "",
        "Throughput loss here is the loss of capacity (closed-loop maximum). The issue's workload runs "
        "at 80% of the maximum; read literally, its throughput is the `@80%` column of the table "
        "above, which stays near 1.000 unless tracing pushes the server past saturation, so the "
        "verdict uses the stricter capacity reading. "
        "The CPU-per-request increase is shown beside it "
        "because it is far less sensitive to other load on a shared machine. In brackets: the "
        "lowest and highest of the per-repetition losses. A verdict needs the 90% confidence interval of "
        "the median (with 5 repetitions: their whole range) on one side of the goal, else it says "
        "`inconclusive (noise)`.",
        "",
    ]
    # perf and ftrace cannot make a server faster: if they measured faster than
    # the untraced baseline, the baseline's starts were slow and no verdict
    # against it is evidence.
    biased = {}
    for r in rows:
        if r["setup"] in ("perf", "ftrace") and (r.get("throughput_ratio") or 0) > 1.03:
            biased.setdefault(r["workload"], []).append(f"{r['setup']} ×{r['throughput_ratio']:.2f}")
    for w, why in biased.items():
        lines += [
            f"**{w}: baseline bias.** {', '.join(why)} against no tracing: tracers cannot speed a "
            "server up, so this workload's untraced starts were slow and its verdicts below are "
            "not evidence (see the attach pairs).",
            "",
        ]
    lines += [
        "| workload | setup | against | goal | throughput loss | CPU/request increase | verdict (throughput) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        goal = GOALS.get(r["setup"])
        if goal is None or r.get("failed"):
            continue
        loss = r.get("throughput_loss_pct")
        ci = median_ci(r.get("losses_pct") or []) if loss is not None else None
        verdict = (
            "unmeasured"
            if loss is None or ci is None
            else "not evidence (baseline bias)"
            if r["workload"] in biased
            else "met"
            if ci[1] <= goal
            else "NOT met"
            if ci[0] > goal
            else "inconclusive (noise)"
        )
        cpu_up = 100 * (r["cpu_ratio"] - 1) if r.get("cpu_ratio") else None
        spread = r.get("loss_range_pct")
        rng = f" ({spread[0]:.1f} to {spread[1]:.1f}; {r['pairs']}/{r['repetitions']} pairs)" if spread else ""
        lines.append(
            f"| {r['workload']} | {r['setup']} | {r['baseline']} | throughput loss ≤ {goal:g}% | "
            f"{fmt(loss, '.1f')}%{rng} | {fmt(cpu_up, '+.1f')}% | {verdict} |"
        )
    per_req = [
        r["bytes_per_recorded_request"]
        for r in rows
        if r["setup"].startswith("tailscope") and r.get("bytes_per_recorded_request")
    ]
    if per_req:
        worst = max(per_req)
        lines.append(
            f"| all | tailscope | | trace volume ≤ 64 B/recorded request | {worst:.1f} B (worst) | | "
            f"{'met' if worst <= 64 else 'NOT met'} |"
        )
    lines += render_attach(attach_rows or [])
    return "\n".join(lines) + "\n"


# Throughput-loss goals from issue 2, in percent.
GOALS = {
    "tailscope-infer-1%": 3.0,
    "tailscope-infer-1%-continuous": 3.0,
    "tailscope-marker-1%": 1.0,
    "tailscope-marker-1%-continuous": 1.0,
    "tailscope-marker-100%": 3.0,
}


if __name__ == "__main__":
    main()
