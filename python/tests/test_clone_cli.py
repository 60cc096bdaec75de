"""`tailscope clone` / `clone-report`: bad input is one line on stderr and a non-zero exit."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _run(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "tailscope", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _one_line_error(p, *needles):
    assert p.returncode != 0, p
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("[clone")]
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture
def sleeper():
    p = subprocess.Popen(["sleep", "60"])
    yield p.pid
    p.kill()
    p.wait()


def test_no_such_pid(tmp_path):
    _one_line_error(
        _run("clone", "-p", 2**22 + 12345, "--load", "--protocol redis", "-o", tmp_path / "c"), "no process with pid"
    )


def test_not_a_network_server(tmp_path, sleeper):
    if os.geteuid() != 0:
        pytest.skip("needs root to read another process's /proc entries")
    for tool in ("bpftrace", "perf", "valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    _one_line_error(
        _run("clone", "-p", sleeper, "--load", "--protocol redis", "-o", tmp_path / "c"),
        "is not a network server",
        "no listening TCP socket",
    )


@pytest.mark.parametrize("tool,package", [("valgrind", "valgrind"), ("perf", "linux-perf"), ("bpftrace", "bpftrace")])
def test_missing_tool_says_how_to_install(tmp_path, sleeper, tool, package):
    p = _run(
        "clone",
        "-p",
        sleeper,
        "--load",
        "--protocol redis",
        "-o",
        tmp_path / "c",
        env={f"TAILSCOPE_{tool.upper()}": "/nonexistent/" + tool},
    )
    _one_line_error(p, f"{tool} is missing", f"apt-get install {package}")


def test_bad_arguments(tmp_path, sleeper):
    _one_line_error(_run("clone", "-p", sleeper, "--load", "--protocol ftp", "-o", tmp_path / "c"), "protocol 'ftp'")
    _one_line_error(
        _run("clone", "-p", sleeper, "--load", "--protocol redis", "-o", tmp_path / "c", "--iterations", "11"),
        "--iterations 11",
    )
    _one_line_error(
        _run("clone", "-p", sleeper, "--load", "--protocol redis", "-o", tmp_path / "c", "--profile-windows", "41"),
        "--profile-windows 41",
        "between 1 and 40",
    )


def test_too_short_lived(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (eBPF)")
    for tool in ("bpftrace", "perf", "valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import socket,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                "s.bind(('127.0.0.1',0));s.listen();print('listening',flush=True);time.sleep(2.5)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # listening before the clone looks (a slow start on a loaded machine
        # must not turn this into "not a network server")
        assert server.stdout.readline().strip() == "listening"
        p = _run("clone", "-p", server.pid, "--load", "--protocol redis", "-o", tmp_path / "c", "--quiet")
    finally:
        server.kill()
        server.wait()
    _one_line_error(p)
    assert "too short-lived" in p.stderr or "no process with pid" in p.stderr, p.stderr


def test_clone_report_bad_dirs(tmp_path):
    _one_line_error(_run("clone-report", tmp_path, "--sim-windows", "1"), "--sim-windows 1", "between 2 and 40")
    _one_line_error(_run("clone-report", tmp_path / "nope"), "no such directory")
    _one_line_error(_run("clone-report", tmp_path), "no private/profile.json")
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "profile.json").write_text("{ not json")
    _one_line_error(_run("clone-report", tmp_path), "is corrupt")
    # (session 43, `errors.read_json`) bytes that are not text: the same one line, not a traceback
    (tmp_path / "private" / "profile.json").write_bytes(b'{"version": "\xff\xfe"}')
    _one_line_error(_run("clone-report", tmp_path), "is corrupt: not JSON", "not UTF-8")
    (tmp_path / "private" / "profile.json").write_text(json.dumps({"version": 99}))
    _one_line_error(_run("clone-report", tmp_path), "not a tailscope clone profile")
    (tmp_path / "private" / "profile.json").write_text(json.dumps({"version": 1, "network": {}}))
    _one_line_error(_run("clone-report", tmp_path), "is corrupt", "no 'threads' section")


def _bench_ditto():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "ditto" / "run.py"
    spec = importlib.util.spec_from_file_location("bench_ditto_run", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_ditto_times_file_errors_are_one_line(tmp_path, monkeypatch):
    """bench/ditto/run.py --stage report (and --also) read the pipeline stage's bench_times.json:
    a missing or non-numeric field is one line naming the file and the field (it was a KeyError
    with a traceback), and a complete file is read as it is."""
    run = _bench_ditto()
    priv = tmp_path / "memcached" / "private"
    priv.mkdir(parents=True)
    times = priv / "bench_times.json"
    cases = [
        (None, "no pipeline run in"),
        ("{ not json", "is corrupt: not JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({"pipeline_s": 400.0}), "field 'build_s' is missing"),
        (json.dumps({"pipeline_s": 400.0, "build_s": "fast"}), "field 'build_s' is not a time"),
    ]
    for text, needle in cases:
        if text is None:
            times.unlink(missing_ok=True)
        else:
            times.write_text(text)
        with pytest.raises(SystemExit) as exc:
            run.run_service("memcached", run.SERVICES["memcached"], tmp_path, quick=False, stage="report")
        msg = str(exc.value.code)
        assert needle in msg and "\n" not in msg, msg
        if text is not None:
            assert str(times) in msg, msg
    # --also: the validation's time is needed as well
    for k in ("profile", "tuning", "leakage", "validation"):
        (priv / f"{k}.json").write_text("{}")
    times.write_text(json.dumps({"pipeline_s": 400.0, "build_s": 0.4}))
    with pytest.raises(SystemExit) as exc:
        run.load_service("memcached", tmp_path)
    assert "field 'validate_s' is missing" in str(exc.value.code), exc.value.code
    times.write_text(json.dumps({"pipeline_s": 400.0, "build_s": 0.4, "validate_s": 300}))
    monkeypatch.setattr(run, "ROOT", tmp_path)  # the clone directory is named relative to the repo
    r = run.load_service("memcached", tmp_path)
    assert (r["pipeline_s"], r["build_s"], r["validate_s"]) == (400.0, 0.4, 300)


def test_bench_ditto_pipeline_replaces_the_last_run_only_once_it_is_complete(tmp_path, monkeypatch):
    """bench/ditto/run.py --stage pipeline (session 41) builds the new run beside the service's
    last complete one, and replaces it only when the new one is complete: a failed or stopped
    pipeline leaves the last run as it was (it had cleared it first), a complete one takes its
    place and leaves nothing beside it."""
    run = _bench_ditto()

    class Server:
        pid = 4242

        def terminate(self):
            pass

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(run.subprocess, "Popen", lambda *a, **k: Server())
    monkeypatch.setattr(run, "_wait_port", lambda port: None)
    makes = []
    monkeypatch.setattr(run.subprocess, "run", lambda cmd, **k: makes.append(cmd))
    last = tmp_path / "memcached"
    (last / "private").mkdir(parents=True)
    (last / "private" / "validation.json").write_text("{}")

    def clone(rc, complete):
        def child(cmd, **kw):
            out = Path(cmd[cmd.index("-o") + 1])
            assert out != last and not out.exists(), out
            (out / "private").mkdir(parents=True)
            if complete:
                (out / "clone").write_text("binary")
            return subprocess.CompletedProcess(cmd, rc, None, None)

        return child

    for rc, complete in ((1, False), (2, True), (143, False)):
        monkeypatch.setattr(run, "child", clone(rc, complete))
        with pytest.raises(SystemExit):
            run.run_service("memcached", run.SERVICES["memcached"], tmp_path, quick=True, stage="pipeline")
        assert (last / "private" / "validation.json").exists() and not (last / "clone").exists()
    assert makes == []
    monkeypatch.setattr(run, "child", clone(0, True))
    assert run.run_service("memcached", run.SERVICES["memcached"], tmp_path, quick=True, stage="pipeline") == {}
    assert (last / "clone").read_text() == "binary" and not (last / "private" / "validation.json").exists()
    times = json.loads((last / "private" / "bench_times.json").read_text())
    assert set(times) == {"pipeline_s", "build_s"}
    assert [p.name for p in tmp_path.iterdir()] == ["memcached"]
    assert [c[3] for c in makes] == [str(tmp_path / ".memcached.partial")] * 2
    # a new run that cannot take the last one's place: one line naming both, the last run kept
    new = tmp_path / ".memcached.partial"
    (new / "private").mkdir(parents=True)
    real = Path.rename

    def refuse(self, target):
        if self == new:
            raise OSError(13, "Permission denied")
        return real(self, target)

    monkeypatch.setattr(Path, "rename", refuse)
    with pytest.raises(SystemExit) as exc:
        run.replace_run(new, last)
    msg = str(exc.value)
    assert "\n" not in msg and str(new) in msg and "Permission denied" in msg and f"stays in {last}" in msg, msg
    assert (last / "clone").read_text() == "binary" and new.exists()
    assert not (tmp_path / ".memcached.old").exists()


def test_bench_ditto_results_stage_and_an_unknown_service(tmp_path, monkeypatch):
    """bench/ditto/run.py --stage results runs nothing and names each service's steps in the
    command it records; an unknown service is one line naming the known ones (it was a KeyError)."""
    import sys

    run = _bench_ditto()
    monkeypatch.setattr(run.os, "geteuid", lambda: 0)
    monkeypatch.setattr(run.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(sys, "argv", ["run.py", "--services", "memcached,nosuch", "--stage", "results"])
    with pytest.raises(SystemExit) as exc:
        run.main()
    msg = str(exc.value.code)
    assert "unknown service 'nosuch' (known: memcached, redis)" in msg and "\n" not in msg, msg
    # results of a service with no earlier run: the --also error, not a run
    monkeypatch.setattr(run, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["run.py", "--services", "memcached", "--stage", "results"])
    with pytest.raises(SystemExit) as exc:
        run.main()
    assert "no complete earlier run in" in str(exc.value.code), exc.value.code


def _sigterm_after_first_line(code: str):
    """Run `python -c code`, send it a SIGTERM once it has printed its first line, and wait:
    (that line, the process, its stdout after it, its stderr)."""
    import signal

    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        os.kill(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    return first, p, out, err


def test_sigterm_stops_what_the_command_started(tmp_path):
    """Session 33: `clone-report` killed with SIGTERM ended where it stood and left its valgrind
    copies and load generators running. SIGTERM now unwinds like Ctrl-C: the command's `finally`
    blocks run (here: a child it started is stopped), and it exits 143 with one line."""
    import time

    code = (
        "import subprocess, sys, time\n"
        "from tailscope import cli\n"
        "from tailscope.clone import cli as ccli\n"
        "def report(ns):\n"
        "    child = subprocess.Popen(['sleep', '600'])\n"
        "    print(child.pid, flush=True)\n"
        "    try:\n"
        "        time.sleep(60)\n"
        "    finally:\n"
        "        child.kill()\n"
        "        child.wait()\n"
        "    return 0\n"
        "ccli.cmd_clone_report = report\n"
        f"sys.exit(cli.main(['clone-report', {str(tmp_path)!r}]))\n"
    )
    first, p, _, err = _sigterm_after_first_line(code)
    child = int(first)
    assert p.returncode == 143, (p.returncode, err)
    assert err.strip() == "tailscope: terminated", err
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}"), "the command's child outlived its SIGTERM"


def test_bench_ditto_passes_a_sigterm_on_to_its_tailscope_command(tmp_path):
    """bench/ditto/run.py (session 34): a SIGTERM to the script goes on to the tailscope command it
    runs (which cleans up on its own SIGTERM, test above), and the script then exits 143 with one
    line. It used to die at once and leave that command running."""
    import time
    from pathlib import Path

    run_py = Path(__file__).resolve().parents[2] / "bench" / "ditto" / "run.py"
    mark = tmp_path / "child-got-sigterm"
    kid = (
        "import signal, sys, time\n"
        "def bye(*a):\n"
        f"    open({str(mark)!r}, 'w').write('x')\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    code = (
        "import importlib.util, signal, sys\n"
        f"spec = importlib.util.spec_from_file_location('r', {str(run_py)!r})\n"
        "r = importlib.util.module_from_spec(spec); spec.loader.exec_module(r)\n"
        "signal.signal(signal.SIGTERM, r._on_sigterm)\n"
        f"r.child([sys.executable, '-c', {kid!r}])\n"
        "print('child returned', flush=True)\n"
    )
    first, p, out, err = _sigterm_after_first_line(code)
    assert first.strip() == "ready", first
    assert p.returncode == 143, (p.returncode, err)
    assert err.strip() == "bench ditto: terminated" and "child returned" not in out, (out, err)
    deadline = time.monotonic() + 5
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.exists(), "the tailscope command never saw the SIGTERM"
