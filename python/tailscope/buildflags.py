"""Compiler and linker flags that build a program for `tailscope record --functions`.

`tailscope flags [cflags|ldflags|all]` prints them for build systems
(`CFLAGS="$(tailscope flags cflags)" LIBS="$(tailscope flags ldflags)" ./configure`), and
`tailscope-cc` is a compiler wrapper that adds them (`CC=tailscope-cc make`).

- `-finstrument-functions`: the compiler calls libtailscope's enter/exit hooks around every
  function; they keep the per-thread shadow stack the agent scans. Functions inlined into
  a caller are instrumented too (their hooks run in the caller's frame).
- `-finstrument-functions-exclude-file-list=/usr/include,...`: not system headers' inline
  functions (C++ containers would otherwise add hooks to every iterator step), plus any path
  fragments given.
- `-finstrument-functions-exclude-function-list=...`: named functions to leave alone (tiny,
  hot ones whose hooks would cost more than they tell).
- `-fno-omit-frame-pointer`: cheap, and lets `perf` and debuggers walk the same stacks.
- link: libtailscope.a (hooks, the pthread lock shim, the request API) and -pthread.

Environment: `TAILSCOPE_RUNTIME` overrides where the runtime's include/ and build/ are
(default: the repository's runtime/), and `TAILSCOPE_CC` the real compiler (default: cc).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

DEFAULT_EXCLUDED_FILES = ("/usr/include",)


class BuildFlagError(Exception):
    pass


def runtime_dir() -> Path:
    env = os.environ.get("TAILSCOPE_RUNTIME")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "runtime"


def _check_list(name: str, value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    for v in items:
        if any(c.isspace() for c in v):
            raise BuildFlagError(f"--{name}: {v!r} contains whitespace (use commas between entries)")
    return items


def cflags(exclude_files: str = "", exclude_functions: str = "") -> list[str]:
    rt = runtime_dir()
    files = list(DEFAULT_EXCLUDED_FILES) + _check_list("exclude-file-list", exclude_files)
    out = [
        "-finstrument-functions",
        f"-finstrument-functions-exclude-file-list={','.join(files)}",
        "-fno-omit-frame-pointer",
        f"-I{rt / 'include'}",
    ]
    funcs = _check_list("exclude-function-list", exclude_functions)
    if funcs:
        out.insert(2, f"-finstrument-functions-exclude-function-list={','.join(funcs)}")
    return out


def ldflags() -> list[str]:
    lib = runtime_dir() / "build" / "libtailscope.a"
    if not lib.is_file():
        raise BuildFlagError(f"{lib} not found; build the runtime first (make -C {runtime_dir()})")
    return [str(lib), "-pthread"]


def flags(what: str = "all", exclude_files: str = "", exclude_functions: str = "") -> str:
    parts: list[str] = []
    if what in ("cflags", "all"):
        parts += cflags(exclude_files, exclude_functions)
    if what in ("ldflags", "all"):
        parts += ldflags()
    return shlex.join(parts)


def _links(args: list[str]) -> bool:
    """Whether a compiler command line links (no -c, -S, -E, -M)."""
    return not any(a in ("-c", "-S", "-E", "-M", "-MM") for a in args)


def cc_main(argv: list[str] | None = None) -> int:
    """`tailscope-cc ARGS...`: the real compiler with the instrumentation flags added.
    TAILSCOPE_EXCLUDE_FILES / TAILSCOPE_EXCLUDE_FUNCTIONS give the exclusion lists."""
    args = list(sys.argv[1:] if argv is None else argv)
    cc = os.environ.get("TAILSCOPE_CC", "cc")
    try:
        extra = cflags(os.environ.get("TAILSCOPE_EXCLUDE_FILES", ""), os.environ.get("TAILSCOPE_EXCLUDE_FUNCTIONS", ""))
        tail = ldflags() if _links(args) and args else []
    except BuildFlagError as exc:
        print(f"tailscope-cc: error: {exc}", file=sys.stderr)
        return 1
    cmd = [cc, *extra, *args, *tail]
    try:
        os.execvp(cc, cmd)
    except OSError as exc:
        print(f"tailscope-cc: error: cannot run {cc}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 1  # not reached
