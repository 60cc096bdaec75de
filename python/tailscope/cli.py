"""`tailscope` command line: record (exec the agent) and report (analyse a recording).

Every error is one line on stderr and a non-zero exit; `--debug` shows the traceback.
Exit codes: 0 ok (an empty recording is ok), 1 bad input or failure, 2 usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
from pathlib import Path

USAGE_ERROR = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is (`terminate_gracefully`)."""


def _raise_terminated(signum, frame):
    raise Terminated()


def terminate_gracefully() -> None:
    """Make SIGTERM unwind like Ctrl-C: every `finally` and context manager runs, so the servers,
    valgrind copies, load generators and spinners a command started are stopped, and the command
    exits 143 with one line. Python's default SIGTERM ends the process where it stands (session
    33: a `clone-report` killed with SIGTERM left two valgrind copies and their load generators
    running)."""
    signal.signal(signal.SIGTERM, _raise_terminated)


class CliError(Exception):
    """An error for the user: its message is printed as one line."""


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent.parent


def find_agent() -> str:
    """$TAILSCOPE_AGENT, else <repo>/target/release/tailscope-agent, else tailscope-agent on PATH."""
    env = os.environ.get("TAILSCOPE_AGENT")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise CliError(f"TAILSCOPE_AGENT={env} is not an executable file")
        return env
    built = _repo_root() / "target" / "release" / "tailscope-agent"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    found = shutil.which("tailscope-agent")
    if found:
        return found
    raise CliError(
        f"tailscope-agent not found (looked at $TAILSCOPE_AGENT, {built}, and PATH); run `make` first to build it"
    )


def cmd_record(args: list[str]) -> int:
    agent = find_agent()
    argv = [agent, "record", *args]
    try:
        os.execv(agent, argv)
    except OSError as exc:
        raise CliError(f"cannot run {agent}: {exc.strerror or exc}") from exc
    return 1  # not reached


