"""What /proc says about the target: its launch, threads, file descriptors, listening sockets.

Socket options are read from the live sockets themselves: `pidfd_getfd(2)` duplicates the
target's listening (and one connected) socket into this process, and `getsockopt` reads the
options off the shared socket. Nothing in the target changes.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
import struct
import time
from pathlib import Path

from .errors import CloneError

SYS_PIDFD_GETFD = 438
EPOLLET = 1 << 31
EPOLLEXCLUSIVE = 1 << 28

SOCKOPTS = [  # (name, level, optname, kind)
    ("SO_REUSEADDR", socket.SOL_SOCKET, socket.SO_REUSEADDR, "int"),
    ("SO_REUSEPORT", socket.SOL_SOCKET, getattr(socket, "SO_REUSEPORT", 15), "int"),
    ("SO_KEEPALIVE", socket.SOL_SOCKET, socket.SO_KEEPALIVE, "int"),
    ("SO_LINGER", socket.SOL_SOCKET, socket.SO_LINGER, "linger"),
    ("SO_RCVBUF", socket.SOL_SOCKET, socket.SO_RCVBUF, "int"),
    ("SO_SNDBUF", socket.SOL_SOCKET, socket.SO_SNDBUF, "int"),
    ("TCP_NODELAY", socket.IPPROTO_TCP, socket.TCP_NODELAY, "int"),
    ("TCP_KEEPIDLE", socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", 4), "int"),
    ("TCP_KEEPINTVL", socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", 5), "int"),
    ("TCP_KEEPCNT", socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", 6), "int"),
    ("TCP_DEFER_ACCEPT", socket.IPPROTO_TCP, getattr(socket, "TCP_DEFER_ACCEPT", 9), "int"),
]


def _read(path: str | Path, default: str = "") -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return default


def proc_alive(pid: int) -> bool:
    """True while the process exists and has not exited (a zombie has exited)."""
    st = _read(f"/proc/{pid}/stat")
    return bool(st) and st[st.rfind(")") + 2 :].split()[:1] not in (["Z"], ["X"])


def _stat_fields(text: str) -> list[str]:
    # comm may contain spaces and parentheses: split after the last ')'
    rparen = text.rfind(")")
    return text[rparen + 2 :].split()


def threads(pid: int) -> list[dict]:
    """Per thread: tid, utime/stime (clock ticks), start time (ticks since boot), counters."""
    out = []
    for t in sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda p: int(p.name)):
        f = _stat_fields(_read(t / "stat"))
        if len(f) < 20:
            continue
        st = _read(t / "status")
        vol = re.search(r"voluntary_ctxt_switches:\s+(\d+)", st)
        nonvol = re.search(r"nonvoluntary_ctxt_switches:\s+(\d+)", st)
        out.append(
            {
                "tid": int(t.name),
                "utime": int(f[11]),
                "stime": int(f[12]),
                "start": int(f[19]),
                "minflt": int(f[7]),
                "majflt": int(f[9]),
                "vcsw": int(vol.group(1)) if vol else 0,
                "ivcsw": int(nonvol.group(1)) if nonvol else 0,
                "name": _read(t / "comm").strip(),
            }
        )
    return out


def fds(pid: int) -> dict[int, str]:
    out = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for name in names:
        try:
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
    return out


def fd_kind(link: str) -> str:
    if link.startswith("socket:"):
        return "socket"
    if link.startswith("pipe:"):
        return "pipe"
    if link.startswith("anon_inode:"):
        return link[len("anon_inode:") :].strip("[]")
    if link.startswith("/dev/"):
        return "dev"
    return "file"


def _tcp_table(pid: int) -> list[dict]:
    rows = []
    for fname, fam in (("tcp", 4), ("tcp6", 6)):
        text = _read(f"/proc/{pid}/net/{fname}")
        for line in text.splitlines()[1:]:
            p = line.split()
            if len(p) < 10:
                continue
            local, state, inode = p[1], p[3], p[9]
            addr_hex, port_hex = local.split(":")
            rows.append(
                {"family": fam, "port": int(port_hex, 16), "state": state, "inode": inode, "addr_hex": addr_hex}
            )
    return rows


def _addr(fam: int, addr_hex: str) -> str:
    if fam == 4:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(addr_hex, 16)))
    raw = bytes.fromhex(addr_hex)
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, raw)


def epoll_watches(pid: int, fd: int) -> list[dict]:
    out = []
    for line in _read(f"/proc/{pid}/fdinfo/{fd}").splitlines():
        m = re.match(r"tfd:\s+(\d+)\s+events:\s+([0-9a-f]+)", line)
        if m:
            out.append({"fd": int(m.group(1)), "events": int(m.group(2), 16)})
    return out


def _pidfd_getfd(pid: int, fd: int) -> int | None:
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        dup = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        return dup if dup >= 0 else None
    finally:
        os.close(pidfd)


def socket_options(pid: int, fd: int) -> dict | None:
    """The options set on the target's socket `fd` (None if it cannot be duplicated)."""
    dup = _pidfd_getfd(pid, fd)
    if dup is None:
        return None
    out: dict = {}
    try:
        s = socket.socket(fileno=dup)
        try:
            for name, level, opt, kind in SOCKOPTS:
                try:
                    if kind == "linger":
                        on, secs = struct.unpack("ii", s.getsockopt(level, opt, 8))
                        out[name] = [on, secs]
                    else:
                        out[name] = s.getsockopt(level, opt)
                except OSError:
                    continue
            import fcntl

            out["O_NONBLOCK"] = int(bool(fcntl.fcntl(dup, fcntl.F_GETFL) & os.O_NONBLOCK))
        finally:
            s.detach()
    finally:
        os.close(dup)
    return out


def _backlog(pid: int, port: int) -> int | None:
    import subprocess

    cmd = ["ss", "-ltnH", f"sport = :{port}"]
    if Path("/usr/bin/nsenter").exists():
        cmd = ["nsenter", "-t", str(pid), "-n", *cmd]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "LISTEN":
            return int(parts[2])
    return None


def inspect(pid: int) -> dict:
    """The target's launch and structure; a one-line error if it is not a network server."""
    if pid <= 0 or not proc_alive(pid):
        raise CloneError(f"no process with pid {pid}")
    cmdline = [a for a in _read(f"/proc/{pid}/cmdline").split("\0") if a != ""]
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError as exc:
        raise CloneError(f"cannot read /proc/{pid} ({exc.strerror}); run as root") from None
    comm = _read(f"/proc/{pid}/comm").strip()
    env = [e for e in _read(f"/proc/{pid}/environ").split("\0") if "=" in e]
    nofile = None
    m = re.search(r"Max open files\s+(\d+)\s+(\d+)", _read(f"/proc/{pid}/limits"))
    if m:
        nofile = int(m.group(1))
    fdmap = fds(pid)
    inode_fd = {}
    for fd, link in fdmap.items():
        m = re.match(r"socket:\[(\d+)\]", link)
        if m:
            inode_fd[m.group(1)] = fd
    listeners = []
    connected = []
    for row in _tcp_table(pid):
        fd = inode_fd.get(row["inode"])
        if fd is None:
            continue
        if row["state"] == "0A":
            listeners.append(
                {"fd": fd, "port": row["port"], "family": row["family"], "addr": _addr(row["family"], row["addr_hex"])}
            )
        elif row["state"] == "01":
            connected.append(fd)
    kinds: dict[str, int] = {}
    for link in fdmap.values():
        k = fd_kind(link)
        kinds[k] = kinds.get(k, 0) + 1
    if not listeners:
        found = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no open files"
        raise CloneError(f"pid {pid} ({comm}) is not a network server: it has no listening TCP socket (found {found})")
    ths = threads(pid)
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    hz = os.sysconf("SC_CLK_TCK")
    age_s = uptime - min(t["start"] for t in ths) / hz if ths else 0.0
    epolls = {fd: epoll_watches(pid, fd) for fd, link in fdmap.items() if fd_kind(link) == "eventpoll"}
    primary = sorted(listeners, key=lambda x: (x["family"] != 4, x["port"]))[0]
    return {
        "pid": pid,
        "comm": comm,
        "exe": exe,
        "cwd": cwd,
        "cmdline": cmdline,
        "env": env,
        "nofile": nofile,
        "age_s": round(age_s, 1),
        "threads": ths,
        "fd_kinds": kinds,
        "fds": {str(k): fd_kind(v) for k, v in fdmap.items()},
        "listeners": listeners,
        "port": primary["port"],
        "listen_options": socket_options(pid, primary["fd"]) or {},
        "backlog": _backlog(pid, primary["port"]),
        "epolls": {str(k): v for k, v in epolls.items()},
        "connected_fds": connected,
        "rss_kb": _rss_kb(pid),
        "at": time.time(),
    }


def _rss_kb(pid: int) -> int:
    m = re.search(r"VmRSS:\s+(\d+)", _read(f"/proc/{pid}/status"))
    return int(m.group(1)) if m else 0


def conn_options(pid: int, listen_fds: set[int]) -> dict | None:
    """Options of one live connected socket of the target (call while load runs)."""
    inode_fd = {}
    for fd, link in fds(pid).items():
        m = re.match(r"socket:\[(\d+)\]", link)
        if m and fd not in listen_fds:
            inode_fd[m.group(1)] = fd
    for row in _tcp_table(pid):
        if row["state"] == "01" and row["inode"] in inode_fd:
            return socket_options(pid, inode_fd[row["inode"]])
    return None