def cmd_report(ns: argparse.Namespace) -> int:
    # Imports here keep `tailscope record` fast and free of numpy/pyarrow.
    from tailscope.analysis.events import ANALYSIS_COLUMNS
    from tailscope.analysis.pipeline import analyse, parse_target
    from tailscope.recording import RecordingError, load_recording
    from tailscope.report.html import write_report
    from tailscope.report.text import terminal_summary, to_json

    try:
        p_target = parse_target(ns.target)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if ns.segment is not None and not ns.segment > 0:
        raise CliError(f"--segment {ns.segment}: must be a positive number of seconds")
    if ns.top < 1:
        raise CliError(f"--top {ns.top}: must be at least 1")
    try:
        rec = load_recording(ns.dir, list(ANALYSIS_COLUMNS))
    except RecordingError as exc:
        raise CliError(str(exc)) from None
    try:
        result = analyse(
            rec.columns,
            rec.meta,
            nulls=rec.nulls,
            kind_names=rec.kind_names,
            p_target=p_target,
            segment_s=ns.segment,
            kind=ns.kind,
            note=rec.note,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    result["recording"] = str(rec.path)
    result["ldb"] = _ldb_result(rec.path, p_target)
    out = Path(ns.out) if ns.out else rec.path / "report.html"
    report_path = None
    if not ns.no_html:
        try:
            write_report(result, out, top=max(ns.top, 10))
            report_path = str(out)
        except OSError as exc:
            raise CliError(f"cannot write {out}: {exc.strerror or exc}") from None
    result["report_path"] = report_path
    if ns.json:
        sys.stdout.write(to_json(result) + "\n")
    else:
        print(terminal_summary(result, report_path, top=ns.top))
        if result["ldb"]:
            from tailscope.analysis.ldb import summary_lines

            print("\n".join(summary_lines(result["ldb"], top=ns.top)))
    return 0


def _ldb_result(path: Path, p_target: float) -> dict | None:
    """The function-level analysis of a --functions recording (None for others)."""
    from tailscope.analysis.ldb import LdbError, analyse_ldb, has_ldb, load_ldb

    if not has_ldb(path):
        return None
    try:
        return analyse_ldb(load_ldb(path), p_target=p_target)
    except LdbError as exc:
        raise CliError(str(exc)) from None


def cmd_timeline(ns: argparse.Namespace) -> int:
    """Chrome/Perfetto trace JSON of one request, or of the N slowest."""
    import json

    from tailscope.analysis.ldb import LdbError, chrome_trace, find_request, load_ldb, slowest, timeline
    from tailscope.symbols import Symbolizer, modules_of

    if (ns.request is None) == (ns.slowest is None):
        raise CliError("give either --request ID or --slowest N")
    if ns.slowest is not None and ns.slowest < 1:
        raise CliError(f"--slowest {ns.slowest}: must be at least 1")
    try:
        d = load_ldb(ns.dir)
    except LdbError as exc:
        raise CliError(str(exc)) from None
    if ns.request is not None:
        sel = find_request(d, ns.request)
        if sel.size == 0:
            raise CliError(f"request {ns.request} is not in {ns.dir} (recorded requests: {d.req_id.size})")
    else:
        if d.req_id.size == 0:
            raise CliError(f"{ns.dir}: no recorded requests")
        sel = slowest(d, ns.slowest)
    tls = [timeline(d, int(i)) for i in sel]
    sym = Symbolizer(modules_of(d.meta))
    addrs = {e[k] for tl in tls for e in tl["events"] for k in ("fn", "caller") if e.get(k)}
    names = {a: s.name for a, s in sym.names(sorted(addrs)).items()}
    doc = chrome_trace(tls, d.pid, names)
    try:
        Path(ns.out).write_text(json.dumps(doc))
    except OSError as exc:
        raise CliError(f"cannot write {ns.out}: {exc.strerror or exc}") from None
    for w in sym.warnings:
        print(f"tailscope: warning: {w}", file=sys.stderr)
    print(
        f"{ns.out}: {len(doc['traceEvents'])} events from {len(tls)} request(s); open it in "
        f"https://ui.perfetto.dev or chrome://tracing"
    )
    return 0


def cmd_flags(ns: argparse.Namespace) -> int:
    from tailscope.buildflags import BuildFlagError, flags

    try:
        print(flags(ns.what, exclude_files=ns.exclude_file_list, exclude_functions=ns.exclude_function_list))
    except BuildFlagError as exc:
        raise CliError(str(exc)) from None
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tailscope", description="Why was that request slow?")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", metavar="{record,report,timeline,flags,clone,clone-report}")
    sub.add_parser("record", help="record a service (runs tailscope-agent; arguments pass through)", add_help=False)
    r = sub.add_parser("report", help="analyse a recording: terminal summary + DIR/report.html")
    r.add_argument("dir", metavar="DIR", help="recording directory (meta.json + requests/)")
    r.add_argument("--out", metavar="FILE.html", help="where to write the HTML report (default DIR/report.html)")
    r.add_argument("--json", action="store_true", help="print the ranked causes as JSON on stdout")
    r.add_argument("--target", default="p99", help="tail percentile: p99 (default), 0.99, 99.9")
    r.add_argument("--segment", type=float, metavar="SECONDS", help="segment length (default: automatic)")
    r.add_argument("--top", type=int, default=5, help="causes to show (default 5)")
    r.add_argument("--kind", help="analyse only requests of this kind (e.g. GET)")
    r.add_argument("--no-html", action="store_true", help="do not write the HTML report")
    r.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    t = sub.add_parser(
        "timeline",
        help="export request timelines (functions, lock holders) as Perfetto/Chrome "
        "trace JSON from a --functions recording",
    )
    t.add_argument("dir", metavar="DIR", help="recording directory made with --functions")
    t.add_argument("--request", type=int, metavar="ID", help="the request with this id")
    t.add_argument("--slowest", type=int, metavar="N", help="the N slowest requests")
    t.add_argument("-o", "--out", default="timeline.json", metavar="FILE.json", help="output (default timeline.json)")
    t.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    f = sub.add_parser("flags", help="compiler/linker flags that instrument a build for --functions")
    f.add_argument(
        "what", nargs="?", default="all", choices=["cflags", "ldflags", "all"], help="cflags, ldflags, or all (default)"
    )
    f.add_argument(
        "--exclude-file-list",
        default="",
        metavar="PATHS",
        help="comma-separated path fragments whose functions are not instrumented (added to the default /usr/include)",
    )
    f.add_argument(
        "--exclude-function-list",
        default="",
        metavar="NAMES",
        help="comma-separated function names not to instrument (hot, tiny functions)",
    )
    f.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    from tailscope.clone.cli import register as register_clone  # Ditto: clone, clone-report

    register_clone(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        # `record` passes everything after it to the agent untouched.
        if "record" in argv and all(a.startswith("-") for a in argv[: argv.index("record")]):
            return cmd_record(argv[argv.index("record") + 1 :])
        parser = build_parser()
        ns = parser.parse_args(argv)
        if ns.command == "report":
            return cmd_report(ns)
        if ns.command in ("clone", "clone-report"):
            from tailscope.clone.cli import dispatch

            return dispatch(ns)
        if ns.command == "timeline":
            return cmd_timeline(ns)
        if ns.command == "flags":
            return cmd_flags(ns)
        parser.print_usage(sys.stderr)
        print("tailscope: error: choose a command: record or report", file=sys.stderr)
        return USAGE_ERROR
    except CliError as exc:
        if debug:
            raise
        print(f"tailscope: error: {exc}", file=sys.stderr)
        return 1
    except Terminated:
        print("tailscope: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("tailscope: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except Exception as exc:  # the last resort: still one line
        if debug:
            raise
        first = (str(exc).splitlines() or [""])[0]
        print(f"tailscope: error: {type(exc).__name__}: {first} (rerun with --debug for details)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
