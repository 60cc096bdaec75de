"""Ditto clone: generator tests measured with real tools (valgrind, gcc), the parser, the leakage check.

- a generated branch with a target (p, r) measures within tolerance: p from callgrind's jump
  counts, r from the exact outcome sequence (lackey's superblock trace: a taken branch starts a
  superblock at its target);
- a generated working-set mix is recovered by the profiler's cache-size sweep;
- the leakage check passes a clean clone and catches a planted string, symbol and data block;
- generation is deterministic per seed, builds with plain gcc, and the clone serves the load.
"""

import copy
import itertools
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tailscope.clone import asmgen, callgrind, generate, isa, leakage, workingset
from tailscope.clone.errors import CloneError

needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="valgrind is not installed (apt-get install valgrind)"
)
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


def _traced(window):
    """A test's eBPF window, tried as the pipeline tries its own (profile.traced, up to
    trace.TRACE_TRIES times): bpftrace rarely hangs after the SIGINT that ends a window and prints
    no maps (sessions 23 and 36's CI), a failure of the trace, not of what the test checks."""
    from tailscope.clone import profile

    return profile.traced(window, "the test's trace window", lambda m: print(m, flush=True))


def _spec(**kw):
    base = dict(
        name="t",
        instructions=600,
        mix={"arith/reg": 0.6, "mov/reg": 0.4},
        cond_per_insn=0.15,
        branches=[[0.5, 0.1, 1]],
        dep_hist=[1] * 11,
        icode_bins=[(512, 1.0)],
        data_bins=[(0, 1.0)],
        mem_per_insn=0.0,
        main_fraction=0.0,
    )
    base.update(kw)
    return asmgen.BodySpec(**base)


def _body_range(binary: Path, name: str) -> tuple[int, int]:
    out = subprocess.run(["nm", "-S", str(binary)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] == f"clone_body_{name}":
            return int(parts[0], 16), int(parts[1], 16)
    raise AssertionError(f"clone_body_{name} not in {binary}")


@needs_valgrind
@needs_gcc
@pytest.mark.parametrize("p,r", [(0.5, 0.05), (0.3, 0.1), (0.8, 0.25)])
def test_generated_branch_measures_its_target(tmp_path, p, r):
    import capstone

    asmgen.write_standalone(_spec(branches=[[p, r, 1]]), tmp_path, seed=1, calls=400)
    exe = tmp_path / "harness"
    lo, size = _body_range(exe, "t")
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    code = isa.ElfImage(exe).read(lo, size)
    branches, loop_head = {}, None
    for ins in md.disasm(code, lo):
        if ins.mnemonic == "jb":  # the pattern branches (`bt reg, bit; jc target`)
            branches[int(ins.op_str, 16)] = ins.address
        if ins.mnemonic == "jne" and int(ins.op_str, 16) < ins.address:
            loop_head = int(ins.op_str, 16)
    assert branches and loop_head is not None
    # p: exact taken/executed counts from callgrind --collect-jumps
    cg_out = tmp_path / "cg.out"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--dump-instr=yes",
            "--collect-jumps=yes",
            f"--callgrind-out-file={cg_out}",
            str(exe),
            "400",
        ],
        check=True,
        capture_output=True,
    )
    tc = callgrind.parse(cg_out)
    taken = sum(tc.jcnd.get((str(exe), a), [0, 0])[0] for a in branches.values())
    executed = sum(c[tc.events.index("Ir")] for (obj, a), c in tc.instr.items() if a in branches.values())
    assert executed > 1000
    assert abs(taken / executed - p) <= 0.02, (taken / executed, p)
    # r: the outcome sequence from lackey's superblock trace (PIE base 0x108000 under valgrind)
    log = tmp_path / "sb.txt"
    subprocess.run(
        [
            "valgrind",
            "--tool=lackey",
            "--trace-superblocks=yes",
            "--vex-guest-chase=no",
            f"--log-file={log}",
            str(exe),
            "400",
        ],
        check=True,
        capture_output=True,
    )
    seq: dict[int, list[int]] = {t: [] for t in branches}
    cur = None
    for m in re.finditer(r"SB ([0-9a-f]+)", log.read_text()):
        addr = int(m.group(1), 16) - 0x108000
        if addr == loop_head:
            if cur is not None:
                for t in branches:
                    seq[t].append(1 if t in cur else 0)
            cur = set()
        elif cur is not None and addr in seq:
            cur.add(addr)
    n = sum(len(s) for s in seq.values())
    assert n > 1000
    p_seq = sum(sum(s) for s in seq.values()) / n
    r_seq = sum(sum(1 for i in range(1, len(s)) if s[i] != s[i - 1]) for s in seq.values()) / (n - len(seq))
    assert abs(p_seq - p) <= 0.02, (p_seq, p)
    # patterns quantise r to steps of 2/64; allow that plus 25%
    assert abs(r_seq - r) <= max(0.025, 0.25 * r), (r_seq, r)


def _sweep_bins(tmp_path, exe, calls, sizes):
    """The profiler's sweep on a harness: D1 hits per size -> workingset bins (per access)."""
    hits, refs = [], []
    for s in sizes:
        out = tmp_path / f"cg{s}.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--cache-sim=yes",
                f"--I1={workingset.cache_arg(s)}",
                f"--D1={workingset.cache_arg(s)}",
                "--LL=16777216,16,64",
                f"--callgrind-out-file={out}",
                str(exe),
                str(calls),
            ],
            check=True,
            capture_output=True,
        )
        sm = callgrind.parse(out, with_instr=False).summary
        dref = sm["Dr"] + sm["Dw"]
        refs.append(dref)
        hits.append(dref - sm["D1mr"] - sm["D1mw"])
    acc = float(np.mean(refs))
    return acc, dict(workingset.bins(sizes, [h / r * acc for h, r in zip(hits, refs, strict=True)], acc))


@needs_valgrind
@needs_gcc
def test_generated_working_set_mix_is_recovered(tmp_path):
    """Plant a data working-set mix over several sizes (a near bin walked inside the blocks, two
    bins beyond NEAR_MAX walked by walkers); the profiler's sweep finds each one in its bin and
    the whole miss curve follows the planted one."""
    planted = [(1024, 0.4), (65536, 0.35), (262144, 0.25)]
    spec = _spec(
        instructions=4000,
        mix={"arith/reg": 0.35, "mov/load": 0.25, "arith/load": 0.2, "mov/store": 0.2},
        cond_per_insn=0.0,
        branches=[],
        data_bins=planted,
        mem_per_insn=0.6,
        main_fraction=0.3,
        icode_bins=[(512, 1.0)],
    )
    asmgen.layer_walkers([spec], {})
    asmgen.write_standalone(spec, tmp_path, seed=2, calls=300)
    sizes = [2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288]
    _acc, bins = _sweep_bins(tmp_path, tmp_path / "harness", 300, sizes)
    # the near bin (walked inside the blocks) and the tiny region hit at 2 KiB already; what
    # misses at 16 KiB is the walkers' (the planted bins beyond NEAR_MAX)
    far = workingset.misses_at(list(bins.items()), 16384)
    mid = sum(bins[s] for s in (4096, 8192, 16384))
    assert mid <= 0.1 * far, bins  # nothing planted between 2 and 16 KiB
    # a walker's region is sized so that its reuse distance falls in its bin (S/2, S]
    got_64k = (bins[32768] + bins[65536]) / far
    got_256k = (bins[131072] + bins[262144] + bins[524288 * 2]) / far  # + misses at the largest size
    assert abs(got_64k - 0.35 / 0.6) <= 0.06, bins
    assert abs(got_256k - 0.25 / 0.6) <= 0.06, bins
    # the curve: the share of those accesses that miss at each swept size, as planted
    for size in (32768, 65536, 131072, 262144):
        want = sum(m for b, m in planted if b > size) / 0.6
        got = workingset.misses_at(list(bins.items()), size) / far
        assert abs(got - want) <= 0.10, (size, got, want, bins)


@needs_valgrind
@needs_gcc
def test_walkers_back_to_back_all_count(tmp_path):
    """Two walkers run back to back, each summing its loads into the same register: every load
    must reach the simulated cache (valgrind's JIT drops loads whose result is dead; before the
    walkers stored their sums, the first walker's 38 misses per event vanished)."""
    planted = [(131072, 0.48), (262144, 0.52)]
    spec = _loads_spec(planted, main_fraction=0.05, cold_bin=0)
    asmgen.layer_walkers([spec], {})
    asmgen.write_standalone(spec, tmp_path, seed=1, calls=300)
    tc = _cg_run(tmp_path, tmp_path / "harness", 300, "w", ("--cache-sim=yes", "--D1=32768,8,64", "--I1=32768,8,64"))
    want = 0.4 * 0.05 * 4000  # walker lines per event: all beyond a 32 KiB D1
    got = tc.fn_total("D1mr", "clone_far_t") / 300
    assert abs(got - want) <= 0.08 * want, (got, want)


@needs_valgrind
@needs_gcc
def test_fractional_walker_touches_its_region_only_for_new_lines(tmp_path):
    """A walker with fewer than one new line per event reads its region only in the events where a
    line is new (lackey's exact address trace). Up to session 7 it read the next line at every
    event, and that line was read again the next event: one access per walker and event at the
    distance of everything run between two events, in no bin of the profile (memcached's timer
    body missed a 32 KiB D1 on every walker at every event)."""
    spec = _spec(
        instructions=3000,
        mix={"arith/reg": 0.6, "mov/load": 0.4},
        cond_per_insn=0.0,
        branches=[],
        data_bins=[(262144, 1.0)],
        mem_per_insn=0.4,
        main_fraction=0.6 / (0.4 * 3000),  # 0.6 lines per event: two walkers of 0.3
        icode_bins=[(512, 1.0)],
    )
    asmgen.layer_walkers([spec], {})
    asmgen.write_standalone(spec, tmp_path, seed=3, calls=200)
    text = (tmp_path / "body.S").read_text()
    # each walker: from its cursor's load (`mov r13, [r15 + SLOT]`), the first `r13 + OFF]` is its
    # region's first line (whole = 0) and `cmp r13, LAST + 1` its last cursor (the region is
    # LAST + 64 bytes)
    regions = []
    for part in text.split("    mov r13, [r15 + ")[1:]:
        first, last = re.search(r"r13 \+ (\d+)\]", part), re.search(r"cmp r13, (\d+)", part)
        if first and last:
            regions.append((int(first.group(1)), int(last.group(1)) - 1 + 64))
    assert len(regions) == 2, text[-3000:]
    # the harness prints the arena's address; lackey prints every data access
    harness = (tmp_path / "harness.c").read_text()
    # (after the start-up touch of the arena, just before the calls: only the calls' accesses count)
    harness = harness.replace("#include <stdint.h>", "#include <stdint.h>\n#include <stdio.h>").replace(
        "\tfor (long i = 0; i < n; i++)",
        '\tfprintf(stderr, "arena %p\\n", (void *)st.data);\n\tfor (long i = 0; i < n; i++)',
    )
    (tmp_path / "harness.c").write_text(harness)
    subprocess.run(
        ["gcc", "-O1", "-o", str(tmp_path / "harness"), str(tmp_path / "harness.c"), str(tmp_path / "body.S")],
        check=True,
    )
    calls = 200
    p = subprocess.run(
        ["valgrind", "--tool=lackey", "--trace-mem=yes", str(tmp_path / "harness"), str(calls)],
        capture_output=True,
        text=True,
        check=True,
    )
    mark = re.search(r"arena (0x[0-9a-f]+)", p.stderr)
    base, trace = int(mark.group(1), 16), p.stderr[mark.end() :]
    for off, size in regions:
        lo, hi = base + off, base + off + size
        touched = []
        for m in re.finditer(r"^ ?[LSM] ([0-9a-f]+),", trace, re.M):
            a = int(m.group(1), 16)
            if lo <= a < hi:
                touched.append((a - lo) // 64)
        # 0.3 new lines per event (16.16 accumulator): ~60 in 200 events, each line once
        # (the region holds more lines than that), and no access that is not a new line
        want = 0.3 * calls
        assert abs(len(touched) - want) <= 2, (off, size, len(touched), want)
        assert len(set(touched)) == len(touched), (off, touched[:20])


def test_coupling_preserves_both_marginals():
    segs = asmgen.couple([(256, 0.7), (4096, 0.3)], [(0, 0.5), (8192, 0.25), (65536, 0.25)])
    assert abs(sum(m for m, _, _ in segs) - 1) < 1e-9
    for size, mass in ((256, 0.7), (4096, 0.3)):
        assert abs(sum(m for m, w, _ in segs if w == size) - mass) < 1e-9
    for size, mass in ((0, 0.5), (8192, 0.25), (65536, 0.25)):
        assert abs(sum(m for m, _, r in segs if r == size) - mass) < 1e-9


def test_workingset_bins_formula():
    # H(S) = 10, 30, 60, 60 at 128..1024 with 100 accesses: N = 10, 20, 30, 0 and 40 beyond
    b = workingset.bins([128, 256, 512, 1024], [10, 30, 60, 60], 100)
    assert b == [(128, 10), (256, 20), (512, 30), (1024, 0), (2048, 40)]
    assert workingset.misses_at(b, 256) == 70


def test_callgrind_parser_self_costs_and_branches(tmp_path):
    f = tmp_path / "cg.out"
    f.write_text("""# callgrind format
version: 1
positions: instr line
events: Ir Bc Bcm
ob=(1) /bin/x
fn=(1) f
0x10 0 5
+2 0 5 5 1
jcnd=3/5 +8 0
* 0
+2 0 5
cfn=(2) g
calls=5 0x40 0
* 0 100
+5 0 2
summary: 17 5 1
""")
    tc = callgrind.parse(f)
    assert tc.instr[("/bin/x", 0x10)] == [5, 0, 0]
    assert tc.instr[("/bin/x", 0x12)] == [5, 5, 1]
    assert tc.jcnd[("/bin/x", 0x12)] == [3, 5]
    assert tc.instr[("/bin/x", 0x14)] == [5, 0, 0]  # the call's inclusive 100 is not a self cost
    assert tc.instr[("/bin/x", 0x19)] == [2, 0, 0]
    # per-function self costs (what the tuning loop splits body from skeleton with)
    assert tc.fn_self["f"] == [17, 5, 1]
    assert tc.fn_total("Ir", "f") == 17 and tc.fn_total("Bcm", "g") == 0
    bad = tmp_path / "bad.out"
    bad.write_text("events: Ir\nfn=(1) f\n0x10 zz\n")
    with pytest.raises(CloneError, match="corrupt"):
        callgrind.parse(bad)
    with pytest.raises(CloneError, match="not a callgrind"):
        (tmp_path / "x").write_text("hello\n")
        callgrind.parse(tmp_path / "x")


def test_a_thread_idle_through_the_window_costs_nothing(tmp_path):
    """callgrind.parse (session 47): a dump whose summary: counts no instruction is a thread that
    did not run in it; its cost lines (and totals:) are its last block before it blocked, from
    before the window, and are left out. A thread that ran keeps its totals:, which count the
    jumps through the PLT that summary: leaves out."""
    head = "# callgrind format\nversion: 1\npositions: line\nevents: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n"
    idle = tmp_path / "cg.1-02"
    idle.write_text(
        head + "summary: 0\n\nob=(1) /x\nfn=(1) bg_main\n0 5 3 2 2 0 1 0 0 1\n\ntotals: 5 3 2 2 0 1 0 0 1\n"
    )
    tc = callgrind.parse(idle)
    assert tc.total("Ir") == 0 and tc.total("DLmw") == 0 and tc.fn_self == {}
    ran = tmp_path / "cg.1-01"
    ran.write_text(
        head + "summary: 90 9 0 0 0 0 0 0 0\n\nob=(1) /x\nfn=(1) f\n0 100 10 0 0 0 0 1\n\ntotals: 100 10 0 0 0 0 1\n"
    )
    tc = callgrind.parse(ran)
    assert tc.total("Ir") == 100 and tc.total("ILmr") == 1 and tc.fn_self["f"][0] == 100


@needs_valgrind
@needs_gcc
def test_callgrind_windows_leave_out_what_idle_threads_ran_before_them(tmp_path):
    """The real case behind the test above: a thread blocked in pause() since start-up and a
    thread that works once per byte on a pipe, zeroed (callgrind_control -z), one byte, dumped
    (-d). The idle thread's dump counts nothing; the worker's counts its one loop."""
    src = tmp_path / "idle.c"
    src.write_text(
        """#include <pthread.h>
#include <unistd.h>
static void *idle(void *a) { for (;;) pause(); return a; }
int main(void) {
	pthread_t t;
	pthread_create(&t, 0, idle, 0);
	char b;
	while (read(0, &b, 1) == 1) {
		long n = 1000000;
		__asm__ volatile("1: dec %0\\n jnz 1b" : "+r"(n));
		write(1, &b, 1);
	}
	return 0;
}
"""
    )
    exe = tmp_path / "idle"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src), "-lpthread"], check=True)
    prefix = tmp_path / "w.cg"
    p = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--separate-threads=yes",
            "--cache-sim=yes",
            f"--callgrind-out-file={prefix}",
            str(exe),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        p.stdin.write(b"x")  # a first loop: both threads are up and the worker waits again
        p.stdin.flush()
        assert p.stdout.read(1) == b"x"
        time.sleep(0.5)
        subprocess.run(["callgrind_control", "-z", str(p.pid)], check=True, capture_output=True, timeout=60)
        p.stdin.write(b"y")
        p.stdin.flush()
        assert p.stdout.read(1) == b"y"
        subprocess.run(["callgrind_control", "-d", str(p.pid)], check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while len(callgrind.dumps(prefix)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        p.kill()
        p.wait()
    files = callgrind.dumps(prefix)
    assert [f.name[-2:] for f in files] == ["01", "02"], files
    worker, idle = (callgrind.parse(f, with_instr=False) for f in files)
    assert 2_000_000 <= worker.total("Ir") < 2_100_000, worker.summary
    assert idle.total("Ir") == 0 and idle.total("DLmw") == 0 and idle.total("D1mw") == 0, idle.summary


def test_classify_instructions():
    import capstone

    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    cases = {
        b"\x48\x8b\x07": ("mov", "load"),
        b"\x48\x89\x07": ("mov", "store"),
        b"\x48\x01\xd8": ("arith", "reg"),
        b"\x48\x01\x07": ("arith", "rmw"),
        b"\xf0\x48\x01\x07": ("lock", "rmw"),
        b"\xf3\xa4": ("rep", "rmw"),
        b"\x48\x0f\xaf\xc3": ("mul", "reg"),
        b"\x48\xf7\xf3": ("div", "reg"),
        b"\xf2\x0f\x58\xc1": ("fp", "reg"),
        b"\x66\x0f\xfe\xc1": ("simd", "reg"),
        b"\x74\x05": ("branch", "reg"),
        b"\xc3": ("branch", "load"),
    }
    for code, want in cases.items():
        ins = next(md.disasm(code, 0x1000))
        assert isa.classify(ins) == want, (ins.mnemonic, ins.op_str)


def _cg_run(tmp_path, exe, calls, tag, extra=()):
    out = tmp_path / f"{tag}.out"
    subprocess.run(
        ["valgrind", "--tool=callgrind", *extra, f"--callgrind-out-file={out}", str(exe), str(calls)],
        check=True,
        capture_output=True,
    )
    return callgrind.parse(out, with_instr=False)


@needs_valgrind
@needs_gcc
@pytest.mark.parametrize("instructions,chunk", [(20000, 0), (8000, 5), (12000, 7)])
def test_generated_instructions_per_event_are_exact(tmp_path, instructions, chunk):
    """The generator counts every instruction it emits (setup, loop control, rep, call+ret, taken
    branches' skips, the far function): callgrind's count per event is the spec's within 1%
    (when the spec asks for at least one pass over every block)."""
    spec = _spec(
        instructions=instructions,
        mix={
            "arith/reg": 0.4,
            "mov/load": 0.2,
            "mov/store": 0.1,
            "rep/rmw": 0.01,
            "branch/load": 0.05,
            "div/reg": 0.01,
            "mov/reg": 0.23,
        },
        chunk_insns=chunk,
        icode_bins=[(256, 0.3), (4096, 0.4), (16384, 0.3)],
        data_bins=[(0, 0.5), (8192, 0.3), (65536, 0.2)],
        mem_per_insn=0.4,
        main_fraction=0.5,
    )
    calls = 400
    asmgen.write_standalone(spec, tmp_path, seed=3, calls=calls)
    tc = _cg_run(tmp_path, tmp_path / "harness", calls, "ir")
    got = sum(tc.fn_total("Ir", f"clone_{f}_t") for f in ("body", "far", "fill")) / calls
    assert abs(got - spec.expected) <= 0.01 * spec.expected, (got, spec.expected)
    if chunk:  # cache-line chunks (what clones use): whole passes plus the filler hit the target
        assert abs(got - instructions) <= 0.01 * instructions, (got, spec.expected, instructions)
    else:  # straight-line blocks of fixed size: within half a block's pass of the target
        assert abs(got - instructions) <= 0.1 * instructions, (got, spec.expected, instructions)


@needs_valgrind
@needs_gcc
def test_the_filler_is_exact_branch_free_and_of_one_size(tmp_path):
    """The filler (session 45) runs as many instructions as `fill` straight additions and a ret,
    with no conditional branch (the validation's branch row), from code whose size does not move
    with `fill`: straight, a ring step that moved one pass of a block into it added that pass's
    lines to every event's code (redis's I1 misses per request +20%)."""
    fills = [1, 7, 8, 9, 23, 24, 25, 27, 28, 29, 161, 250, 4096]
    asm = ["    .intel_syntax noprefix", "    .text"]
    for f in fills:
        regs = asmgen._Regs(np.random.default_rng(f), [1.0] * len(isa.DEP_BINS))
        asm += [f"    .globl fill_{f}_x", *asmgen.filler_function(f"fill_{f}_x", f, regs)]
    (tmp_path / "fill.S").write_text("\n".join(asm) + "\n")
    calls = 200
    main = "".join(f"void fill_{f}_x(void);\n" for f in fills)
    each = " ".join(f"fill_{f}_x();" for f in fills)
    main += f"int main(void) {{ for (int i = 0; i < {calls}; i++) {{ {each} }} return 0; }}\n"
    (tmp_path / "main.c").write_text(main)
    exe = tmp_path / "fill"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(tmp_path / "main.c"), str(tmp_path / "fill.S")], check=True)
    tc = _cg_run(tmp_path, exe, calls, "fill", ("--branch-sim=yes",))
    sizes = {}
    nm = subprocess.run(["nm", "-S", str(exe)], check=True, capture_output=True, text=True).stdout
    for ln in nm.splitlines():
        parts = ln.split()
        if len(parts) == 4 and parts[3].startswith("fill_"):
            sizes[int(parts[3][5:-2])] = int(parts[1], 16)
    assert tc.fn_total("Bc", "main") >= calls  # (main's loop: the branches are counted)
    for f in fills:
        assert tc.fn_total("Ir", f"fill_{f}_x") == calls * (f + 1), f
        assert tc.fn_total("Bc", f"fill_{f}_x") == 0, f
    looped = [sizes[f] for f in fills if f >= asmgen.FILL_LOOP_MIN]
    # (an entry of up to 3 additions, the alignment before the loop's line, the line)
    assert max(looped) <= 3 * 64, sizes
    assert sizes[4096] <= sizes[250] + 16, sizes


@needs_valgrind
@needs_gcc
@pytest.mark.parametrize("rate,iters,width", [(0.25, 3000, 1), (2.5, 80, 8)])
def test_rep_unit_round_trip(tmp_path, rate, iters, width):
    """The rep unit (session 12): a body asked for `rate` rep string executions per event of
    `iters` iterations makes them (callgrind: n + 1 instructions per execution of n, n writes),
    its instruction count stays exact, and the profiler's analysis recovers the executions and
    the length and keeps them out of the branch table (redis's 6,000-iteration memset 0.24 times
    per request was drawn as 32-iteration reps in the hot loop)."""
    spec = _spec(
        instructions=6000 + rate * (iters + 1),
        mix={"arith/reg": 0.5, "mov/load": 0.2, "mov/reg": 0.3},
        chunk_insns=5,
        rep_per_event=rate,
        rep_iters=iters,
        rep_width=width,
    )
    calls = 400
    asmgen.write_standalone(spec, tmp_path, seed=3, calls=calls)
    # (body_spec zeroes the mix's rep classes when a profile body has the unit)
    prof = generate.neutral_profile()
    prof["body"]["0"]["mix"] = {"arith/reg": 0.5, "rep/store": 0.2, "mov/reg": 0.3}
    prof["body"]["0"]["rep"] = {"executions_per_event": rate, "instructions_per_event": rate * (iters + 1)}
    sp = generate.body_spec("t", prof["body"]["0"], None)
    assert sp.mix["rep/store"] == 0 and abs(sum(sp.mix.values()) - 1) < 1e-9 and sp.rep_iters == iters
    text = (tmp_path / "body.S").read_text() if (tmp_path / "body.S").exists() else ""
    out = tmp_path / "cg.out"
    vg = ["valgrind", "--tool=callgrind", "--cache-sim=yes", "--branch-sim=yes", "--dump-instr=yes"]
    subprocess.run(
        [*vg, "--collect-jumps=yes", f"--callgrind-out-file={out}", str(tmp_path / "harness"), str(calls)],
        check=True,
        capture_output=True,
    )
    tc = callgrind.parse(out)
    got = sum(tc.fn_total("Ir", f"clone_{f}_t") for f in ("body", "far", "rep", "fill")) / calls
    assert abs(got - spec.expected) <= 0.01 * spec.expected, (got, spec.expected, text[:200])
    dw = tc.fn_total("Dw", "clone_rep_t") / calls
    assert abs(dw - rate * iters) <= 0.03 * rate * iters + 6, (dw, rate * iters)
    rep = isa.analyse([tc])["rep"]
    execs = rep["executions"] / calls
    assert abs(execs - rate) <= 0.05 * rate + 0.01, rep
    assert abs((rep["instructions"] - rep["executions"]) / rep["executions"] - iters) <= 0.05 * iters, rep
    assert abs(rep["bytes"] / max(1, rep["instructions"] - rep["executions"]) - width) < 0.05 * width, rep
    # not in the branch table: the table's branches and the rep's are callgrind's Bc apart
    a = isa.analyse([tc])
    # (within the few of code the analysis cannot decode)
    both = a["cond_branches"] + rep["cond_branches"]
    assert abs(both - tc.total("Bc")) <= 0.001 * tc.total("Bc"), (a["cond_branches"], rep, tc.total("Bc"))
    assert rep["cond_branches"] >= rate * iters * calls


def test_a_cold_reps_lines_are_taken_out_of_the_walkers_bins():
    """generate.take_rep_lines (session 16): a cold rep's lines are in the sweep's bins beyond the
    profiled D1 and the rep unit makes their misses itself, so they leave the walkers' bins:
    nearest first to where the clone's rep lines come back (2 x REP_COLD_SPAN), the cold bin last,
    nothing at or under the D1. redis's worker: 0.245 memsets of 6,076 bytes per request, 99.8%
    missed, 23.3 lines per request (its clone's rep unit missed 23.3 per request at A and B, and
    the walkers made them again)."""
    bins = [[128, 100.0], [16384, 50.0], [32768, 9.0], [65536, 10.0], [131072, 30.0], [262144, 20.0]]
    bins += [[524288, 5.0], [1 << 26, 1.0]]
    assert 2 * asmgen.REP_COLD_SPAN == 262144
    out = generate.take_rep_lines(bins, 40.0)
    assert [n for _, n in out] == [100, 50, 9, 10, 10, 0, 5, 1]  # 20 from 256 KiB, then 128 KiB
    assert bins[5][1] == 20.0  # the input is not changed
    out = generate.take_rep_lines(bins, 70.0)  # 256, 128 and 512 KiB, then 64 KiB, then the cold bin
    assert [n for _, n in out] == [100, 50, 9, 0, 0, 0, 0, 0]
    assert generate.take_rep_lines(bins, 0.0) == bins
    # the lines: executions x lines per execution x the original's miss share
    rep = {"executions_per_event": 0.2452, "instructions_per_event": 0.2452 * 6077, "bytes_per_execution": 6076}
    rep["d1_miss_fraction"] = 0.998
    lines = generate.rep_lines_per_event(generate._body_rep({"rep": rep}, None), 0.998)
    assert lines == pytest.approx(0.2452 * 95 * 0.998)
    # body_spec: a cold rep's lines leave the walkers' bins; a warm rep's stay (they hit the D1)
    body = generate.neutral_profile()["body"]["0"] | {"rep": rep, "I_bins": [[128, 1900.0], [4096, 100.0]]}
    body["D_bins"] = [[128, 500.0], [16384, 200.0], [262144, 80.0], [1 << 26, 20.0]]
    cold = generate.body_spec("w", body, None)
    body["rep"] = rep | {"d1_miss_fraction": 0.1}
    warm = generate.body_spec("w", body, None)
    mass = {s: m for s, m in warm.data_bins}
    assert warm.main_fraction * 800 == pytest.approx(300.0)  # 200 + 80 + 20 of 800 references
    assert cold.main_fraction * 800 == pytest.approx(300.0 - lines)
    assert dict(cold.data_bins)[262144] * cold.main_fraction * 800 == pytest.approx(80.0 - lines)
    assert dict(cold.data_bins)[16384] * cold.main_fraction * 800 == pytest.approx(mass[16384] * 300.0)


@needs_valgrind
@needs_gcc
def test_cold_rep_unit_misses_the_d1_at_both_sizes(tmp_path):
    """A rep whose lines missed the profiled D1 in the original (redis's memset: all ~150 lines,
    every time, at A and B alike) rotates over regions that fill REP_COLD_SPAN: its lines miss a
    32 KiB and a 48 KiB D1; one region, as before, hits both. Instruction count exact either way."""
    got = {}
    for cold in (False, True):
        spec = _spec(instructions=4000, chunk_insns=5, rep_per_event=1.5, rep_iters=4096, rep_width=1, rep_cold=cold)
        d = tmp_path / f"c{int(cold)}"
        asmgen.write_standalone(spec, d, seed=3, calls=300)
        for d1 in ("32768,8,64", "49152,12,64"):
            tc = _cg_run(d, d / "harness", 300, f"d1{d1[:2]}", ("--cache-sim=yes", f"--D1={d1}"))
            ir = sum(tc.fn_total("Ir", f"clone_{f}_t") for f in ("body", "far", "rep", "fill")) / 300
            assert abs(ir - spec.expected) <= 0.01 * spec.expected, (cold, ir, spec.expected)
            got[cold, d1] = tc.fn_total("D1mw", "clone_rep_t") / (300 * 1.5 * 64)  # per line written
    assert all(got[True, d1] > 0.9 for d1 in ("32768,8,64", "49152,12,64")), got
    assert all(got[False, d1] < 0.2 for d1 in ("32768,8,64", "49152,12,64")), got
    # a rare cold rep keeps one region: rotated, its lines would come back from beyond the LL
    rare = _spec(instructions=4000, rep_per_event=0.0025, rep_iters=1104, rep_cold=True, events_per_request=3.0)
    assert asmgen._rep_layout(rare) == (1152, 1)
    often = _spec(instructions=4000, rep_per_event=0.25, rep_iters=6000, rep_cold=True)
    assert asmgen._rep_layout(often) == (6016, 22)  # 128 KiB of regions, each back within ~88 requests


def test_body_rep_from_profile_and_skeleton():
    """generate._body_rep: the rep unit of a body is the original's rep string work less the
    skeleton's; old profiles have none; a near-cancellation of executions keeps the original's
    mean length (not one huge rep); corrupt entries are a one-line error."""

    def rep(ex, iters, width=1):
        ins = ex * (iters + 1)
        return {"executions_per_event": ex, "instructions_per_event": ins, "bytes_per_execution": iters * width}

    assert generate._body_rep({}, None) == (0.0, 0, 1)
    assert generate._body_rep({"rep": rep(0.25, 3000)}, None) == (0.25, 3000, 1)
    assert generate._body_rep({"rep": rep(2.0, 80, 8)}, None) == (2.0, 80, 8)
    # the skeleton's one 40-iteration copy per event comes off: 1 execution of 3000 iterations is left
    both = {"executions_per_event": 2.0, "instructions_per_event": 3001 + 41, "bytes_per_execution": 1520}
    ex, iters, _ = generate._body_rep({"rep": both}, {"rep": rep(1.0, 40)})
    assert ex == 1.0 and iters == 3000
    # the skeleton makes (almost) all the executions: the original's mean length, not a giant rep
    ex, iters, _ = generate._body_rep({"rep": rep(10.0, 100)}, {"rep": rep(9.9998, 10)})
    assert iters == 100 and abs(ex * iters - (10 * 100 - 9.9998 * 10)) < 1
    assert generate._body_rep({"rep": rep(1.0, 10)}, {"rep": rep(1.0, 20)}) == (0.0, 0, 1)  # nothing left
    # huge requests are capped (executions unrolled, bytes of one region)
    ex, iters, width = generate._body_rep({"rep": rep(1000.0, 10)}, None)
    assert ex == generate.REP_MAX_EXECUTIONS and iters * width <= generate.REP_MAX_BYTES
    ex, iters, width = generate._body_rep({"rep": rep(1.0, 1 << 30)}, None)
    assert iters * width <= generate.REP_MAX_BYTES
    # the cold flag (its lines missed the profiled D1) reaches the spec
    body = {"rep": rep(0.25, 3000) | {"d1_miss_fraction": 0.97}, "instructions_per_event": 8000, "mix": {}}
    assert generate.body_spec("w", body, None).rep_cold
    body["rep"]["d1_miss_fraction"] = 0.1
    assert not generate.body_spec("w", body, None).rep_cold
    for bad in ("x", [1], {"executions_per_event": "a"}, {"executions_per_event": float("nan")}, rep(-1.0, 5)):
        with pytest.raises(CloneError, match="corrupt profile"):
            generate._body_rep({"rep": bad}, None)
    with pytest.raises(CloneError, match="skeleton rep"):
        generate._body_rep({"rep": rep(1.0, 5)}, {"rep": {"executions_per_event": True}})


@needs_valgrind
@needs_gcc
def test_code_rings_beyond_the_i1_miss_linearly_in_their_knob(tmp_path):
    """A code working-set bin beyond the profiled I1 is a ring of variants called in turn, one
    line entry per cache line: every line misses a 32 KiB I1, and the ring's lines per event
    (so its misses) are linear in icode_far_scale."""
    spec = _spec(instructions=3000, chunk_insns=5, icode_bins=[(2048, 0.7), (131072, 0.3)])
    want = 0.3 * 3000 / 5  # ring line entries per event
    misses = []
    for scale in (1.0, 2.0):
        d = tmp_path / f"s{scale}"
        asmgen.write_standalone(spec, d, seed=4, calls=600, knobs={"icode_far_scale": scale})
        tc = _cg_run(d, d / "harness", 600, "i1", ("--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64"))
        misses.append(tc.fn_total("I1mr", "clone_far_t") / 600)
    assert abs(misses[0] - want) <= 0.15 * want, misses
    assert abs(misses[1] / misses[0] - 2.0) <= 0.15, misses


@needs_valgrind
@needs_gcc
def test_cold_code_ring_misses_every_ll(tmp_path):
    """Code fetched for the first time (the sweep's fetches that miss at every size) is the cold
    ring: each of its calls fetches a line the run never fetched before, so its LL misses per
    event are its calls per event, the same at a 2 MiB and an 8 MiB LL (without it, the clone's
    code all hit the LL: no instruction-side LL misses at all)."""
    spec = _spec(instructions=3000, chunk_insns=5, icode_bins=[(2048, 1.0)], cold_code_lines=0.25)
    asmgen.write_standalone(spec, tmp_path, seed=5, calls=800)
    got, table = [], []
    for ll in (2 << 20, 8 << 20):
        tc = _cg_run(tmp_path, tmp_path / "harness", 800, f"ll{ll}", ("--cache-sim=yes", f"--LL={ll},16,64"))
        got.append(tc.fn_total("ILmr", "clone_far_t") / 800)
        table.append(tc.fn_total("DLmr", "clone_far_t"))
    assert all(abs(g - 0.25) <= 0.02 for g in got), got
    # its table of variants is data, read at start-up (ring_warm, session 24): its 200 calls read
    # ~13 lines of it, which missed any LL unwarmed (the harness's warm call taken out)
    assert table == [0, 0], table
    harness = (tmp_path / "harness.c").read_text()
    cold = tmp_path / "unwarmed"
    cold.mkdir()
    (cold / "harness.c").write_text(harness.replace("if (clone_ring_warm_t) clone_ring_warm_t(st.data);", ""))
    subprocess.run(["gcc", "-O1", "-o", str(cold / "h"), str(cold / "harness.c"), str(tmp_path / "body.S")], check=True)
    tc = _cg_run(tmp_path, cold / "h", 800, "unwarmed", ("--cache-sim=yes", "--LL=8388608,16,64"))
    assert 10 <= tc.fn_total("DLmr", "clone_far_t") <= 16, tc.fn_total("DLmr", "clone_far_t")
    # cold_code_scale (session 22, tuned where the clone has no code rings): the calls, and so the
    # misses at every LL, scale with it
    asmgen.write_standalone(spec, tmp_path / "k", seed=5, calls=800, knobs={"cold_code_scale": 1.6})
    tc = _cg_run(tmp_path, tmp_path / "k" / "harness", 800, "k", ("--cache-sim=yes", "--LL=8388608,16,64"))
    assert abs(tc.fn_total("ILmr", "clone_far_t") / 800 - 0.4) <= 0.03
    # and without cold code there is none
    asmgen.write_standalone(_spec(instructions=3000, chunk_insns=5, icode_bins=[(2048, 1.0)]), tmp_path / "n", 5, 800)
    tc = _cg_run(tmp_path, tmp_path / "n" / "harness", 800, "none", ("--cache-sim=yes",))
    assert tc.fn_total("ILmr", "clone_far_t") / 800 < 0.01


@needs_valgrind
@needs_gcc
def test_a_slow_code_ring_is_warm_at_a_large_ll_from_its_first_call(tmp_path):
    """asmgen.ring_warm (session 21): a ring beyond the I1 called too rarely to go round in a run
    would fetch each variant for the first time in the window, missing every LL. Warmed at
    start-up (the harness calls clone_ring_warm_t, as the skeleton's clone_warm does), its calls
    in the body miss a 32 KiB I1 as before but hit an 8 MiB LL; the same build without the warm
    call misses that LL on every line."""
    # 6 lines per event in a ring of ~240 variants: 100 events never come back to one
    spec = _spec(instructions=3000, chunk_insns=5, icode_bins=[(2048, 0.99), (131072, 0.01)])
    calls = 100
    asmgen.write_standalone(spec, tmp_path, seed=9, calls=calls)
    harness = (tmp_path / "harness.c").read_text()
    assert "clone_ring_warm_t(st.data)" in harness and "clone_ring_warm_t:" in (tmp_path / "body.S").read_text()
    cold = tmp_path / "cold"
    cold.mkdir()
    (cold / "harness.c").write_text(harness.replace("if (clone_ring_warm_t) clone_ring_warm_t(st.data);", ""))
    subprocess.run(
        ["gcc", "-O1", "-o", str(cold / "harness"), str(cold / "harness.c"), str(tmp_path / "body.S")], check=True
    )
    opts = ("--cache-sim=yes", "--I1=32768,8,64", "--LL=8388608,16,64", "--toggle-collect=clone_body_t")
    got = {}
    for tag, exe in (("warm", tmp_path / "harness"), ("cold", cold / "harness")):
        tc = _cg_run(tmp_path, exe, calls, tag, opts)
        got[tag] = (tc.fn_total("I1mr", "clone_far_t") / calls, tc.fn_total("ILmr", "clone_far_t") / calls)
    lines = 0.01 * 3000 / 5  # the ring's lines per event
    assert abs(got["warm"][0] - lines) <= 0.2 * lines, got  # beyond the I1 either way
    assert abs(got["cold"][0] - lines) <= 0.2 * lines, got
    assert got["cold"][1] >= 0.8 * lines, got  # unwarmed: first fetches, out of any LL
    assert got["warm"][1] <= 0.05 * lines, got


def test_cold_code_window_request_count_is_checked(tmp_path):
    """The cold code ring's calls per event come from a count per run (`I_cold`, over the cold
    window's `cold_requests`): they are rescaled to the window's requests, and a profile without
    the count, or with a cold window of another length, is a one-line error, not a silent fit."""
    prof = generate.neutral_profile(icode_bins=[(512, 0.5), (65536, 0.5)], data_bins=[(0, 1.0)])
    prof["valgrind"]["requests"] = 1000
    body = prof["body"]["0"]
    body["I_cold"] = 0.2

    def cold_calls(p):
        meta_dir = tmp_path / f"g{len(list(tmp_path.iterdir()))}"
        generate.generate(p, meta_dir, seed=1)
        text = (meta_dir / "body.S").read_text()
        # the cold ring's 16.16 rate: `add r12, N` right after its slot's load (its table has 4096 entries)
        m = re.search(r"add r12, (\d+)\n(?:.*\n){5,10}?.*cmp rax, 4096", text)
        assert m, text[:2000]
        return int(m.group(1)) / 65536

    with pytest.raises(CloneError, match="no cold_requests count"):
        generate.generate(prof, tmp_path / "x", seed=1)
    body["cold_requests"] = 1000
    full = cold_calls(prof)
    assert abs(full - 0.2) < 1e-3, full
    body["cold_requests"] = 800  # the same count per run over fewer requests: fewer per event here
    assert abs(cold_calls(prof) - 0.2 * 0.8) < 1e-3
    body["cold_requests"] = 300
    with pytest.raises(CloneError, match="counted over 300 requests and the window has 1000"):
        generate.generate(prof, tmp_path / "y", seed=1)


def test_arenas_are_touched_as_one_stack(tmp_path):
    """At start-up the skeleton touches every arena's regions in one order: the walkers' regions
    of all bodies by bin, largest first, then each arena's near part. Arena by arena (up to
    session 7), memcached's timer arena came after the workers' and pushed them out of the LL."""
    prof = generate.neutral_profile(
        icode_bins=[(512, 1.0)], data_bins=[(256, 0.3), (8192, 0.2), (262144, 0.3), (4 << 20, 0.2)]
    )
    prof["body"]["0"]["role"] = "worker"
    timer = dict(prof["body"]["0"], role="timer", events=3000)
    timer["D_bins"] = [[128, 100.0], [16384, 200.0], [1 << 20, 100.0], [8 << 20, 50.0]]
    prof["body"]["1"] = timer
    prof["threads"]["clusters"] = [
        {"role": "worker", "tids": [1], "count": 1, "period_us": 0, "samples": 0},
        {"role": "timer", "tids": [2], "count": 1, "period_us": 1000, "samples": 0},
    ]
    generate.generate(prof, tmp_path, seed=1)
    text = (tmp_path / "clone_tables.h").read_text()
    rows = [tuple(map(int, m)) for m in re.findall(r"\{(\d+), (\d+), (\d+), [01]\}", text.split("clone_touch[]")[1])]
    arenas = {a for a, _, _ in rows}
    assert arenas == {0, 1}, rows  # the workers' arena and the timer's own, in one table
    # interleaved: not all of one arena before the other
    firsts = [a for a, _, _ in rows]
    assert firsts != sorted(firsts) and firsts != sorted(firsts, reverse=True), rows
    # the near parts (offset 0) come last, and the largest regions first
    assert {r[1] for r in rows[-2:]} == {0}, rows
    assert rows[0][2] >= max(n for _, o, n in rows if o > 0) / 4, rows
    # ranges of one arena do not overlap
    for a in arenas:
        spans = sorted((o, o + n) for b, o, n in rows if b == a)
        assert all(e0 <= s1 for (_, e0), (s1, _) in itertools.pairwise(spans)), spans


def test_a_knob_changes_only_what_it_tunes():
    """Each block, ring and chunk draws from a generator of its own, so a tuning step that moves
    the transition rates changes the branch patterns and nothing else (with one stream for the
    whole body, a pattern that drew a few more numbers reshuffled every later instruction, and
    each tuning iteration measured a different random program)."""
    spec = _spec(
        instructions=6000,
        chunk_insns=6,
        mix={"arith/reg": 0.5, "mov/load": 0.3, "mov/store": 0.2},
        mem_per_insn=0.5,
        main_fraction=0.5,
        branches=[[0.3, 0.2, 1], [0.6, 0.4, 1]],
        icode_bins=[(2048, 0.6), (8192, 0.4)],
        data_bins=[(512, 0.5), (65536, 0.5)],
    )
    a, _, _ = asmgen.generate_body(spec, np.random.default_rng(3), {"branch_r_scale": 1.0})
    b, _, _ = asmgen.generate_body(spec, np.random.default_rng(3), {"branch_r_scale": 0.6})
    assert len(a) == len(b)
    diff = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    assert diff, "the knob changed nothing"
    assert all(re.match(r"\s*mov r1[01], ", x) for x, _ in diff), diff[:5]


def test_a_pinned_layout_keeps_the_blocks_code_while_other_units_step():
    """The blocks' chunks and passes are sized on the pinned layout budget (tune.pin_layout), and
    the one block with the most passes takes what the budget itself differs by: a step of the
    random-branch unit, of the instructions or of the walkers changes how often that block runs,
    not any block's code, and the instructions per event stay exact.
    Unpinned, the same steps resize the blocks (session 17: memcached's I1 moved by half).
    The blocks' operand mix is pinned too (session 44): with the budget alone pinned, a walker
    step redrew every block's instructions (memcached's worker: a block from 2 passes an event
    to 1, mispredictions -14%, I1 +9%)."""
    from tailscope.clone import tune

    spec = _layout_spec()
    spec.branch_unit = True

    def gen(knobs):
        sp = copy.deepcopy(spec)
        lines, blocks, _ = asmgen.generate_body(sp, np.random.default_rng(3), knobs)
        assert sp.expected == pytest.approx(asmgen.body_instructions(sp, knobs), abs=1.0)
        # the filler (whose length moves with every step) comes after all the other code
        if "clone_fill_t:" in lines:
            assert lines.index("clone_fill_t:") > lines.index("clone_far_t:")
        # the blocks' code: the body up to the far function, each loop's pass count aside
        a = lines.index("clone_body_t:")
        b = next(i for i, ln in enumerate(lines) if i > a and ln.startswith("clone_far_t:"))
        text = [re.sub(r"mov r12d, \d+", "mov r12d, N", ln) for ln in lines[a:b]]
        return [(x.code_bytes, x.insns) for x in blocks], [x.iters_per_event for x in blocks], sp, text

    code0, passes0, sp0, text0 = gen({"branch_x": 1.0})
    mix = {"block_budget": sp0.block_budget, "mix_a": sp0.mix_a, "mix_b": sp0.mix_b}
    meta = {"targets": {"t": mix, "x": {"instructions_per_event": 1.0}}}
    pinned = tune.pin_layout({"branch_x": 1.0}, meta)
    assert pinned == {  # (only bodies that report one)
        "branch_x": 1.0,
        "layout_budget:t": sp0.block_budget,
        "layout_mix_a:t": sp0.mix_a,
        "layout_mix_b:t": sp0.mix_b,
    }
    assert tune.pin_layout({**pinned, "layout_budget:t": 7.0}, meta)["layout_budget:t"] == 7.0  # kept
    steps = [{"branch_x": 30.0}, {"instr_scale": 1.1}, {"instr_scale": 0.9}, {"data_far_scale": 1.03}]
    moved = redrawn = 0
    for step in steps:
        code, passes, _, text = gen({**pinned, **step})
        assert code == code0, step
        # one block (the one with the most passes) takes the difference: the others run as before
        assert sum(p != q for p, q in zip(passes, passes0, strict=True)) <= 1, (step, passes, passes0)
        # the blocks' instructions are the same (the random-branch unit's call aside)
        assert sum(x != y for x, y in zip(text, text0, strict=True)) <= 1, step
        moved += [c[0] for c in gen({"branch_x": 1.0, **step})[0]] != [c[0] for c in code0]
        budget_only = {k: v for k, v in pinned.items() if not k.startswith("layout_mix_")}
        redrawn += sum(x != y for x, y in zip(gen({**budget_only, **step})[3], text0, strict=True)) > 1
    assert moved >= 3, "unpinned, the steps did not resize the blocks: the test shows nothing"
    assert redrawn, "with the budget alone pinned no step redrew the blocks: the test shows nothing"
    # the mix pin keeps `mem_scale` working: its step still changes the blocks' operands
    assert gen({**pinned, "mem_scale": 1.3})[3] != text0


def _layout_spec():
    return _spec(
        instructions=6000,
        chunk_insns=6,
        mix={"arith/reg": 0.5, "mov/load": 0.3, "mov/store": 0.2},
        mem_per_insn=0.5,
        main_fraction=0.5,
        icode_bins=[(256, 0.2), (1024, 0.2), (2048, 0.3), (8192, 0.3)],
        data_bins=[(128, 0.1), (256, 0.1), (512, 0.1), (1024, 0.1), (8192, 0.2), (16384, 0.2), (65536, 0.2)],
    )


def test_each_block_rotates_its_patterns_by_its_own_passes():
    """A block's patterns start rotated by its own passes so far and its rare branches test its
    own pass counter (session 13): with one counter that every block's passes advanced, a block
    run once per event read its pattern's bits D apart (D, all blocks' passes per event), so its
    branches' transition rates were not the profile's."""
    spec = _layout_spec()
    spec.branches = [[0.5, 0.2, 1], [0.01, 0.005, 1]]
    lines, blocks, _ = asmgen.generate_body(spec, np.random.default_rng(2), {})
    text = "\n".join(lines)
    rot = re.findall(r"mov ecx, dword ptr \[rdi \+ (\d+)\]", text)
    inc = re.findall(r"inc qword ptr \[rdi \+ (\d+)\]", text)
    masks = set(re.findall(r"test dword ptr \[rdi \+ (\d+)\], \d+", text))
    assert len(rot) == sum(1 for b in blocks if b.weight > 0) >= 3, rot
    assert len(set(rot)) == len(rot), rot  # a counter per block
    assert set(rot) <= set(inc) and str(asmgen.STATE_ITER) in inc  # (st->iter: once per event)
    assert masks and masks <= set(rot), (masks, rot)
    assert all(int(x) >= asmgen.STATE_BLOCK_PASSES for x in rot)


def test_regions_are_placed_in_cache_colour():
    """The blocks' and the walkers' regions follow one another in cache colour (place_colored):
    their lines spread evenly over a 32 KiB 8-way D1's 64 sets. Each on a 4 KiB boundary (up
    to session 12), every region began in set 0, the first sets of each 64 held most of the
    small regions' lines, and memcached's slowly walked regions lost lines from the LL between
    two passes (DL 190-330% over) and its D1 misses started 5x over."""
    assert asmgen.place_colored(8192, 0) == 8192
    assert asmgen.place_colored(8193, 0) == 8192 + 4096
    assert asmgen.place_colored(8192, 5) == 8192 + 5 * 64
    assert asmgen.place_colored(8192 + 6 * 64, 5) == 8192 + 4096 + 5 * 64
    spec = _layout_spec()
    _, blocks, _ = asmgen.generate_body(spec, np.random.default_rng(1), {})
    regions = [(b.region_off, b.region_bytes) for b in blocks if b.region_bytes]
    regions += [(o, n) for o, n, rank, _ in spec.touch if rank > 0]  # the walkers' regions
    assert len(regions) >= 7, regions  # (the 8 and 16 KiB bins' static regions nest: one)
    # none overlaps the next (a block's walk reaches one step past its region)
    reach = {b.region_off: 2 * b.region_bytes for b in blocks if b.region_bytes}
    spans = sorted((o, o + reach.get(o, n)) for o, n in regions)
    assert all(e0 <= s1 for (_, e0), (s1, _) in itertools.pairwise(spans)), spans
    # each starts where the one before ended, in colour: the small ones (the blocks') in sets of
    # their own, and each walker's region in the set after the last line of the one before
    starts = [off // 64 % 64 for off, n in regions if n <= 64 * 64]
    assert len(set(starts)) == len(starts), regions
    walks = sorted((o, n) for o, n, rank, _ in spec.touch if rank > 0)
    for (o0, n0), (o1, _) in itertools.pairwise(walks):
        assert o1 // 64 % 64 == (o0 + n0) // 64 % 64, walks
    per_set = [0] * 64
    for off, n in regions:
        for line in range(off // 64, (off + n) // 64):
            per_set[line % 64] += 1
    mean = sum(per_set) / 64
    assert max(per_set) <= 1.5 * mean + 1, per_set
    assert min(per_set) >= 0.5 * mean - 1, per_set


def test_the_lines_read_every_event_have_d1_sets_of_their_own():
    """The arena's lines that every event reads and that no walker walks (the tiny region, the
    blocks' cursors, the first block region, the LL rings' slot line) each have a D1 set of their
    own at A (64 sets). Up to session 35 all four began a 4 KiB page: redis's clone touched 9.1
    lines of set 0 per request against ~4.3 in the others, and missed 7.1 times per request at A
    where 16 ways did not (redis: 0.4), which the tuning loop took back from the far walkers."""
    spec = _layout_spec()
    spec.llc_data = [(8 << 20, 0.25)]
    _, blocks, _ = asmgen.generate_body(spec, np.random.default_rng(1), {})
    slot_rows = [(o, n) for o, n, rank, _ in spec.touch if rank == -1 and n >= 64 and o % 64 == 0]
    assert slot_rows, spec.touch  # the rings' region is there
    llc_slot = min(o for o, _ in slot_rows)
    first_region = min(b.region_off for b in blocks if b.region_bytes)
    sets = {
        "tiny": asmgen.SINK_OFF // 64 % 64,
        "block cursors": asmgen.BLOCK_SLOTS // 64 % 64,
        "first block region": first_region // 64 % 64,
        "LL rings' slots": llc_slot // 64 % 64,
    }
    assert len(set(sets.values())) == len(sets), sets


def test_walkers_are_sized_at_the_rate_they_run():
    """layer_walkers sizes a region for the reuse distance its bin wants at the rate the knobs
    give its walker (session 13). Sized at the profiled rate, a walker the D1 knob slowed came
    round after everything else had walked more lines, so its reuse distance grew with the
    knob; at the rate it runs, a slowed body's regions shrink instead and keep the distance."""

    def sizes(knobs):
        a, b = _layout_spec(), _layout_spec()
        a.name, b.name = "worker", "timer"
        b.walk_base = 1
        asmgen.layer_walkers([a, b], knobs)
        return sum(b.walk_sizes.values()), sum(a.walk_sizes.values())

    slow, other = sizes({"data_far_scale:timer": 0.1})
    base, other0 = sizes({})
    assert slow < 0.8 * base, (slow, base)
    # and the other body's regions grow: the slowed one brings fewer lines between their passes
    assert other > 1.2 * other0, (other, other0)


@needs_gcc
def test_a_body_whose_conflict_rings_are_all_off_builds(tmp_path):
    """A body with LL sweep bins whose rings the knobs turned off (rate x scale below the least)
    still has its start-up warm function and no call of a missing clone_llc_<name>: up to
    session 13 this failed to link."""
    spec = _spec(instructions=3000, chunk_insns=5, llc_code=[(4 << 20, 0.3)], llc_data=[(8 << 20, 0.25)])
    assert len(asmgen.llc_rings(spec, {})) == 2  # rings at the default knobs
    out = asmgen.write_standalone(spec, tmp_path, seed=1, calls=10, knobs={"code_llc_scale": 0, "data_llc_scale": 0})
    text = "\n".join(out["lines"])
    assert "clone_llc_warm_t:" in text and "call clone_llc_t" not in text
    assert (tmp_path / "harness").exists()


def test_tuning_step_per_metric():
    """One tuning step: the per-body instruction knob is a Newton step on the measured body share
    (exact for a linear response), the far-data and far-code rates too, the others damped."""
    from tailscope.clone import tune

    knobs = dict(generate.DEFAULT_KNOBS)
    target = {
        "instructions_per_request": 6000,
        "I1_miss_rate": 0.001,
        "LL_miss_rate": 1e-5,
        "D1_miss_rate": 0.02,
        "branch_mispredict_rate": 0.02,
    }
    m = {
        "instructions_per_request": 7000,
        "data_refs_per_request": 3000,
        "I1_miss_rate": 0.0005,
        "LL_miss_rate": 4e-5,
        "D1_miss_rate": 0.04,
        "branch_mispredict_rate": 0.01,
    }
    target["cond_branches_per_request"] = 1000
    m["cond_branches_per_request"] = 700
    split = {
        "threads": {"worker": {"Ir": 7000, "body_Ir": 4000, "Bc": 700, "body_Bc": 400}},
        "far": {"I1mr": 2.0, "ILmr": 0.0, "DLmr": 0.3, "DLmw": 0.0},
    }
    k = tune.update_knobs(knobs, m, target, split, {"worker": 6000})
    # conditional branches: the skeleton's 300 stay, the bodies must give 700 instead of 400
    # (half that Newton step, geometrically: LAYOUT_DAMPING)
    assert abs(k["cond_scale"] - 1.75**tune.LAYOUT_DAMPING) < 1e-9
    # the skeleton's 3000 stay: the body must do 3000 instead of 4000
    assert abs(k["instr_scale:worker"] - 0.75) < 1e-9
    # I1: the target rate at the clone's instructions (0.001 x 7000 = 7 misses/request); 3.5
    # measured, 2 of them far -> the far block must give 5.5
    assert abs(k["icode_far_scale"] - 2.75) < 1e-9
    # LL: 0.4 measured, 0.3 far, 0.1 wanted -> the far loop's rate goes to its floor step (0.05)
    assert abs(k["data_ll_scale"] - 0.05) < 1e-9
    # damped, in the right direction
    assert k["data_far_scale"] < knobs["data_far_scale"] and k["branch_r_scale"] > knobs["branch_r_scale"]
    errs = {
        "instructions_per_request": 0.02,
        "I1_miss_rate": 0.05,
        "D1_miss_rate": 0.0,
        "LL_miss_rate": 100.0,
        "branch_mispredict_rate": 0.0,
        "IL_misses_per_request": 0.0,
        "DL_misses_per_request": 0.0,
        "data_refs_per_request": 0.0,
    }
    assert tune.score(errs) == 12.0
    # a metric the iteration did not measure counts as the cap (10), not as a match
    del errs["DL_misses_per_request"]
    assert tune.score(errs) == 22.0


def test_the_loop_keeps_an_iteration_within_every_tolerance():
    """tune.rank (session 26): an iteration within every tolerance (where the loop stops) is kept
    over an earlier one with a lower score but a row out; among the rest the score decides."""
    from tailscope.clone import tune

    tol = tune.TOLERANCE
    spot = {k: 0.0 for k in tol}
    one_out = spot | {"branch_mispredict_rate": 1.2 * tol["branch_mispredict_rate"]}
    all_in = {k: 0.9 * t for k, t in tol.items()}
    assert tune.score(one_out) < tune.score(all_in)  # the score alone would keep the earlier one
    assert tune.within(all_in) and not tune.within(one_out)
    assert tune.rank(all_in) < tune.rank(one_out)
    assert min([tune.rank(one_out), tune.rank(all_in)]) == tune.rank(all_in)
    worse = spot | {"branch_mispredict_rate": 3 * tol["branch_mispredict_rate"]}
    assert tune.rank(one_out) < tune.rank(worse)
    assert not tune.within({k: 0.0 for k in list(tol)[1:]})  # a metric not measured is not within


def test_the_loop_keeps_an_iteration_within_the_validations_limits_over_a_lower_score():
    """tune.rank's middle tier (session 44): memcached's loop kept iteration 6 by its score (I1
    0.1% off, branches 13.9%) over iteration 8 (I1 9.4%, branches 9.7%), and the validation failed
    the branch row at 14.6%. An iteration within every judged limit now ranks first."""
    from tailscope.clone import tune, validate

    spread = {"LL_miss_rate": 0.216, "DL_misses_per_request": 0.353, "branch_mispredict_rate": 0.004}
    it6 = {  # the session's figures, against the final target
        "instructions_per_request": 0.004,
        "I1_miss_rate": 0.001,
        "D1_miss_rate": 0.052,
        "LL_miss_rate": 0.165,
        "branch_mispredict_rate": 0.139,
        "IL_misses_per_request": 0.102,
        "DL_misses_per_request": 0.295,
        "data_refs_per_request": 0.007,
    }
    it8 = it6 | {"I1_miss_rate": 0.094, "D1_miss_rate": 0.037, "branch_mispredict_rate": 0.097}
    assert tune.score(it6, spread) < tune.score(it8, spread)  # the score alone keeps iteration 6
    assert not tune.within(it6) and not tune.within(it8)
    assert tune.within_limits(it8, spread) and not tune.within_limits(it6, spread)
    assert tune.rank(it8, spread) < tune.rank(it6, spread)
    # LL at 16.5% is within its limit beyond the target's own spread (21.6%), not without it
    assert not tune.within_limits(it8)
    # the limits are the validation's: instructions 5%, the miss rates and branches 10%
    lim = validate.TARGETS
    assert tune.within_limits(it8 | {"instructions_per_request": lim["instructions_per_request"]}, spread)
    assert not tune.within_limits(it8 | {"instructions_per_request": 1.01 * lim["instructions_per_request"]}, spread)
    # the LL rows by side and the references are tuned, not judged: no limit of their own
    assert tune.within_limits(it8 | {"DL_misses_per_request": 0.9, "data_refs_per_request": 0.5}, spread)
    # a judged metric the iteration did not measure is not within
    assert not tune.within_limits({k: v for k, v in it8.items() if k != "D1_miss_rate"}, spread)
    # an iteration within every tolerance still ranks before one only within the limits
    spot = {k: 0.5 * t for k, t in tune.TOLERANCE.items()}
    assert tune.rank(spot, spread) < tune.rank(it8, spread)


def test_the_score_counts_errors_beyond_the_targets_own_spread():
    """tune.score (session 17): an error counts beyond the target's own spread over the profile's
    windows only. redis's LL rows moved 20-30% between the profile's windows, and the loop kept an
    iteration with I1 and branch 9-11% off over four within 0.4% because of one LL draw."""
    from tailscope.clone import tune, validate

    wins = [
        {k: 1.0 for k in tune.TOLERANCE} | {"IL_misses_per_request": 0.020, "requests": 6000},
        {k: 1.0 for k in tune.TOLERANCE} | {"IL_misses_per_request": 0.024, "requests": 6000},
        {k: 1.0 for k in tune.TOLERANCE} | {"IL_misses_per_request": 0.026, "requests": 6000},
    ]
    sp = tune.target_spread({"windows": wins})
    assert sp["I1_miss_rate"] == 0.0 and sp["IL_misses_per_request"] == pytest.approx(
        validate.mean_spread([0.020, 0.024, 0.026], 3)
    )
    assert 0.1 < sp["IL_misses_per_request"] < 0.2
    assert tune.target_spread({}) == {} and tune.target_spread({"windows": wins[:1]}) == {}
    # windows that agree by chance on few events: the pool's counting noise is the least spread
    # (validate.counting_floor, session 20), 2/sqrt(N) for N = 0.0233 x 18,000 = 420 misses
    same = [w | {"IL_misses_per_request": 0.0233} for w in wins]
    pooled = {"metrics": {"IL_misses_per_request": 0.0233}}
    sp = tune.target_spread({"windows": same} | pooled)
    assert sp["IL_misses_per_request"] == pytest.approx(2 / (0.0233 * 18000) ** 0.5)
    # windows that differ more than the counting noise keep their own spread
    assert tune.target_spread({"windows": wins} | pooled)["IL_misses_per_request"] == pytest.approx(
        validate.mean_spread([0.020, 0.024, 0.026], 3)
    )
    # windows without request counts (older profiles): no floor
    assert tune.target_spread({"windows": [{k: v for k, v in w.items() if k != "requests"} for w in same]} | pooled)[
        "IL_misses_per_request"
    ] == pytest.approx(0.0)
    # redis's bench run: iteration 3 (LL within its spread, I1 and branch off) against 7
    it3 = dict.fromkeys(tune.TOLERANCE, 0.0) | {"I1_miss_rate": 0.088, "branch_mispredict_rate": 0.108}
    it7 = dict.fromkeys(tune.TOLERANCE, 0.0) | {"LL_miss_rate": 0.189, "IL_misses_per_request": 0.343}
    spread = {"LL_miss_rate": 0.237, "IL_misses_per_request": 0.332}
    assert tune.score(it3) < tune.score(it7)  # without the spread the LL draw decided
    assert tune.score(it7, spread) < tune.score(it3, spread)
    # beyond the spread the excess counts, in units of the tolerance
    assert tune.score(it7, spread) == pytest.approx((0.343 - 0.332) / 0.10)


def test_data_references_tuning_step():
    """Session 11: data references per request are a tuning target (every miss rate is per
    reference). `mem_scale` takes a Newton step on the blocks' references (clone_body_): the
    rest (skeleton, walkers) stays, the blocks make up the difference; clamped to 0.5..2 a step."""
    from tailscope.clone import tune

    knobs = dict(generate.DEFAULT_KNOBS)
    assert knobs["mem_scale"] == 1.0
    split = {
        "threads": {"worker": {"Ir": 8000, "body_Ir": 5000, "Bc": 0, "body_Bc": 0, "body_Dref": 1000}},
        "far": {},
    }
    target = {"data_refs_per_request": 3400}
    # 2,400 measured, 1,000 of them the blocks': the blocks must give 2,000 (a Newton step of
    # 2, taken by half, geometrically: LAYOUT_DAMPING)
    assert tune.LAYOUT_DAMPING == 0.5
    k = tune.update_knobs(knobs, {"data_refs_per_request": 2400}, target, split, {})
    assert abs(k["mem_scale"] - 2.0**0.5) < 1e-9
    # too many: a step down, clamped at 0.5 before the damping
    k = tune.update_knobs(knobs, {"data_refs_per_request": 6000}, target, split, {})
    assert abs(k["mem_scale"] - 0.5**0.5) < 1e-9
    # within the dead band (each step of this knob is a new code layout): no step, and none of
    # the conditional-branch knob either
    target["cond_branches_per_request"] = 1000
    split["threads"]["worker"]["body_Bc"] = 400
    m = {"data_refs_per_request": 3350, "cond_branches_per_request": 990}
    k = tune.update_knobs(knobs, m, target, split, {})
    assert k["mem_scale"] == 1.0 and k["cond_scale"] == 1.0
    assert "data_refs_per_request" in tune.TOLERANCE and tune.KNOB_OF["data_refs_per_request"] == "mem_scale"


@needs_valgrind
@needs_gcc
def test_body_data_references_follow_the_profile_with_short_chunks(tmp_path):
    """With the original's short cache-line chunks (5 instructions) and a conditional branch
    every ~3.6 instructions (redis: 0.28 per instruction), the register-only scaffolding
    (closing jump, a test per branch, loop control) left too little room for the memory
    classes: the session-10 body made 0.34 references per instruction where 0.53 were asked
    (the clones' 30-36% shortfall of references per request). The branch state now lives in
    memory, so the tests and the loop control are references (this body: 0.59, within 12%; the
    tuning loop's `mem_scale` step takes the rest), and `mem_scale` moves the references both
    ways."""
    mix = {"arith/reg": 0.3, "mov/reg": 0.15, "mov/load": 0.25, "mov/store": 0.1, "arith/load": 0.1}
    mix["branch/reg"] = 0.1
    spec = _spec(
        instructions=6000,
        chunk_insns=5,
        mix=mix,
        cond_per_insn=0.28,
        branches=[[0.3, 0.2, 1], [0.02, 0.01, 1]],
        icode_bins=[(2048, 0.6), (8192, 0.4)],
        data_bins=[(512, 1.0)],
        mem_per_insn=0.53,
        main_fraction=0.05,
    )
    calls = 300

    def refs_per_insn(knobs, tag):
        d = tmp_path / tag
        asmgen.write_standalone(spec, d, seed=5, calls=calls, knobs=knobs)
        tc = _cg_run(d, d / "harness", calls, tag, extra=["--cache-sim=yes"])
        ir = sum(tc.fn_total("Ir", f"clone_{f}_t") for f in ("body", "far", "fill"))
        dref = sum(tc.fn_total(e, p) for e in ("Dr", "Dw") for p in ("clone_body_t", "clone_far_t"))
        return dref / ir

    base = refs_per_insn({}, "base")
    assert abs(base - 0.53) <= 0.12 * 0.53, base
    less = refs_per_insn({"mem_scale": 0.7}, "less")
    assert less < base - 0.05, (less, base)


def test_set_quotas_share_the_lines_out_by_the_histogram():
    q = asmgen.set_quotas([3] * 16 + [1] * 48, 150)
    assert sum(q) == 150 and len(q) == 64
    assert all(q[i] in (4, 5) for i in range(16)) and all(q[i] in (1, 2) for i in range(16, 64)), q
    assert asmgen.set_quotas([0] * 64, 10) == [0] * 64


@needs_gcc
def test_shaped_blocks_lie_on_the_profiles_code_sets(tmp_path):
    """shape_sets moves a body's chunks onto the sets the profile's hot code uses: with all of it
    on sets 0-15, nearly all chunks land there (a quarter, contiguous), no mark is left, and the
    same text gives the same layout. Without a histogram the marks go and the code is unchanged."""
    spec = _spec(instructions=8000, chunk_insns=5, icode_bins=[(16384, 1.0)])
    lines, _blocks, _arena = asmgen.generate_body(spec, np.random.default_rng(3), {})
    text = "\n".join(["    .intel_syntax noprefix", "    .text", *lines]) + "\n"
    hist = [4] * 16 + [0] * 48
    shaped = asmgen.shape_sets(text, hist, tmp_path / "w")
    assert shaped == asmgen.shape_sets(text, hist, tmp_path / "w2")
    assert asmgen.SETGAP_MARK not in shaped and ".skip" in shaped
    plain = asmgen.shape_sets(text, None, tmp_path / "w3")
    assert asmgen.SETGAP_MARK not in plain and ".skip" not in plain

    def sets_of_chunks(t: str) -> list[int]:
        addr = asmgen._assemble_labels(t, tmp_path / "a")
        base = addr["clone_body_t"]
        return [(a - base) // 64 % 64 for k, a in addr.items() if re.fullmatch(r"\.Lt_\d+_c\d+", k)]

    on = [s < 16 for s in sets_of_chunks(shaped)]
    flat = [s < 16 for s in sets_of_chunks(plain)]
    assert len(on) > 100 and sum(on) >= 0.9 * len(on), (sum(on), len(on))
    assert sum(flat) <= 0.4 * len(flat)


@needs_valgrind
@needs_gcc
def test_shaped_blocks_miss_by_the_ways_as_the_originals_code_does(tmp_path):
    """Contiguous, ~150 lines of blocks fit a 16 KiB I1 at 8 ways and at 4 alike. Shaped onto a
    profile whose hot code sits three times as thick on sets 0-15, those sets hold ~8 lines: they
    still fit 8 ways (sets folded to 32) but not 4, so the I1 misses at 4 ways only."""
    spec = _spec(instructions=8000, chunk_insns=5, icode_bins=[(16384, 1.0)])
    misses = {}
    for name, cs in (("flat", None), ("shaped", [3] * 16 + [1] * 48)):
        d = tmp_path / name
        asmgen.write_standalone(spec, d, seed=3, calls=300, code_sets=cs)
        for ways in (8, 4):
            tc = _cg_run(d, d / "harness", 300, f"i{ways}", ("--cache-sim=yes", f"--I1=16384,{ways},64"))
            misses[name, ways] = tc.fn_total("I1mr", "clone_body_t") / 300
    assert max(misses["flat", 8], misses["flat", 4], misses["shaped", 8]) < 5, misses
    assert misses["shaped", 4] > 200, misses


@needs_gcc
def test_chunks_spread_branches_over_predictor_slots(tmp_path):
    """spread_chunks pads middle chunks inside their line: the body's conditional branches use
    many more of the 128 address slots callgrind's predictor indexes (7 low address bits), no
    chunk crosses a cache line (its I-cache line entries are unchanged), and it is deterministic."""
    spec = _spec(instructions=20000, chunk_insns=5, icode_bins=[(4096, 0.5), (16384, 0.5)])
    lines, _blocks, _arena = asmgen.generate_body(spec, np.random.default_rng(5), {})
    text = "\n".join(["    .intel_syntax noprefix", "    .text", *lines]) + "\n"
    spread = asmgen.spread_chunks(text, 5, tmp_path / "w")
    assert spread == asmgen.spread_chunks(text, 5, tmp_path / "w2")
    assert ".skip" in spread and asmgen.PAD_MARK not in spread

    def assemble(t: str, name: str) -> dict[str, int]:
        (tmp_path / f"{name}.S").write_text(t)
        subprocess.run(
            ["gcc", "-c", "-Wa,-L", "-o", str(tmp_path / f"{name}.o"), str(tmp_path / f"{name}.S")], check=True
        )
        dis = subprocess.run(
            ["objdump", "-d", "--no-show-raw-insn", str(tmp_path / f"{name}.o")], capture_output=True, text=True
        ).stdout
        slots = {int(m.group(1), 16) & 0x7F for m in re.finditer(r"^\s*([0-9a-f]+):\s+j(?!mp)\w+\s", dis, re.M)}
        syms = subprocess.run(["nm", str(tmp_path / f"{name}.o")], capture_output=True, text=True).stdout
        addr = {x.split()[2]: int(x.split()[0], 16) for x in syms.splitlines() if len(x.split()) == 3}
        crossing = [k for k in addr if k.endswith("_end") and addr[k[:-4]] // 64 != (addr[k] - 1) // 64]
        return {"slots": len(slots), "crossing": len(crossing), "chunks": sum(k.endswith("_end") for k in addr)}

    before = assemble(text.replace(asmgen.PAD_MARK, "    # "), "plain")
    after = assemble(spread, "spread")
    assert after["chunks"] > 50 and after["crossing"] == 0 and before["crossing"] == 0
    assert after["slots"] >= 2 * before["slots"], (before, after)


@needs_valgrind
@needs_gcc
def test_spread_keeps_one_way_branches_of_a_loop_off_each_others_slots(tmp_path, monkeypatch):
    """A loop whose one-way branches go both ways: with pads drawn at random (session 29), some
    seed puts a taken and a never-taken branch on one predictor counter and each mispredicts on
    nearly every pass (redis's clone, session 30: 33 per request); spread_chunks' pads keep them
    apart, and the same body mispredicts at most a few times per event."""
    spec = _spec(
        instructions=40000,
        cond_per_insn=0.3,
        branches=[[0.998, 0.004, 3], [0.002, 0.004, 1]],
        icode_bins=[(8192, 1.0)],
        chunk_insns=5,
    )

    def mispredicts(seed: int, tag: str) -> tuple[float, float]:
        d = tmp_path / tag
        d.mkdir()
        lines, blocks, arena = asmgen.generate_body(spec, np.random.default_rng(seed), {})
        note = '    .section .note.GNU-stack,"",@progbits'
        text = "\n".join(["    .intel_syntax noprefix", "    .text", *lines, note]) + "\n"
        (d / "body.S").write_text(asmgen.spread_chunks(text, seed, d / "w"))
        (d / "harness.c").write_text(asmgen.harness_c("t", arena, 200, max(64, len(blocks) + 2)))
        subprocess.run(["gcc", "-O1", "-o", str(d / "h"), str(d / "harness.c"), str(d / "body.S")], check=True)
        tc = _cg_run(d, d / "h", 200, "b", ("--branch-sim=yes",))
        return tc.fn_total("Bcm", "clone_body_t") / 200, tc.fn_total("Bc", "clone_body_t") / 200

    clashing = None
    with monkeypatch.context() as m:  # every pad costs the same: session 29's random draw
        m.setattr(asmgen, "_clash", lambda a, b: 0)
        for seed in range(1, 13):
            bcm, bc = mispredicts(seed, f"random{seed}")
            if bcm > 0.01 * bc:
                clashing = seed
                break
    assert clashing is not None, "no seed in 1-12 put two one-way branches of the loop on one counter"
    bcm, bc = mispredicts(clashing, "spread")
    assert bc > 5000 and bcm < 0.002 * bc, (clashing, bcm, bc)


def test_a_trace_that_hangs_after_its_sigint_says_where_and_is_tried_again(tmp_path, monkeypatch):
    """SyscallTrace.stop: a bpftrace that is ready and then ignores the SIGINT (the rare hang of
    sessions 23 and 36's CI) is killed after STOP_WAIT_S; the TraceError names the exit and where
    its threads waited, and profile.traced tries the window again. The stand-in is a shell that
    prints the ready line and traps SIGINT, a real process and a real signal."""
    import os

    from tailscope.clone import profile, trace

    fake = tmp_path / "bpftrace"
    fake.write_text(f"#!/bin/sh\ntrap '' INT\necho {trace.READY}\nexec sleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setattr(trace, "STOP_WAIT_S", 1)
    said = []
    tries = []

    def window():
        tries.append(1)
        out = tmp_path / f"w{len(tries)}"
        out.mkdir()
        return trace.SyscallTrace(str(fake), os.getpid(), [], [], out).stop()

    with pytest.raises(CloneError) as err:
        profile.traced(window, "hang", said.append)
    msg = str(err.value)
    assert len(tries) == trace.TRACE_TRIES and len(said) == trace.TRACE_TRIES - 1, (tries, said)
    assert "exit -9" in msg and "hung 1 s after the SIGINT in " in msg, msg
    # sleep waits in a syscall (nanosleep or clock_nanosleep) with a wait channel
    assert re.search(r"in \d+:\w+/sys\d+", msg), msg
    assert "\n" not in msg


def test_trace_window_is_bpftrace_own():
    """The syscall trace's window length comes from bpftrace's interval ticks (@ns), not the
    caller's clock (which holds the attach), and ends at the SIGINT when the ticks ran on after
    it; the gate counts only while a connection accepted in the window is open."""
    from tailscope.clone import trace

    maps = trace.parse_maps("@ns: 2500000000\n@calls[7, 230, 0]: 100\n", 2.0)
    assert maps["duration_s"] == 2.5 and maps["calls"][(7, 230, 0)] == 100 and "ns" not in maps
    assert trace.parse_maps("@calls[7, 230, 0]: 100\n", 2.0)["duration_s"] == 2.0
    # the SIGINT ends it when the interval ticked on after it (while the other probes detached)
    text = "@ns: 2650000000\n@t0: 1000000000\n"
    assert trace.parse_maps(text, 9.0, stop_ns=3_100_000_000)["duration_s"] == 2.1
    assert trace.parse_maps(text, 9.0, stop_ns=9_000_000_000)["duration_s"] == 2.65
    assert "t0" not in trace.parse_maps(text, 9.0, stop_ns=3_100_000_000)
    gated = trace.bpftrace_script(1, [3], [], gate_conns=True)
    assert "if (1 == 0 || @open > 0)" in gated and "interval:ms:5" in gated
    assert "if (0 == 0 || @open > 0)" in trace.bpftrace_script(1, [3], [])


@needs_gcc
def test_generation_is_deterministic_and_builds(tmp_path):
    prof = generate.neutral_profile("redis", icode_bins=[(4096, 0.5), (65536, 0.5)], data_bins=[(0, 0.5), (16384, 0.5)])
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    generate.generate(prof, a, seed=7)
    generate.generate(prof, b, seed=7)
    generate.generate(prof, c, seed=8)
    for name in ("body.S", "clone.c", "clone_params.h", "clone_tables.h", "clone.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "body.S").read_bytes() != (c / "body.S").read_bytes()
    secs = generate.build(a)
    assert secs < 60 and (a / "clone").exists()


@needs_gcc
def test_the_skeleton_alone_has_no_cold_code_ring(tmp_path):
    """generate(empty_body=True), the skeleton measure_skeleton measures, runs none of the body:
    no blocks and no cold code ring (its 4,096 one-line variants), which the clone has."""
    prof = generate.neutral_profile("redis", icode_bins=[(4096, 1.0)])
    prof["body"]["0"]["I_cold"] = 0.02
    prof["valgrind"]["requests"] = prof["body"]["0"]["cold_requests"] = 1000
    generate.generate(prof, tmp_path / "full", seed=1)
    generate.generate(prof, tmp_path / "skel", seed=1, empty_body=True)
    full, skel = ((tmp_path / d / "body.S").read_text() for d in ("full", "skel"))
    assert full.count("\n    ret") > asmgen.COLD_RING_LINES > skel.count("\n    ret")


@needs_gcc
def test_leakage_check(tmp_path):
    orig_src = tmp_path / "orig.c"
    orig_src.write_text("""#include <stdio.h>
const char banner[] = "frobnitz-secret-banner-v42";
const unsigned char table[64] = {3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3,2,3,8,4,6,2,6,4,3,3,8,3,2,7,9,5,
                                 0,2,8,8,4,1,9,7,1,6,9,3,9,9,3,7,5,1,0,5,8,2,0,9,7,4,9,4,4,5,9,2};
int frobnitz_lookup_table_entry(int i) { return table[i & 63]; }
int main(int argc, char **argv) { puts(banner); return frobnitz_lookup_table_entry(argc); }
""")
    orig = tmp_path / "orig"
    subprocess.run(["gcc", "-O1", "-o", str(orig), str(orig_src)], check=True)
    prof = generate.neutral_profile("memcached")
    ref, clone = tmp_path / "ref", tmp_path / "clone"
    generate.generate(prof, ref, seed=99)
    generate.build(ref)
    generate.generate(prof, clone, seed=3)
    generate.build(clone)
    clean = leakage.check(orig, clone, reference=ref / "clone")
    assert clean["ok"], clean
    assert clean["original_strings"] > 0 and clean["original_symbols"] > 0
    # plant the original's string, symbol name and data table into the clone
    with (clone / "clone.c").open("a") as f:
        f.write(
            '\nconst char planted_text[] = "frobnitz-secret-banner-v42";\n'
            "int frobnitz_lookup_table_entry(int i) { return planted_text[i]; }\n"
            "const unsigned char planted_table[64] = {3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3,2,3,8,4,6,2,6,4,3,3,8,3,"
            "2,7,9,5,0,2,8,8,4,1,9,7,1,6,9,3,9,9,3,7,5,1,0,5,8,2,0,9,7,4,9,4,4,5,9,2};\n"
            "const void *keep[] = {planted_text, planted_table, (void *)frobnitz_lookup_table_entry};\n"
        )
    generate.build(clone)
    leaked = leakage.check(orig, clone, reference=ref / "clone")
    assert not leaked["ok"]
    assert "frobnitz-secret-banner-v42" in leaked["leaked_strings"]
    assert "frobnitz_lookup_table_entry" in leaked["leaked_symbols"]
    assert leaked["leaked_data_windows"] > 0


@needs_gcc
def test_clone_serves_the_load(tmp_path):
    """The generated skeleton speaks the load's protocol: the load generator sees no errors."""
    import os

    from tailscope.clone import runner, tune

    if os.geteuid() != 0:
        pytest.skip("needs root for a private network namespace")
    try:
        runner.find_loadgen() if hasattr(runner, "find_loadgen") else None
        from tailscope.clone.tools import find_loadgen

        find_loadgen()
    except CloneError as exc:
        pytest.skip(str(exc))
    for proto in ("memcached", "redis"):
        prof = generate.neutral_profile(proto, port=9999)
        d = tmp_path / proto
        generate.generate(prof, d, seed=1)
        generate.build(d)
        with runner.NetNs() as ns:
            srv = runner.start(ns, tune.clone_launch(d, 9999), 9999, tmp_path / f"{proto}.log")
            try:
                lg = runner.loadgen(ns, 9999, ["--protocol", proto, "--keys", "100"], 500, 0.5, preload=True)
            finally:
                srv.stop()
        assert lg["completed"] > 100 and lg["errors"] == 0 and lg["timeouts"] == 0, lg


def _skip_without_netns_and_loadgen():
    """Skip unless this runs as root (private network namespaces) with tailscope-loadgen built."""
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root for a private network namespace")
    try:
        from tailscope.clone.tools import find_loadgen

        find_loadgen()
    except CloneError as exc:
        pytest.skip(str(exc))


@needs_gcc
def test_a_held_load_generator_calls_back_between_runs_with_its_connections_open(tmp_path):
    """runner.loadgen_held (session 46): the generator stops after its warm-up and after the
    measured run, every reply in; each callback runs while it is stopped, the server holding the
    generator's 16 connections; the summary is the measured run's alone."""

    from tailscope.clone import runner, tune

    _skip_without_netns_and_loadgen()
    prof = generate.neutral_profile("memcached", port=9997)
    d = tmp_path / "clone"
    generate.generate(prof, d, seed=1)
    generate.build(d)
    seen = []
    with runner.NetNs() as ns:
        srv = runner.start(ns, tune.clone_launch(d, 9997), 9997, tmp_path / "clone.log")

        def edge(name):
            def call():
                held = [p for p in Path("/proc").iterdir() if p.name.isdigit() and runner._stopped(int(p.name))]
                est = ns.run(["ss", "-tnH", "state", "established", "sport = :9997"]).stdout.splitlines()
                seen.append((name, len(held) > 0, len(est)))

            return call

        try:
            lg, secs = runner.loadgen_held(
                ns,
                9997,
                ["--protocol", "memcached", "--keys", "100"],
                400,
                1.0,
                edge("start"),
                edge("end"),
                warmup=0.5,
                preload=True,
            )
        finally:
            srv.stop()
    assert seen == [("start", True, 16), ("end", True, 16)], seen
    # ~400 requests in the measured second, all answered, none of the warm-up's ~200
    assert 300 < lg["completed"] < 500 and lg["errors"] == 0 and lg["timeouts"] == 0, lg
    assert 0.9 < secs < 5, secs


@needs_valgrind
@needs_gcc
def test_the_two_sides_callgrind_windows_run_side_by_side(tmp_path):
    """validate._window_pair (session 22): the original's and the clone's windows run at the same
    time, each in its own network namespace on the same port; each side gets its own window of
    the whole load, and two copies of one program measure alike."""

    from tailscope.clone import tune, validate
    from tailscope.clone import valgrind as vg

    _skip_without_netns_and_loadgen()
    prof = generate.neutral_profile("memcached", port=9998)
    d = tmp_path / "clone"
    generate.generate(prof, d, seed=1)
    generate.build(d)
    lch = tune.clone_launch(d, 9998)
    work = tmp_path / "work"
    vgp = {"rate": 200.0, "window_requests": 300}
    load = ["--protocol", "memcached", "--keys", "100"]
    pair = validate._window_pair(
        [("original", lch, "a"), ("clone", lch, "b")], 9998, load, vgp, work, vg.CONFIG_A, preload=True
    )
    assert set(pair) == {"original", "clone"}
    # (the open-loop schedule of 1.5 s at 200 req/s: ~283 complete within it, side by side or not)
    assert all(w.requests >= 270 for w in pair.values()), {s: w.requests for s, w in pair.items()}
    assert {f.name.split(".cg")[0] for f in work.glob("*.cg*")} == {"a", "b"}
    ipr = [vg.metrics(w)["instructions_per_request"] for w in pair.values()]
    assert ipr[0] > 0 and abs(ipr[0] - ipr[1]) / ipr[0] < 0.05, ipr


def test_rows_whose_original_varies_more_than_the_limit_are_not_judged():
    """validate.verdict / errors: the original measured twice; a row whose own spread exceeds the
    limit is neither a pass nor a fail, a judged row beyond the limit fails the target."""
    from tailscope.clone import report, validate

    v = validate.verdict([("cache A", 0.04, 0.01), ("cache B", 0.40, 0.30)], 0.10)
    assert v["holds"] is None and v["max_judged_error"] == 0.04 and v["max_error"] == 0.40
    assert [u["where"] for u in v["unjudged"]] == ["cache B"]
    assert report.holds_text(v).startswith("yes where judged (not judged: cache B")
    assert validate.verdict([("cache A", 0.12, 0.01), ("cache B", 0.40, 0.30)], 0.10)["holds"] is False
    assert validate.verdict([("cache A", 0.04, 0.01), ("cache B", 0.09, None)], 0.10)["holds"] is True
    assert validate.verdict([("cache B", 0.01, 0.5)], 0.10)["holds"] is None
    # ... unless the clone is further off than the limit plus the original's own spread
    assert validate.verdict([("cache B", 0.90, 0.30)], 0.10)["holds"] is False
    # errors(): the spread comes from the original's two callgrind windows and its two native sessions
    sim = {"I1_miss_rate": 0.02, "D1_miss_rate": 0.01, "LL_miss_rate": 1e-6, "branch_mispredict_rate": 0.01}
    sim |= {"instructions_per_request": 6000.0}
    runs = [dict(sim, LL_miss_rate=1e-6), dict(sim, LL_miss_rate=2e-6)]  # LL: 67% apart
    native = {k: 100.0 for k in validate.NATIVE_KEYS} | {"throughput_rps": 1000.0}
    orig = native | {
        "syscalls_per_request": {"read": 1.0},
        "net_bytes_in_per_request": 30.0,
        "net_bytes_out_per_request": 40.0,
        "sessions": [native, native | {"latency_p99_us": 150.0}],  # p99: 40% apart
    }
    clone = dict(orig, latency_avg_us=112.0)
    res = {
        "rates": {"medium": 1000.0},
        "levels": {"medium": {"original": orig, "clone": clone}},
        "simulated": {
            "B": {"original": dict(sim, LL_miss_rate=1.5e-6, runs=runs), "clone": dict(sim, LL_miss_rate=3e-6)}
        },
    }
    t = validate.errors(res)["targets"]
    # LL at B: the clone 100% off, the original 67% apart from itself: beyond limit + spread, fails
    assert t["LL_miss_rate"]["holds"] is False and not t["LL_miss_rate"]["unjudged"]
    assert t["latency_p99_us"]["holds"] is None
    assert t["latency_avg_us"]["holds"] is True and abs(t["latency_avg_us"]["max_error"] - 0.12) < 1e-9
    assert t["I1_miss_rate"]["holds"] is True


def test_an_unjudged_simulated_row_says_how_many_windows_would_judge_it():
    """validate.windows_needed (session 23): the original's own spread of a pooled callgrind row,
    two standard errors of the mean over n windows or the counting floor 2/sqrt(N), shrinks as
    1/sqrt(n); an unjudged row says n * (spread / limit)^2, which the report prints with the
    --sim-windows that asks for it. Native rows (two sessions) get no such figure."""
    from tailscope.clone import report, validate

    six = {"runs": [{}] * 6}
    assert validate.windows_needed(six, 0.161, 0.10) == 16  # 6 * 2.59 = 15.55
    assert validate.windows_needed(six, 0.20, 0.10) == 24  # exactly 24, not 25 from rounding
    assert validate.windows_needed(six, 0.05, 0.10) == 6  # never fewer than it had
    assert validate.windows_needed({}, 0.3, 0.10) is None and validate.windows_needed(six, None, 0.1) is None
    # errors(): the LL row at B is unjudged (the original's windows 1e-6 and 1.3e-6: 26% apart); the
    # clone is 10.5% off, within the limit plus that spread
    sim = {"I1_miss_rate": 0.02, "D1_miss_rate": 0.01, "LL_miss_rate": 1.15e-6, "branch_mispredict_rate": 0.01}
    sim |= {"instructions_per_request": 6000.0}
    runs = [dict(sim, LL_miss_rate=1e-6), dict(sim, LL_miss_rate=1.3e-6)]
    native = {k: 100.0 for k in validate.NATIVE_KEYS} | {"throughput_rps": 1000.0}
    orig = native | {"syscalls_per_request": {"read": 1.0}, "net_bytes_in_per_request": 30.0}
    orig |= {"net_bytes_out_per_request": 40.0, "sessions": [native, native | {"latency_p99_us": 150.0}]}
    res = {
        "rates": {"medium": 1000.0},
        "levels": {"medium": {"original": orig, "clone": dict(orig)}},
        "simulated": {"B": {"original": dict(sim, runs=runs), "clone": dict(sim, LL_miss_rate=1.27e-6)}},
    }
    t = validate.errors(res)["targets"]
    (u,) = t["LL_miss_rate"]["unjudged"]
    sp = u["original_spread"]
    assert 0.2 < sp < 0.3 and u["windows_needed"] == validate.windows_needed({"runs": runs}, sp, 0.10) >= 10
    assert f"--sim-windows {u['windows_needed']})" in report.holds_text(t["LL_miss_rate"])
    (p99,) = t["latency_p99_us"]["unjudged"]
    assert "windows_needed" not in p99 and "--sim-windows" not in report.holds_text(t["latency_p99_us"])


def test_the_syscall_mix_is_pooled_over_both_sessions_with_its_own_spread():
    """validate.pool_sessions / errors (session 16): every native session is traced; a side's
    syscalls per request are the request-weighted mean of its two sessions' (bytes per call
    weighted by calls), and the original's two sessions give the syscall mix and the network bytes
    an own spread, so a row where one traced run of the original is off is not a clone's failure."""
    from tailscope.clone import report, validate

    native = {k: 100.0 for k in validate.NATIVE_KEYS} | {"throughput_rps": 1000.0}

    def session(ew: float, n: int, read_bytes: float) -> dict:
        return native | {
            "runs": [native],
            "traced_requests": n,
            "syscalls_per_request": {"read": 1.0, "write": 1.0, "epoll_wait": ew},
            "bytes_per_call": {"read": read_bytes, "write": 40.0},
            "net_bytes_in_per_request": 30.0,
            "net_bytes_out_per_request": 40.0,
        }

    orig = validate.pool_sessions(session(0.70, 1000, 30.0), session(0.80, 3000, 34.0))
    # (0.70 * 1000 + 0.80 * 3000) / 4000; a call type one session lacks counts as 0 there
    assert orig["syscalls_per_request"]["epoll_wait"] == pytest.approx(0.775)
    assert orig["bytes_per_call"]["read"] == pytest.approx(33.0)
    assert orig["traced_requests"] == 4000 and len(orig["sessions"]) == 2
    assert orig["sessions"][1]["syscalls_per_request"]["epoll_wait"] == 0.80
    # the original's own spread: the total variation between its sessions, 0.10 / 2.70
    res = {"rates": {"medium": 1000.0}, "levels": {"medium": {"original": orig}}, "simulated": {}}
    clone = validate.pool_sessions(session(0.85, 2000, 32.0), session(0.85, 2000, 32.0))
    res["levels"]["medium"]["clone"] = clone
    err = validate.errors(res)
    sp = err["original_spread"]["levels"]["medium"]
    assert sp["syscall_mix"] == pytest.approx(0.10 / 2.70)
    assert sp["net_bytes_per_request"] == 0.0
    # the clone 0.075 / 2.775 = 2.7% off: within the limit plus the original's 3.7% spread, not judged
    assert err["levels"]["medium"]["syscall_mix"] == pytest.approx(0.075 / 2.775)
    assert err["targets"]["syscall_mix"]["holds"] is None
    assert "3.7%" in report.detail_table_md(res | {"errors": err}).split("syscall mix (total variation) | medium")[1]
    # with the original steady (both sessions at 0.775), the same clone is judged and fails
    steady = validate.pool_sessions(session(0.775, 2000, 33.0), session(0.775, 2000, 33.0))
    res["levels"]["medium"]["original"] = steady
    assert validate.errors(res)["targets"]["syscall_mix"]["holds"] is False
    # results from before session 16 (one traced session): no spread, judged as before
    old = validate.pool_sessions(session(0.775, 2000, 33.0), native | {"runs": [native]})
    assert old["syscalls_per_request"]["epoll_wait"] == 0.775
    assert validate.original_spread(old, "syscall_mix") is None


def test_four_sessions_pool_into_one_side_with_two_standard_errors_as_the_spread():
    """validate.pool_sessions / session_spread (session 31): a side's four sessions pool all their
    runs into one median; the first two carry the syscall trace and alone give the mix; the
    original's own spread of a native figure is two standard errors of its sessions' mean (for
    two sessions exactly their relative difference), so one session the host shifted weighs a
    quarter, and it still never falls below the runs' median noise."""
    from tailscope.clone import validate

    native = {k: 30.0 for k in validate.NATIVE_KEYS}

    def session(avg: float, traced: bool) -> dict:
        runs = [native | {"latency_avg_us": avg + d} for d in (-1.0, 0.0, 1.0)]
        out = validate._medians(runs) | {"runs": runs}
        if traced:
            out |= {
                "traced_requests": 1000,
                "syscalls_per_request": {"read": 1.0, "epoll_wait": 0.5 if avg < 35 else 0.7},
                "bytes_per_call": {"read": 30.0},
                "net_bytes_in_per_request": 30.0,
                "net_bytes_out_per_request": 40.0,
            }
        return out

    side = validate.pool_sessions(session(40.0, True), session(24.0, True), session(30.0, False), session(26.0, False))
    assert len(side["runs"]) == 12 and len(side["sessions"]) == 4
    assert side["latency_avg_us"] == pytest.approx(28.0)  # the median of all twelve runs
    assert side["syscalls_per_request"]["epoll_wait"] == pytest.approx(0.6)  # the two traced ones
    vals = [40.0, 24.0, 30.0, 26.0]
    want = 2 * statistics.stdev(vals) / 2 / statistics.fmean(vals)
    assert validate.session_spread(vals) == pytest.approx(want)
    floor = validate.median_floor(side, "latency_avg_us")
    assert validate.original_spread(side, "latency_avg_us") == pytest.approx(max(want, floor))
    mixes = [s["syscalls_per_request"] for s in side["sessions"][:2]]
    want_mix = validate.syscall_mix_error(*mixes)
    assert want_mix > 0 and validate.original_spread(side, "syscall_mix") == pytest.approx(want_mix)
    # two sessions: the old figure, |a - b| / mean
    assert validate.session_spread([38.9, 24.9]) == pytest.approx(validate.spread(38.9, 24.9))
    assert validate.session_spread([0.0, 0.0]) == 0.0


def test_a_busy_host_is_measured_and_its_timed_runs_repeated():
    """runner.host_sample / host_other / validate.keep_runs / report.host_note (session 21): what
    other processes take of the machine during a timed run is measured from /proc (a real busy
    process here), a run over validate.HOST_BUSY is repeated, and the report says so."""
    import os
    import sys
    import time

    from tailscope.clone import report, runner, validate

    hz = os.sysconf("SC_CLK_TCK")
    hog = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.2: pass"])
    try:
        time.sleep(0.1)
        h0, h0x = runner.host_sample(set()), runner.host_sample({hog.pid})
        time.sleep(0.8)
        h1, h1x = runner.host_sample(set()), runner.host_sample({hog.pid})
    finally:
        hog.wait()
    share, top = runner.host_other(h0, h1, hz)
    share_x, _ = runner.host_other(h0x, h1x, hz)
    # the loop spun for the whole 0.8 s: most of one CPU, and it is the largest taker
    assert share >= 0.6 and top and top[0][1] >= 0.5
    # excluding its pid takes it out (what else ran meanwhile is whatever the machine did)
    assert share_x <= share - 0.5

    def run(other: float) -> dict:
        return {k: 100.0 for k in validate.NATIVE_KEYS} | {"host_other_cpu": other, "host_top": [["cc1", 0.4]]}

    quiet, busy = [run(0.01), run(0.02)], [run(0.40), run(0.09)]
    kept, dropped = validate.keep_runs(quiet, busy, 3)
    # topped up with the least busy run; the busier one is only reported
    assert [r["host_other_cpu"] for r in kept] == [0.01, 0.02, 0.09] and dropped == [busy[0]]
    three = [*quiet, run(0.03)]
    assert validate.keep_runs(three, busy, 3)[0] == three
    # the hypervisor's steal has its own, tighter line (session 24): 2% of a CPU stolen disturbs a
    # run that 2% of other work does not, and the least disturbed is kept by either reading
    stolen = run(0.02) | {"host_steal_cpu": 0.02}
    assert not validate.disturbed(run(0.02)) and validate.disturbed(stolen)
    assert not validate.disturbed(run(0.02) | {"host_steal_cpu": validate.HOST_STEAL / 2})
    assert validate.keep_runs(quiet, [stolen, run(0.40)], 3)[0][-1] is stolen  # 3.3x over < 8x over
    assert validate.keep_runs(quiet, [run(0.06), stolen], 3)[0][-1]["host_other_cpu"] == 0.06
    # steal_share: clock ticks of steal over the elapsed seconds, as a share of one CPU
    a, b = {"steal": 100, "t": 10.0, "procs": {}}, {"steal": 100 + hz // 10, "t": 12.0, "procs": {}}
    assert abs(runner.steal_share(a, b, hz) - 0.05) < 1e-9
    assert runner.host_other(a, b, hz)[1] == [("steal", 0.1)]
    med = validate._medians(kept)
    assert med["host_other_cpu"] == 0.02 and "host_top" not in med
    s1 = med | {"runs": kept, "busy_runs": dropped, "host_busy": True}
    s2 = validate._medians(quiet) | {"runs": quiet, "busy_runs": [], "host_busy": False}
    side = validate.pool_sessions(s1, s2)
    assert side["host_busy"] and len(side["busy_runs"]) == 1 and side["sessions"][0]["host_busy"]
    res = {"levels": {"medium": {"original": side, "clone": validate.pool_sessions(s2, s2)}}}
    note = report.host_note(res)
    assert "2 run(s) took more than 5%" in note and "original at medium load" in note and "cc1" in note
    # results from before session 21 carry no host figures: no note
    old = {k: 100.0 for k in validate.NATIVE_KEYS}
    assert report.host_note({"levels": {"medium": {"original": old | {"runs": [old]}}}}) == ""
    assert "stalls of its own" not in note  # runs from before session 31 carry no stall figures


def test_stall_note_counts_the_generator_stalls_and_the_replies_left_out():
    """report.stall_note (session 31): the load generator's own stalls (validate.STALL_US) and the
    share of replies they disturbed, which the latencies leave out, from the kept runs' records."""
    from tailscope.clone import report, validate

    def run(stalls, share):
        return {"host_other_cpu": 0.01, "generator_stalls": stalls, "disturbed_share": share}

    side = {"runs": [run(0, 0.0), run(2, 0.001), run(5, 0.004)]}
    res = {"levels": {"low": {"original": side, "clone": {"runs": [run(1, 0.0005)]}}}}
    note = report.stall_note(res)
    assert "counted 8 stalls" in note and "over 4 kept runs" in note, note
    assert f"over {validate.STALL_US} µs" in note
    assert "median 0.10%" in note and "at most 0.40%" in note, note
    assert note in report.host_note(res)
    assert report.stall_note({"levels": {"low": {"original": {"runs": [{"host_other_cpu": 0.0}]}}}}) == ""


def _fake_window(requests: int, per_thread: dict[int, dict]) -> "object":
    from tailscope.clone import valgrind as vg

    events = ["Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw", "Bc", "Bcm"]
    ts = [
        callgrind.ThreadCosts(path=f"t{t}", events=events, thread=t, summary={e: s.get(e, 0) for e in events})
        for t, s in per_thread.items()
    ]
    return vg.Window(threads=ts, requests=requests, seconds=1.0, loadgen={})


def test_a_windows_metrics_keep_its_load_generators_median_latency():
    """valgrind.metrics (session 39): a window's metrics carry the load generator's median latency
    (LATENCY_KEY, µs: how fast valgrind ran the server then), never a pool's (its windows' speeds
    differ) nor a thread group's; a value that is not a finite number is left out."""
    from tailscope.clone import valgrind as vg

    w = _fake_window(6000, {1: {"Ir": 8_000_000, "Dr": 3_000_000, "DLmr": 60}, 2: {"Ir": 1_000_000}})
    w.loadgen = {"latency_us": {"p50": 412.5, "p99": 900.0}}
    assert vg.metrics(w)[vg.LATENCY_KEY] == 412.5
    assert vg.metrics(w)["DL_misses_per_request"] == pytest.approx(60 / 6000)
    assert vg.LATENCY_KEY not in vg.metrics(vg.pool([w, w]))
    assert vg.LATENCY_KEY not in vg.metrics(w, threads=[1])
    for bad in ({"latency_us": {"p50": float("nan")}}, {"latency_us": {"p50": True}}, {"latency_us": "x"}, {}, None):
        w.loadgen = bad
        assert vg.LATENCY_KEY not in vg.metrics(w), bad
    # (kept with the windows, pool_metrics reads past it)
    w.loadgen = {"latency_us": {"p50": 10}}
    ms = [vg.metrics(w) | {"requests": 6000}] * 2
    assert vg.pool_metrics(ms)["DL_misses_per_request"] == pytest.approx(60 / 6000)


def test_auto_sim_windows_run_until_the_original_can_be_judged():
    """validate.sim_windows (session 23, `clone-report --sim-windows auto`): sim_runs pairs, then
    more while a judged row's original spread is above its limit, up to the cap. The stopping
    rule reads the original's windows only: the clone's error never decides how long to run."""
    from tailscope.clone import report, validate

    def win(ilmr: int) -> object:
        t = {"Ir": 50_000_000, "Dr": 10_000_000, "Dw": 5_000_000, "I1mr": 500_000, "D1mr": 600_000}
        return _fake_window(6000, {1: t | {"ILmr": ilmr, "DLmr": 0, "Bc": 8_000_000, "Bcm": 400_000}})

    def run(orig_ll, clone_ll, sim_runs=6, cap=20):
        lines = []

        def run_pair(i):
            return {"original": win(orig_ll(i)), "clone": win(clone_ll)}

        wins = validate.sim_windows(run_pair, "B", {}, sim_runs, cap, lines.append)
        assert len(wins["original"]) == len(wins["clone"]) == len([x for x in lines if "both sides" in x])
        return len(wins["original"]), lines

    # a steady original: its spread is the counting floor of ~60,000 LL misses (0.8%): six pairs
    assert run(lambda i: 10_000, 10_000)[0] == 6
    # LL misses of 10,000 and 14,000 in turn: 2 sd / sqrt(n) relative to the mean is 10.05% at
    # n = 12 (sd 2,089, mean 12,000) and 9.7% at 13; the progress lines say why it goes on
    n, lines = run(lambda i: (10_000, 14_000)[i % 2], 12_000)
    assert n == 13, lines
    assert "(7, at most 20: LL miss rate spread 14.9% > 10%)" in lines[6], lines[6]
    # the same original with a clone far off (or spot on): the same number of windows
    assert run(lambda i: (10_000, 14_000)[i % 2], 40_000)[0] == n
    # an original too noisy for the cap (about 120 windows' worth) stops at six, and says why
    n, lines = run(lambda i: (2_000, 30_000)[i % 2], 16_000)
    assert n == 6 and lines[-1].endswith("more than 20: stopping at 6"), lines[-1]
    m = validate._sim_side([win((2_000, 30_000)[i % 2]) for i in range(6)], "B", {})
    why, need = validate.unjudgeable_sim_rows(m)
    assert "LL miss rate spread" in why and need > 20
    assert need == validate.windows_needed(m, validate.original_spread(m, "LL_miss_rate"), 0.10)
    # one whose six windows say it needs more than the cap, but not twice as many (session 26:
    # the need is the square of a six-window estimate): it runs on to the cap (~26 needed here)
    n, lines = run(lambda i: (10_000, 16_000)[i % 2], 13_000)
    assert n == 20 and "stopping" not in lines[-1], lines[-2:]
    # ... and one that looked within reach at six windows but got noisier stops once it is not
    n, lines = run(lambda i: (10_000, 13_000)[i % 2] if i < 6 else (2_000, 30_000)[i % 2], 16_000)
    assert n == 7 and "stopping at 7" in lines[-1], lines[-2:]
    assert validate.unjudgeable_sim_rows(validate._sim_side([win(10_000)] * 6, "B", {})) == ("", 0)
    # a fixed count (--sim-windows N): the cap is N
    assert run(lambda i: (2_000, 30_000)[i % 2], 16_000, sim_runs=8, cap=8)[0] == 8
    res = {"simulated": {"A": {"original": {"runs": [{}] * 6}}, "B": {"original": {"runs": [{}] * 14}}}}
    assert report.windows_note(res) == "each side pooled 6 windows at A, 14 windows at B."
    assert report.windows_note({"simulated": {}}) == ""


def test_every_hierarchy_runs_until_its_verdicts_spread_is_within_the_limit():
    """validate.sim_all (session 43): A runs first with no peers and stops once its own spread is
    within the limit; B's windows, pooled into A's spread as the verdict pools them (`errors`),
    widen it, so A runs on until the verdict's spread is within the limit (or the cap). Before,
    redis's A was "not judged" by a hair twice (10.03%, 10.1%). The rule still reads the
    original's windows only."""
    from tailscope.clone import validate

    def win(ilmr: int) -> object:
        t = {"Ir": 50_000_000, "Dr": 10_000_000, "Dw": 5_000_000, "I1mr": 500_000, "D1mr": 600_000}
        return _fake_window(6000, {1: t | {"ILmr": ilmr, "DLmr": 0, "Bc": 8_000_000, "Bcm": 400_000}})

    def pair(values, clone):
        return lambda i: {"original": win(values[i % 2]), "clone": win(clone)}

    lines: list[str] = []
    pairs = {"A": pair((10_000, 13_000), 11_500), "B": pair((10_000, 16_000), 40_000)}
    alone = validate.sim_windows(pairs["A"], "A", {}, 6, 20, lines.append)
    n_alone = len(alone["original"])
    assert 6 < n_alone < 12  # its own spread: ~14% a window
    lines.clear()
    wins = validate.sim_all(pairs, {}, 6, 20, lines.append)
    n_a, n_b = len(wins["A"]["original"]), len(wins["B"]["original"])
    assert n_b == 20 and n_alone < n_a <= 20, (n_alone, n_a, n_b)
    assert len(wins["A"]["clone"]) == n_a and len([x for x in lines if "both sides" in x]) == n_a + n_b
    sides = {c: validate._sim_side(w["original"], c, {}) for c, w in wins.items()}
    sp = validate.original_spread(sides["A"], "LL_miss_rate", [sides["B"]])
    assert sp <= 0.10 or n_a == 20, sp
    # one window fewer at A and the verdict's spread is over the limit: it stopped at the first it could
    short = validate._sim_side(wins["A"]["original"][:-1], "A", {})
    assert validate.original_spread(short, "LL_miss_rate", [sides["B"]]) > 0.10
    # the same originals with other clones: the same windows (the clone never decides)
    again = validate.sim_all({"A": pair((10_000, 13_000), 90_000), "B": pair((10_000, 16_000), 1)}, {}, 6, 20, print)
    assert [len(w["original"]) for w in again.values()] == [n_a, n_b]
    # one hierarchy: sim_windows' windows
    assert len(validate.sim_all({"A": pairs["A"]}, {}, 6, 20, print)["A"]["original"]) == n_alone


def test_a_failed_ebpf_window_is_tried_again():
    """profile.traced (session 23): bpftrace hung for 60 s after the SIGINT that ended redis's idle
    window, was killed with no maps, and the whole bench run of redis failed on it. A window whose
    trace fails (trace.TraceError) runs again, up to trace.TRACE_TRIES times, saying so; a target
    that exited meanwhile is that error, not a trace failure; other errors are not retried."""
    from tailscope.clone import profile, trace

    calls, lines = [], []

    def flaky(n_fail):
        def window():
            calls.append(1)
            if len(calls) <= n_fail:
                raise trace.TraceError("the syscall trace is empty: bpftrace (exit -9) printed no maps")
            return {"ok": len(calls)}

        return window

    assert profile.traced(flaky(2), "idle window", lines.append) == {"ok": 3}
    assert len(lines) == 2 and lines[0].startswith("idle window: the syscall trace is empty") and "(2/3)" in lines[0]
    calls.clear()
    with pytest.raises(CloneError, match=r"printed no maps \(idle window, 3 tries\)"):
        profile.traced(flaky(5), "idle window", lines.append)
    assert len(calls) == trace.TRACE_TRIES
    calls.clear()

    def gone():
        raise CloneError("the target exited 1.9 s into profiling (idle window): it is too short-lived")

    with pytest.raises(CloneError, match="too short-lived"):
        profile.traced(flaky(5), "idle window", lines.append, gone)
    assert len(calls) == 1

    def other():
        calls.append(1)
        raise CloneError("load generator failed against the target: refused")

    calls.clear()
    with pytest.raises(CloneError, match="load generator failed"):
        profile.traced(other, "load window", lines.append)
    assert len(calls) == 1
    assert issubclass(trace.TraceError, CloneError)  # the CLI's one-line error path still applies


def test_profile_windows_pool_into_the_tuning_target():
    """profile.pool_windows: the tuning target is the rates of the windows' summed counts (not the
    first window's), and each body's instruction target is its pooled instructions per request."""
    from tailscope.clone import profile, tune

    clusters = [{"role": "worker", "tids": [11, 12]}, {"role": "timer", "tids": [13]}]
    tids = [11, 12, 13]

    def thread(ir, d1m, llm):
        return {"Ir": ir, "Dr": 400, "Dw": 100, "D1mr": d1m, "DLmr": llm, "Bc": 100, "Bcm": 2}

    w1 = _fake_window(1000, {1: thread(900_000, 10, 1), 2: thread(100_000, 0, 0), 3: thread(50_000, 5, 0)})
    w2 = _fake_window(1000, {1: thread(900_000, 30, 5), 2: thread(100_000, 0, 0), 3: thread(150_000, 5, 0)})
    p = profile.pool_windows([w1, w2], clusters, tids)
    assert len(p["windows"]) == 2 and p["windows"][0]["requests"] == 1000
    # D1: (10 + 5 + 30 + 5) misses of 6 * 500 references; the first window alone says 15 / 1500
    assert abs(p["metrics"]["D1_miss_rate"] - 50 / 3000) < 1e-12, p["metrics"]
    assert abs(p["windows"][0]["D1_miss_rate"] - 15 / 1500) < 1e-12
    assert abs(p["metrics"]["DL_misses_per_request"] - 6 / 2000) < 1e-12
    # the workers (threads 11, 12) run 1,000 instructions per request in both windows, the timer
    # 50 and 150: 100 pooled
    assert p["body_instructions_per_request"] == {"0": 1000.0, "1": 100.0}
    prof = {
        "valgrind": {"requests": 1000, "body_instructions_per_request": p["body_instructions_per_request"]},
        "body": {
            "0": {"role": "worker", "instructions_per_event": 1000.0, "events": 1000},
            "1": {"role": "timer", "instructions_per_event": 25.0, "events": 2000},
        },
    }
    assert tune._targets_by_body(prof) == {"worker": 1000.0, "bg1": 100.0}
    del prof["valgrind"]["body_instructions_per_request"]  # an older profile: its detail window
    assert tune._targets_by_body(prof) == {"worker": 1000.0, "bg1": 50.0}
    # each body's D1 misses per request over the pool (session 12): workers (10 + 30) / 2000, timer 10 / 2000
    assert p["body_D1_misses_per_request"] == {"0": 0.02, "1": 0.005}
    prof["valgrind"]["body_D1_misses_per_request"] = p["body_D1_misses_per_request"]
    assert tune._d1_targets_by_body(prof) == {"worker": 0.02, "bg1": 0.005}
    del prof["valgrind"]["body_D1_misses_per_request"]  # an older profile: one knob for all bodies
    assert tune._d1_targets_by_body(prof) == {}


def test_pooled_metrics_are_the_metrics_of_the_pooled_windows():
    """valgrind.pool_metrics: the windows' own metrics and requests pool to what `metrics` gives
    the pooled windows (the tuning target grows by windows kept as metrics only)."""
    from tailscope.clone import valgrind as vg

    def t(ir, d1m, il, dl, bcm):
        return {"Ir": ir, "Dr": 400_000, "Dw": 90_000, "I1mr": ir // 300, "D1mr": d1m, "ILmr": il, "DLmr": dl}

    ws = [
        _fake_window(5855, {1: t(9_000_000, 4000, 70, 20, 0) | {"Bc": 900_000, "Bcm": 30_000}}),
        _fake_window(6000, {1: t(8_000_000, 6000, 90, 41, 0) | {"Bc": 700_000, "Bcm": 50_000}}),
        _fake_window(4100, {1: t(7_000_000, 1000, 60, 3, 0) | {"Bc": 500_000, "Bcm": 10_000}}),
    ]
    want = vg.metrics(vg.pool(ws))
    got = vg.pool_metrics([vg.metrics(w) | {"requests": w.requests} for w in ws])
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-12), k
    # the pool is not the windows' mean rate: the first window alone is 20 / 5855 on the data side
    assert got["DL_misses_per_request"] == pytest.approx(64 / 15955)


def test_the_tuning_loop_pools_its_windows_of_the_original_into_the_target(monkeypatch, tmp_path):
    """tune.tune (session 28): each iteration runs the clone beside a window of the original, that
    window joins the target's pool, and an iteration within every tolerance runs again with the
    same knobs (no new build; the clone's windows pooled) until the target pools
    MIN_TARGET_WINDOWS windows. The kept iteration is ranked against the final target."""
    from tailscope.clone import tune
    from tailscope.clone import valgrind as vg

    def counts(il, dl):
        return {
            "Ir": 8_000_000,
            "Dr": 3_000_000,
            "Dw": 1_000_000,
            "I1mr": 40_000,
            "D1mr": 60_000,
            "ILmr": il,
            "DLmr": dl,
            "Bc": 800_000,
            "Bcm": 40_000,
        }

    orig = [_fake_window(6000, {1: counts(70, 30 if i % 2 else 24)}) for i in range(20)]
    clone = _fake_window(6000, {1: counts(70, 27)})
    builds, seen = [], []

    half = [_fake_window(6000, {1: counts(70, 27) | {"I1mr": 900_000 + 10_000 * i}}) for i in range(20)]
    half_clone = _fake_window(6000, {1: counts(70, 27) | {"I1mr": 900_000}})

    def side_by_side(jobs):
        seen.append([j["tag"] for j in jobs])
        assert jobs[1]["launch"] == {"argv": ["orig"]}
        if jobs[0]["tag"].endswith("-half"):  # (session 29) the pair at half of A's I1
            # (session 50) its D1 at the mid-bin point and the upper one by turns
            it = int(jobs[0]["tag"][len("tune") :].split("-")[0])
            assert jobs[0]["cache"] == jobs[1]["cache"] == tune.second_config(None, tune.second_point(it))
            return [half_clone, half[len(seen) // 2 - 1]]
        assert jobs[1]["cache"] == vg.CONFIG_A
        return [clone, orig[(len(seen) - 1) // 2]]

    monkeypatch.setattr(vg, "side_by_side", side_by_side)
    monkeypatch.setattr(generate, "generate", lambda *a, **k: {"thread_map": [], "targets": {}})
    monkeypatch.setattr(generate, "build", lambda d: builds.append(d) or 0.1)
    profile_windows = [vg.metrics(orig[10 + i]) | {"requests": 6000} for i in range(6)]
    prof = {
        "valgrind": {
            "metrics": vg.pool_metrics(profile_windows),
            "windows": profile_windows,
            "rate": 400,
            "window_requests": 6000,
        },
        "listen": {"port": 11211},
        "load": {"args": []},
        "private": {"launch": {"argv": ["orig"]}},
        "body": {},
    }
    res = tune.tune(prof, tmp_path, lambda msg: None)
    # every iteration within: the same clone six times, until 6 + 6 windows of the original
    assert res["iterations"] == 6 and len(builds) == 1
    assert [h["clone_windows"] for h in res["history"]] == [1, 2, 3, 4, 5, 6]
    assert [h["target_windows"] for h in res["history"]] == [7, 8, 9, 10, 11, 12]
    assert seen[0] == ["tune1", "tune1-original"] and seen[1] == ["tune1-half", "tune1-half-original"]
    # the half-I1 target pools the loop's windows of the original too: 900,000 .. 950,000 misses
    assert res["target"][tune.HALF_I1_KEY] == pytest.approx(925_000 / 8_000_000)
    assert res["errors"][tune.HALF_I1_KEY] == pytest.approx(25 / 925)
    assert res["target"]["DL_misses_per_request"] == pytest.approx(27 / 6000)
    assert res["best_iteration"] == 6
    # a first clone off on its D1 misses: a step, a new build, and its window is not pooled with
    # the next clone's
    far = _fake_window(6000, {1: counts(70, 27) | {"D1mr": 120_000}})
    builds.clear()
    seen.clear()
    monkeypatch.setattr(
        vg,
        "side_by_side",
        lambda jobs: (
            seen.append(1)
            or ([half_clone, half[0]] if "half" in jobs[0]["tag"] else [far if len(seen) == 1 else clone, orig[0]])
        ),
    )
    res = tune.tune(prof, tmp_path, lambda msg: None)
    assert len(builds) == 2 and res["history"][0]["knobs"] != res["history"][1]["knobs"]
    assert [h["clone_windows"] for h in res["history"]] == [1, 1, 2, 3, 4, 5]
    assert res["best_iteration"] == 6
    # (session 38) a single-threaded original's LL sweep anchors join the target's pool: twelve
    # anchors each with 33 data-side misses move the final target, and the loop still runs until
    # 12 windows with branches (the anchors count apart)
    anchors = [vg.metrics(_fake_window(6000, {1: counts(70, 33)})) | {"requests": 6000}] * 12
    prof["valgrind"] |= {"anchor_windows": anchors, "anchors_paired": True}
    msgs: list[str] = []
    res = tune.tune(prof, tmp_path, msgs.append)
    assert res["target_anchor_windows"] == 12 and res["iterations"] == 6
    dl = sum(w["DL_misses_per_request"] for w in res["target_windows"]) * 6000
    assert res["target"]["DL_misses_per_request"] == pytest.approx((dl + 12 * 33) / (24 * 6000))
    assert "target of 7 windows (+12 of the LL sweep's, but for the branches)" in msgs[0]
    del prof["valgrind"]["anchor_windows"]
    # without the original's launch (a profile from before it was kept): one window a side, as
    # before, and the loop stops at the first iteration within every tolerance
    del prof["private"]
    seen.clear()
    monkeypatch.setattr(vg, "side_by_side", lambda jobs: seen.append(len(jobs)) or [clone])
    res = tune.tune(prof, tmp_path, lambda msg: None)
    assert res["iterations"] == 1 and seen == [1]


def test_the_tuning_target_pools_the_ll_sweeps_paired_anchors_but_for_the_branches():
    """tune.target_anchors and retarget (session 38): the LL sweep's anchor windows at A join the
    tuning target's pool where they ran beside another copy (a single-threaded original), for
    every metric they measure; they ran without branch simulation, so the branches stay the pool
    of the windows that have them. redis's 6 + 6 windows drew its code side's upper mode in 4, its
    20 anchors in 15, the validation's 32 in 16; the target's code side was 0.0188 a request
    against the validation's 0.021, and the clone's LL at B ended 10.1% under."""
    from tailscope.clone import tune
    from tailscope.clone import valgrind as vg

    def win(il, branch=True):
        c = {"Ir": 8_000_000, "Dr": 3_000_000, "Dw": 1_000_000, "I1mr": 40_000, "D1mr": 60_000, "ILmr": il}
        c |= {"Bc": 800_000, "Bcm": 40_000} if branch else {}
        w = _fake_window(6000, {1: c})
        if not branch:  # as callgrind writes a window run with --branch-sim=no
            for t in w.threads:
                t.events = [e for e in t.events if e not in ("Bc", "Bcm")]
        return vg.metrics(w) | {"requests": 6000}

    low, high = 82, 150  # code-side LL misses a window: 0.0137 and 0.025 a request
    windows = [win(high)] * 4 + [win(low)] * 8
    anchors = [win(high, branch=False)] * 15 + [win(low, branch=False)] * 5
    assert "branch_mispredict_rate" not in anchors[0]
    vgp = {"windows": windows, "metrics": vg.pool_metrics(windows), "anchor_windows": anchors}
    assert tune.target_anchors(vgp) == []  # run alone (a multi-threaded original): left out
    assert tune.target_anchors(vgp | {"anchors_paired": False}) == []
    got = tune.target_anchors(vgp | {"anchors_paired": True})
    assert len(got) == 20 and set(vg.POOLED_KEYS) <= set(got[0])  # what pool_metrics reads
    # kept from before session 38's profile: no anchors, the pool as before
    assert tune.target_anchors({"windows": windows}) == []
    assert tune.retarget({}, windows, []) == tune.retarget({}, windows)
    alone = tune.retarget({"IL_ring_bins": 2.0}, windows)
    both = tune.retarget({"IL_ring_bins": 2.0}, windows, got)
    assert alone["IL_misses_per_request"] == pytest.approx((4 * high + 8 * low) / (12 * 6000))
    assert both["IL_misses_per_request"] == pytest.approx((19 * high + 13 * low) / (32 * 6000))
    assert both["IL_ring_bins"] == 2.0  # the rest of the target as it was
    assert both["branch_mispredict_rate"] == pytest.approx(0.05)
    assert both["cond_branches_per_request"] == alone["cond_branches_per_request"]
    # the target's spread: every window of a metric's pool, and the counting floor over them
    sp = tune.target_spread({"windows": windows, "metrics": both}, got)
    il = [w["IL_misses_per_request"] for w in windows + got]
    assert sp["IL_misses_per_request"] == pytest.approx(tune.mean_spread(il, 32))
    assert (
        sp["IL_misses_per_request"]
        < tune.target_spread({"windows": windows, "metrics": alone})["IL_misses_per_request"]
    )
    assert "branch_mispredict_rate" in sp  # from the windows that have it
    # windows without request counts or a metric (a corrupt profile): the anchors are not pooled
    assert tune.target_anchors({"anchor_windows": [{"IL_misses_per_request": 0.02}], "anchors_paired": True}) == []
    bad = [dict(w) for w in got[:3]]
    bad[1]["DL_misses_per_request"] = "x"
    assert tune.target_anchors({"anchor_windows": bad, "anchors_paired": True}) == []
    assert tune.target_anchors({"anchor_windows": {"a": 1}, "anchors_paired": True}) == []
    assert tune.target_anchors({"anchor_windows": got, "anchors_paired": "yes"}) == []


def test_an_unpaired_originals_persistent_data_target_is_measured_at_the_sweeps_largest_ll():
    """tune.persistent_ll_config / persistent_target / _ll_by_side (session 39): where the LL sweep
    ran alone (a multi-threaded original), the clone's persistent data walkers aim at the
    original's misses at the sweep's largest LL, pooled from the sweep's raw windows there and the
    loop's windows beside the clone, not at the sweep's share times the target at A (memcached:
    0.20 x 0.0063 a request, 155% over the validation's 0.00051); the clone's own rest there is
    measured. Since session 42 paired sweeps and old profiles too; corrupt sweeps keep the share."""
    from tailscope.clone import tune
    from tailscope.clone import valgrind as vg

    mb = 1 << 20
    sweep = {"sizes": [2 * mb, 4 * mb, 8 * mb], "raw": {"DL": [0.0010, 0.0009]}, "windows": [6, 10, 10]}
    vgp = {"ll_sweep": sweep, "anchors_paired": False, "window_requests": 6000}
    cfg = tune.persistent_ll_config(vgp)
    # A's L1s and the sweep's largest LL: a point of the profile's sweep, never the held-out B
    assert cfg == {**vg.CONFIG_A, "LL": "8388608,16,64"} and cfg != vg.CONFIG_B
    # (session 42) a paired sweep (redis's) and a profile from before the pairing was kept alike
    assert tune.persistent_ll_config(vgp | {"anchors_paired": True}) == cfg
    assert tune.persistent_ll_config({k: v for k, v in vgp.items() if k != "anchors_paired"}) == cfg
    assert tune.persistent_ll_config(vgp | {"ll_sweep": {**sweep, "sizes": [2 * mb, "x"]}}) is None
    assert tune.persistent_ll_config(vgp | {"ll_sweep": None}) is None
    # the sweep's 10 windows at 8 MiB (0.0009 a request) alone, then with four of the loop's
    assert tune.persistent_target(vgp, []) == pytest.approx(0.0009)
    loop = [{"DL_misses_per_request": 0.0003, "requests": 6000}] * 4
    assert tune.persistent_target(vgp, loop) == pytest.approx((10 * 0.0009 + 4 * 0.0003) / 14)
    # a corrupt sweep entry: the loop's windows alone; nothing at all: None
    bad = vgp | {"ll_sweep": {**sweep, "raw": {"DL": ["x"]}}}
    assert tune.persistent_target(bad, loop) == pytest.approx(0.0003)
    assert tune.persistent_target(bad, []) is None
    assert tune.persistent_target(vgp | {"ll_sweep": {**sweep, "windows": [6, 10, float("nan")]}}, loop) == (
        pytest.approx(0.0003)
    )
    # the step: want = the target at the largest LL less the clone's rest there (its misses there
    # but for clone_farp_'s), not 0.25 x the target at A less the skeleton's estimate
    target = {"IL_misses_per_request": 0.0, "DL_misses_per_request": 0.04, "DL_persistent_fraction": 0.25}
    m = {"IL_misses_per_request": 0.0, "DL_misses_per_request": 0.04}
    args = ({"DLmr": 0.02}, {"DLmr": 0.015}, {"keep": 1.0, "persist": 1.0}, {"DLmr": 0.016})
    k0 = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(k0, m, target, *args)
    assert k0["data_ll_scale"] == pytest.approx((0.25 * 0.04 - 0.005) / 0.016)
    k = dict(generate.DEFAULT_KNOBS)
    mp = m | {tune.PERSISTENT_KEY: 0.018, tune.PERSISTENT_REST_KEY: 0.002}
    tune._ll_by_side(k, mp, target | {tune.PERSISTENT_KEY: 0.006}, *args)
    assert k["data_ll_scale"] == pytest.approx((0.006 - 0.002) / 0.016)
    # (the rings make up the rest at A as before: what the walkers were asked for stays)
    assert k["data_llc_scale"] == pytest.approx((0.04 - 0.005 - (0.006 - 0.002)) / (0.015 + 0.004))
    # the code side (with code rings): the cold ring (clone_far_'s code misses, 0.002 at A) makes
    # up the original's 0.0034 at the largest LL less the clone's rest there (0.0004), and the
    # rings A's code side less the ring's change
    tc = target | {"IL_misses_per_request": 0.012, tune.PERSISTENT_IL_KEY: 0.0034}
    mc = m | {"IL_misses_per_request": 0.010, tune.PERSISTENT_IL_REST_KEY: 0.0004}
    far, llc = {"DLmr": 0.02, "ILmr": 0.002}, {"DLmr": 0.015, "ILmr": 0.006}
    kc = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(kc, mc, tc, far, llc, *args[2:])
    assert kc["cold_code_scale"] == pytest.approx(0.003 / 0.002)
    assert kc["code_llc_scale"] == pytest.approx((0.012 - (0.010 - 0.006) - 0.001) / 0.006)
    # not measured there yet, or no code rings (redis: the cold ring is A's knob): as before
    kc0 = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(kc0, m | {"IL_misses_per_request": 0.010}, tc, far, llc, *args[2:])
    assert kc0["cold_code_scale"] == 1.0
    assert kc0["code_llc_scale"] == pytest.approx((0.012 - 0.004) / 0.006)
    kr = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(kr, mc, tc | {"IL_ring_bins": 0.0}, far, llc, *args[2:])
    assert kr["cold_code_scale"] == pytest.approx(0.012 / 0.010)
    # the clone not yet measured there: the skeleton's estimate of its rest, as before
    k2 = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(k2, m, target | {tune.PERSISTENT_KEY: 0.006, "skeleton_DL_persistent": 0.001}, *args)
    assert k2["data_ll_scale"] == pytest.approx((0.006 - 0.001) / 0.016)


def test_a_bimodal_originals_target_at_the_largest_ll_is_drawn_mode_by_mode():
    """tune.balanced_persistent (session 43): redis's code misses a window are 80 or 150 at A and
    74 or 138 at 8 MiB. A loop whose pool at A drew the upper mode once in six windows and whose
    pool at 8 MiB drew it three times in four reads more at 8 MiB than at A (session 42: 112
    against 110), and the cold ring aimed at that left the code rings nothing to keep. Mode by
    mode, weighed as A's windows hold the modes, the target there is 0.92 of A's; before the loop
    has both modes on both sides, the sweep's balanced ratio; one mode (memcached) or a corrupt
    sweep: nothing, and the absolute pool stands."""
    from tailscope.clone import tune

    def ws(pairs):
        rest = dict.fromkeys(("instructions_per_request", "data_refs_per_request", "I1_miss_rate", "D1_miss_rate"), 0.0)
        return [
            {**rest, "IL_misses_per_request": il / 6000, "DL_misses_per_request": dl / 6000, "requests": 6000}
            for il, dl in pairs
        ]

    mb = 1 << 20
    sweep = {
        "sizes": [2 * mb, 4 * mb, 8 * mb],
        "IL": [0.02, 0.019, 0.0186],
        "DL": [0.016, 0.01, 0.0064],
        "modes": [None, [6, 2]],
    }
    vgp = {"ll_sweep": sweep, "anchors_paired": True}
    at_a = ws([(80, 60)] * 5 + [(150, 110)])
    at_8 = ws([(74, 24), (138, 46), (138, 46), (138, 46)])
    target = {"IL_misses_per_request": (5 * 80 + 150) / 6 / 6000, "DL_misses_per_request": (5 * 60 + 110) / 6 / 6000}
    pooled = sum(w["IL_misses_per_request"] for w in at_8) / 4
    assert pooled > target["IL_misses_per_request"]  # the pools' shares differ: 8 MiB reads more
    got = tune.balanced_persistent(vgp, target, at_a, at_8)
    want_il = (5 * 74 + 138) / (5 * 80 + 150)
    assert got["IL_persistent_ratio"] == pytest.approx(want_il) and 0.91 < want_il < 0.93
    assert got[tune.PERSISTENT_IL_KEY] == pytest.approx(target["IL_misses_per_request"] * want_il)
    assert got[tune.PERSISTENT_KEY] == pytest.approx(target["DL_misses_per_request"] * (5 * 24 + 46) / (5 * 60 + 110))
    # the loop's windows at 8 MiB in one mode so far: the sweep's ratio (0.93 code, 0.40 data)
    early = tune.balanced_persistent(vgp, target, at_a, at_8[1:3])
    assert early["IL_persistent_ratio"] == pytest.approx(0.93) and early["DL_persistent_ratio"] == pytest.approx(0.4)
    assert tune.balanced_persistent(vgp, target, at_a, [])["IL_persistent_ratio"] == pytest.approx(0.93)
    # a sweep that ran alone (memcached's: its ratio and the target at A were drawn in different
    # conditions), one mode in the sweep, no modes kept (an old profile), a corrupt sweep: {}
    assert tune.balanced_persistent({"ll_sweep": sweep, "anchors_paired": False}, target, at_a, at_8) == {}
    assert tune.balanced_persistent({"ll_sweep": sweep}, target, at_a, at_8) == {}
    vgp = {"anchors_paired": True}
    assert tune.balanced_persistent(vgp | {"ll_sweep": {**sweep, "modes": [None, None]}}, target, at_a, at_8) == {}
    nomodes = {k: v for k, v in sweep.items() if k != "modes"}
    assert tune.balanced_persistent(vgp | {"ll_sweep": nomodes}, target, at_a, at_8) == {}
    assert tune.balanced_persistent(vgp | {"ll_sweep": {**sweep, "IL": [0.0, 1.0, 1.0]}}, target, at_a, at_8) == {}
    assert tune.balanced_persistent(vgp | {"ll_sweep": {**sweep, "DL": ["x"]}}, target, at_a, at_8) == {}
    assert tune.balanced_persistent(vgp | {"ll_sweep": None}, target, at_a, at_8) == {}


def test_the_tuning_loop_measures_an_unpaired_original_at_the_sweeps_largest_ll(monkeypatch, tmp_path):
    """tune.tune (session 39): for an original whose LL sweep ran alone, each iteration runs a
    third set, all at A's L1s and the sweep's largest LL, the clone's window beside two of the
    original's (session 41: PERSISTENT_ORIGINALS); the original's windows there pool with the
    sweep's into the persistent target, the clone's (this build's) give its figure there, and the
    progress line shows the error. A paired sweep runs the same set (session 42)."""
    from tailscope.clone import tune
    from tailscope.clone import valgrind as vg

    def counts(dl):
        return {"Ir": 8_000_000, "Dr": 3_000_000, "Dw": 1_000_000, "I1mr": 40_000, "D1mr": 60_000}.copy() | {
            "ILmr": 70,
            "DLmr": dl,
            "Bc": 800_000,
            "Bcm": 40_000,
        }

    mb = 1 << 20
    seen = []

    def side_by_side(jobs):
        seen.append((*(j["tag"] for j in jobs), jobs[0]["cache"]["LL"]))
        assert all(j["cache"] == jobs[0]["cache"] != vg.CONFIG_B for j in jobs)
        if jobs[0]["tag"].endswith("-ll"):
            assert [j["launch"] for j in jobs[1:]] == [{"argv": ["orig"]}] * (len(jobs) - 1)
            return [
                _fake_window(6000, {1: counts(12)}),
                _fake_window(6000, {1: counts(3)}),
                _fake_window(6000, {1: counts(4)}),
            ][: len(jobs)]
        assert len(jobs) == 2
        return [_fake_window(6000, {1: counts(27)}), _fake_window(6000, {1: counts(27)})]

    monkeypatch.setattr(vg, "side_by_side", side_by_side)
    monkeypatch.setattr(generate, "generate", lambda *a, **k: {"thread_map": [], "targets": {}})
    monkeypatch.setattr(generate, "build", lambda d: 0.1)
    wins = [vg.metrics(_fake_window(6000, {1: counts(27)})) | {"requests": 6000} for _ in range(6)]
    sweep = {
        "sizes": [2 * mb, 4 * mb, 8 * mb],
        "IL": [70 / 6000] * 3,
        "DL": [27 / 6000, 9 / 6000, 6 / 6000],
        "raw": {"IL": [70 / 6000] * 2, "DL": [8 / 6000, 5 / 6000]},
        "windows": [6, 10, 10],
    }
    prof = {
        "valgrind": {
            "metrics": vg.pool_metrics(wins),
            "windows": wins,
            "rate": 400,
            "window_requests": 6000,
            "ll_sweep": sweep,
            "anchors_paired": False,
        },
        "listen": {"port": 11211},
        "load": {"args": []},
        "private": {"launch": {"argv": ["orig"]}},
        "body": {},
    }
    msgs: list[str] = []
    res = tune.tune(prof, tmp_path, msgs.append)
    n = res["iterations"]
    assert res["persistent_ll_windows"] == 2 * n == 12
    assert [s for s in seen if s[0].endswith("-ll")] == [
        (f"tune{i}-ll", f"tune{i}-ll-original", f"tune{i}-ll-original2", "8388608,16,64") for i in range(1, 7)
    ]
    # (session 47) that set is the I1 at half too: no pair of its own, and both originals pool
    # into the half-I1 target
    assert not any(s[0].endswith("-half") for s in seen) and len(seen) == 2 * n
    assert tune.second_config(tune.persistent_ll_config(prof["valgrind"])) == {
        "I1": "16384,8,64",
        "D1": "45056,11,64",
        "LL": "8388608,16,64",
    }
    assert res["target"][tune.HALF_I1_KEY] == pytest.approx(40_000 / 8_000_000)
    # the sweep's 10 raw windows at 5 misses and the loop's 6 + 6 at 3 and 4; the code side's at 70
    assert res["target"][tune.PERSISTENT_KEY] == pytest.approx((10 * 5 + 6 * 3 + 6 * 4) / (22 * 6000))
    assert res["target"][tune.PERSISTENT_IL_KEY] == pytest.approx(70 / 6000)
    last = res["history"][-1]["metrics"]
    assert last[tune.PERSISTENT_KEY] == pytest.approx(12 / 6000)
    # (the fake windows have no clone_far_ functions: all of the clone's misses there are its rest)
    assert last[tune.PERSISTENT_REST_KEY] == pytest.approx(12 / 6000)
    assert last[tune.PERSISTENT_IL_REST_KEY] == pytest.approx(70 / 6000)
    assert f"DL at 8 MiB {100 * (12 / (92 / 22) - 1):.1f}%, IL at 8 MiB 0.0%" in msgs[-1], msgs[-1]
    # each iteration keeps the LL parts its steps were taken on (none here: no clone functions)
    assert res["history"][0]["ll_parts"] == dict.fromkeys(
        ("data_rings", "data_far", "data_farp", "code_rings", "code_far"), 0.0
    )
    split = {
        "llc": {"DLmr": 0.002, "DLmw": 0.001, "ILmr": 0.004},
        "far": {"DLmr": 0.0005, "DLmw": 0.0001, "ILmr": 0.003},
        "farp": {"DLmr": 0.0002},
    }
    assert tune.ll_parts(split) == pytest.approx(
        {"data_rings": 0.003, "data_far": 0.0006, "data_farp": 0.0002, "code_rings": 0.004, "code_far": 0.003}
    )
    # a paired sweep (a single-threaded original): the same set (session 42), with one original
    # beside the clone, two copies at once as its sweep and its validation ran (session 43)
    seen.clear()
    prof["valgrind"]["anchors_paired"] = True
    res = tune.tune(prof, tmp_path, msgs.append)
    first = next(s for s in seen if s[0].endswith("-ll"))
    assert first == ("tune1-ll", "tune1-ll-original", "8388608,16,64")
    assert res["persistent_ll_windows"] == res["iterations"]
    n = res["iterations"]
    assert res["target"][tune.PERSISTENT_KEY] == pytest.approx((10 * 5 + n * 3) / ((10 + n) * 6000))
    # a profile without a sweep: none
    seen.clear()
    prof["valgrind"]["ll_sweep"] = None
    res = tune.tune(prof, tmp_path, msgs.append)
    assert not any(s[0].endswith("-ll") for s in seen) and tune.PERSISTENT_KEY not in res["target"]
    assert res["persistent_ll_windows"] == 0


def test_ll_rest_is_pooled_over_the_loops_windows():
    # (session 48) the misses no LL knob moves are each window's total less the knobs' parts;
    # an iteration's LL metrics are its parts plus the rest's mean over all of the loop's windows
    from tailscope.clone import tune

    parts = {"data_rings": 2e-4, "data_far": 5e-4, "data_farp": 0.0, "code_rings": 17e-4, "code_far": 10e-4}
    m = {
        "IL_misses_per_request": 29e-4,  # a rest of 2
        "DL_misses_per_request": 8e-4,  # a rest of 1
        "LL_miss_rate": 37e-4 / 10_000,
        "instructions_per_request": 7_000.0,
        "data_refs_per_request": 3_000.0,
    }
    rest = tune.ll_rest(m, parts)
    assert rest == pytest.approx({"IL": 2e-4, "DL": 1e-4})
    # (a window whose parts exceed its total: no negative rest)
    assert tune.ll_rest({"IL_misses_per_request": 1e-4}, parts) == {"IL": 0.0, "DL": 0.0}
    rests = [rest, {"IL": 4e-4, "DL": 3e-4}, {"IL": 4.8e-4, "DL": 2e-4}]
    s = tune.smooth_ll(m, parts, rests)
    assert s["IL_misses_per_request"] == pytest.approx(27e-4 + 3.6e-4)
    assert s["DL_misses_per_request"] == pytest.approx(7e-4 + 2e-4)
    assert s["LL_miss_rate"] == pytest.approx((30.6e-4 + 9e-4) / 10_000)
    # the window's own figures are kept, and smoothing again starts from them, not from the last
    assert s["IL_misses_per_request_window"] == m["IL_misses_per_request"]
    assert s["LL_miss_rate_window"] == m["LL_miss_rate"]
    again = tune.smooth_ll(s, parts, rests[:1])
    assert again["IL_misses_per_request"] == pytest.approx(m["IL_misses_per_request"])
    assert tune.smooth_ll(m, parts, []) is m


def test_d1_tuning_step_per_body():
    """With per-body D1 targets the D1 knob moves per body (data_far_scale:<body>), each on its own
    threads' misses: memcached's one factor matched the total at A with the timer 41% over its
    original and the workers 10% under theirs. Without targets, the one knob as before."""
    from tailscope.clone import tune

    knobs = dict(generate.DEFAULT_KNOBS)
    target = {"D1_miss_rate": 0.016}
    m = {"D1_miss_rate": 0.016}  # the total is right
    split = {"threads": {"worker": {"D1m": 36.0}, "bg3": {"D1m": 20.0}}, "far": {}}
    k = tune.update_knobs(knobs, m, target, split, {}, {"worker": 42.0, "bg3": 14.0})
    assert k["data_far_scale:worker"] == pytest.approx((42 / 36) ** 0.7)
    assert k["data_far_scale:bg3"] == pytest.approx((14 / 20) ** 0.7)
    assert k["data_far_scale"] == knobs["data_far_scale"]
    # the generator reads the per-body knob (asmgen.body_knob) before the global one
    assert asmgen.body_knob(k, "data_far_scale", "bg3") == pytest.approx(0.7**0.7)
    # the clone makes 12% more data references than the original: the judged figure is the rate
    # (misses per reference), so each body's target is taken at the clone's references (session 23)
    refs = {"data_refs_per_request": 3500.0}
    k = tune.update_knobs(knobs, m | {"data_refs_per_request": 3920.0}, target | refs, split, {}, {"worker": 42.0})
    assert k["data_far_scale:worker"] == pytest.approx((1.12 * 42 / 36) ** 0.7)
    k = tune.update_knobs(knobs, {"D1_miss_rate": 0.032}, target, split, {})
    assert k["data_far_scale"] == pytest.approx(knobs["data_far_scale"] * 0.5**0.7)
    assert not any(key.startswith("data_far_scale:") for key in k)


def test_original_spread_is_the_pooled_means_uncertainty():
    """validate.mean_spread / original_spread: two windows give the sessions 7-8 spread |a-b|/mean;
    more windows of the same scatter make the pooled mean surer (a smaller spread); the profile's
    windows of the original at A join the deviation, so a drift between them and the validation
    shows up in the spread instead of in the clone's error."""
    from tailscope.clone import validate

    assert abs(validate.mean_spread([0.015, 0.017], 2) - validate.spread(0.015, 0.017)) < 1e-12
    four = [0.015, 0.017, 0.015, 0.017]
    assert validate.mean_spread(four, 4) < validate.spread(0.015, 0.017)
    assert validate.mean_spread([0.02, 0.02, 0.02], 3) == 0.0
    runs = [{"D1_miss_rate": v} for v in (0.0157, 0.0158, 0.0159)]
    side = {"D1_miss_rate": 0.0158, "runs": runs}
    alone = validate.original_spread(side, "D1_miss_rate")
    assert alone < 0.02, alone
    side["profile_runs"] = [{"D1_miss_rate": v} for v in (0.0183, 0.0179, 0.0177)]
    with_profile = validate.original_spread(side, "D1_miss_rate")
    # the deviation over all six windows, the standard error of the three pooled ones: ~8.2%
    assert abs(with_profile - 0.0823) < 0.001, with_profile
    assert with_profile > 5 * alone
    # a clone 16% off is judged and fails either way (the spread is within the limit)
    assert validate.verdict([("cache A", 0.16, with_profile)], 0.10)["holds"] is False
    # a larger drift between the profile's and the validation's windows: the row is not judged
    side["profile_runs"] = [{"D1_miss_rate": v} for v in (0.0203, 0.0199, 0.0197)]
    drift = validate.original_spread(side, "D1_miss_rate")
    assert validate.verdict([("cache A", 0.16, alone)], 0.10)["holds"] is False
    assert validate.verdict([("cache A", 0.16, drift)], 0.10)["holds"] is None, drift


def test_original_spread_widens_where_the_windows_run_in_stretches():
    """validate.autocorrelation_factor (session 40): neighbouring windows of the validation share
    the host's slow stretches (redis's data side at A, session 38: lag-1 autocorrelation 0.50), so
    the standard error of their mean is wider than that of as many independent windows. The same
    values in another order keep the independent spread; a negative lag-1 never narrows it."""
    from tailscope.clone import validate

    stretches = [100.0] * 6 + [140.0] * 6 + [100.0] * 6 + [140.0] * 6  # slow stretches of six
    alternating = [100.0, 140.0] * 12
    assert sorted(stretches) == sorted(alternating)
    r = validate.lag1(stretches)
    assert 0.6 < r <= validate.MAX_LAG1, r
    assert validate.lag1(alternating) == 0.0  # -1, clipped: never narrower than independent
    assert validate.autocorrelation_factor(alternating) == 1.0
    assert validate.autocorrelation_factor(stretches) == pytest.approx(((1 + r) / (1 - r)) ** 0.5)

    def side(vals):
        return {"LL_miss_rate": sum(vals) / len(vals), "runs": [{"LL_miss_rate": v} for v in vals]}

    plain = validate.original_spread(side(alternating), "LL_miss_rate")
    wide = validate.original_spread(side(stretches), "LL_miss_rate")
    assert plain == pytest.approx(validate.mean_spread(alternating, 24))
    assert wide == pytest.approx(plain * validate.autocorrelation_factor(stretches))
    # a clone 11% off: judged and failing against independent windows, not judged against stretches
    assert plain < 0.10 < wide
    assert validate.verdict([("cache A", 0.11, plain)], 0.10)["holds"] is False
    assert validate.verdict([("cache A", 0.11, wide)], 0.10)["holds"] is None
    # the profile's windows, which ran apart, widen the deviation but not the autocorrelation
    s2 = side(alternating) | {"profile_runs": [{"LL_miss_rate": v} for v in [100.0] * 8 + [140.0] * 8]}
    assert validate.original_spread(s2, "LL_miss_rate") == pytest.approx(
        validate.mean_spread([*alternating, *[100.0] * 8, *[140.0] * 8], 24)
    )
    # too few windows to tell, a corrupt figure, no spread, an extreme run: bounded, never a crash
    assert validate.lag1(stretches[:7]) == 0.0
    assert validate.lag1([*stretches, float("nan")]) == 0.0
    assert validate.lag1([5.0] * 20) == 0.0
    assert validate.lag1([float(i) for i in range(40)]) == validate.MAX_LAG1
    assert validate.autocorrelation_factor([float(i) for i in range(40)]) == pytest.approx(3.0)


def test_the_original_spread_at_a_draws_on_the_tuning_loops_windows(tmp_path):
    """validate.loop_windows (session 42): the original's windows at A that the tuning loop ran
    beside the clone join the deviation of its spread at A, as the profile's do. memcached's data
    side at A is bimodal a window; seven validation windows that all missed the upper mode, with
    six of the profile's that did too, judged a clone at the mixture's mean as failing."""
    import json

    from tailscope.clone import report, validate
    from tailscope.clone.errors import CloneError

    def w(ll):
        return {"LL_miss_rate": ll, "requests": 5855.0}

    prof = [w(v) for v in (100.0, 104.0, 98.0, 101.0, 99.0, 103.0)]  # the profile's: all low
    loop = [w(v) for v in (100.0, 160.0, 102.0, 99.0, 158.0, 101.0, 97.0, 162.0, 100.0, 103.0)]
    vgp = {"windows": prof}
    priv = tmp_path / "private"
    priv.mkdir()
    # no tuning record (a clone tuned without the original): the profile's windows alone
    assert validate.loop_windows(tmp_path, vgp) == prof
    (priv / "tuning.json").write_text(json.dumps({"target_windows": [*prof, *loop]}))
    assert validate.loop_windows(tmp_path, vgp) == [*prof, *loop]
    # a record of another profile's: its windows say nothing of this one
    assert validate.loop_windows(tmp_path, {"windows": [w(90.0), *prof[1:]]}) == [w(90.0), *prof[1:]]
    # a record from before the windows were kept
    (priv / "tuning.json").write_text(json.dumps({"iterations": 3}))
    assert validate.loop_windows(tmp_path, vgp) == prof
    # corrupt: one line each, never a traceback or a silent pass
    for bad in ("{", json.dumps({"target_windows": 5}), json.dumps({"target_windows": [*prof, {"LL_miss_rate": "x"}]})):
        (priv / "tuning.json").write_text(bad)
        with pytest.raises(CloneError, match=r"tuning\.json is corrupt"):
            validate.loop_windows(tmp_path, vgp)
    (priv / "tuning.json").write_text(json.dumps({"target_windows": [*prof, *loop]}).replace("160.0", "NaN"))
    with pytest.raises(CloneError, match="finite"):
        validate.loop_windows(tmp_path, vgp)

    # seven validation windows in the lower mode: with the profile's alone the spread is small and
    # a clone at the mixture's mean (~+18%) is judged and fails; with the loop's windows, which
    # caught the upper mode three times in ten, the row is not judged. The mean stays the
    # validation's own
    runs = [w(v) for v in (99.0, 102.0, 100.0, 101.0, 98.0, 103.0, 100.0)]
    side = {"LL_miss_rate": 100.4, "runs": runs, "profile_runs": prof}
    narrow = validate.original_spread(side, "LL_miss_rate")
    wide = validate.original_spread(side | {"profile_runs": [*prof, *loop]}, "LL_miss_rate")
    assert narrow < 0.02 and wide > 0.12, (narrow, wide)
    assert validate.verdict([("cache A", 0.18, narrow)], 0.10)["holds"] is False
    assert validate.verdict([("cache A", 0.18, wide)], 0.10)["holds"] is None
    # and the report says what the spread at A drew on
    res = {"simulated": {"A": {"original": side | {"profile_runs": [*prof, *loop]}}}}
    assert "its 16 windows there before the validation" in report.windows_note(res)


def test_original_spread_pools_the_deviation_over_hierarchies():
    """validate.pooled_deviation (session 26): the original's window-to-window deviation is the
    service's, not the cache's. A rare stretch in about half of redis's windows adds ~50% to its
    LL misses at every hierarchy; six windows at B that all missed it must not make the row look
    settled (their own deviation is 0), and the stopping rule must run on at B."""
    from tailscope.clone import validate

    def side(vals, profile=()):
        return {
            "LL_miss_rate": sum(vals) / len(vals),
            "runs": [{"LL_miss_rate": v} for v in vals],
            "profile_runs": [{"LL_miss_rate": v} for v in profile],
        }

    a = side([80, 142, 80, 80, 142, 80], profile=[80, 142, 80, 142, 142, 80])
    b_lucky = side([74.0] * 6)
    assert validate.original_spread(b_lucky, "LL_miss_rate") == 0.0  # its own windows alone
    pooled = validate.original_spread(b_lucky, "LL_miss_rate", [a])
    # A's twelve windows deviate ~29% from their mean (df 11); with B's six (df 5, no deviation)
    # the pooled deviation is ~25%, two standard errors over six windows ~20%
    twelve = [80, 142, 80, 80, 142, 80, 80, 142, 80, 142, 142, 80]  # 5 of 12 in the mode
    dev = validate.pooled_deviation([twelve, [74.0] * 6])
    ss = sum((v / (1270 / 12) - 1) ** 2 for v in twelve)
    assert dev == pytest.approx((ss / 16) ** 0.5)
    assert pooled == pytest.approx(2 * dev / 6**0.5) and pooled > 0.15
    # a clone at the mixture's mean is 20% off the lucky six: no longer judged on them
    assert validate.verdict([("cache B", 0.2, pooled)], 0.10)["holds"] is None
    assert validate.verdict([("cache B", 0.2, 0.0)], 0.10)["holds"] is False
    # the pooled figure never lowers a side's own spread (A keeps its own, the larger)
    assert validate.original_spread(a, "LL_miss_rate", [b_lucky]) == pytest.approx(
        validate.original_spread(a, "LL_miss_rate")
    )
    # too few windows anywhere: no pooled figure, the side's own spread stands
    assert validate.pooled_deviation([[1.0], [2.0], [3.0, 3.0]]) is None
    assert validate.pooled_deviation([[0.0, 0.0, 0.0]]) is None
    # errors() pools each hierarchy's original with the others
    res = {"levels": {}, "simulated": {"A": {"original": a, "clone": a}, "B": {"original": b_lucky, "clone": a}}}
    e = validate.errors(res)
    assert e["original_spread"]["simulated"]["B"]["LL_miss_rate"] == pytest.approx(pooled)
    # the stopping rule at B reads A's windows too: six lucky windows are not enough
    why, need = validate.unjudgeable_sim_rows(b_lucky, [a])
    assert "LL miss rate spread" in why and need == validate.windows_needed(b_lucky, pooled, 0.10) > 6
    assert validate.unjudgeable_sim_rows(b_lucky) == ("", 0)


def test_native_part_of_the_validation_is_checked(tmp_path):
    """validate.load_native_part: `clone-report --part simulated` reads the saved native part; a
    missing, corrupt or stale one (the clone rebuilt after it) is a one-line error."""
    import json
    import os

    from tailscope.clone import validate

    (tmp_path / "private").mkdir()
    with pytest.raises(CloneError, match=r"no native part: run .*--part native"):
        validate.load_native_part(tmp_path)
    nat = tmp_path / "private" / "validation-native.json"
    nat.write_text("{not json")
    with pytest.raises(CloneError, match="corrupt: not JSON"):
        validate.load_native_part(tmp_path)
    nat.write_text(json.dumps({"levels": {"low": {}}}))
    with pytest.raises(CloneError, match="corrupt: no 'levels' or 'rates'"):
        validate.load_native_part(tmp_path)
    nat.write_text(json.dumps({"levels": {"low": {}}, "rates": {"low": 100.0}}))
    exe = tmp_path / "clone"
    exe.write_text("")
    os.utime(exe, (1_000_000, 1_000_000))
    os.utime(nat, (2_000_000, 2_000_000))
    assert validate.load_native_part(tmp_path)["rates"] == {"low": 100.0}
    os.utime(exe, (3_000_000, 3_000_000))  # rebuilt after the native part was measured
    with pytest.raises(CloneError, match="older than"):
        validate.load_native_part(tmp_path)
    with pytest.raises(CloneError, match="--part bogus"):
        validate.validate({}, tmp_path, print, part="bogus")
    with pytest.raises(CloneError, match="--idle bogus: one of poll, halt"):
        validate.validate({}, tmp_path, print, idle="bogus")


def _cpu_latency_request(dev) -> int:
    import os
    import struct

    fd = os.open(dev, os.O_RDONLY)
    try:
        return struct.unpack("i", os.read(fd, 4))[0]
    finally:
        os.close(fd)


def test_cpus_awake_holds_the_idle_state_and_lets_it_go(tmp_path):
    """runner.cpus_awake (session 27): "poll" holds a CPU latency request of 0 µs while the block
    runs and lifts it after (also when the block raises); "halt" touches nothing; a device that
    cannot be opened falls back to halt, with the reason, for the report; an unknown mode is an
    error."""
    from tailscope.clone import report, runner

    with pytest.raises(CloneError, match="--idle spin: one of poll, halt"):
        with runner.cpus_awake("spin"):
            pass
    missing = tmp_path / "no-such-device"
    drv = tmp_path / "current_driver"  # the request is held where a cpuidle driver reads it
    drv.write_text("haltpoll\n")
    with runner.cpus_awake("poll", device=missing, driver=drv) as how:
        assert how.startswith("halt (could not hold the CPUs awake:") and "No such file" in how
    assert "No such file" in report.idle_note({"idle": how})
    with runner.cpus_awake("halt", device=missing) as how:
        assert how == "halt"
    assert "wake-up" in report.idle_note({"idle": how})
    assert report.idle_note({}) == ""
    dev = runner.CPU_DMA_LATENCY
    if not dev.exists():
        pytest.skip(f"{dev} is missing: this kernel has no CPU latency QoS")
    try:
        before = _cpu_latency_request(dev)
    except PermissionError:
        pytest.skip(f"{dev} needs root")
    with runner.cpus_awake("poll", driver=drv) as how:
        assert how == "poll"
        assert _cpu_latency_request(dev) == 0
    assert "polled" in report.idle_note({"idle": how})
    assert _cpu_latency_request(dev) == before
    with pytest.raises(RuntimeError):
        with runner.cpus_awake("poll", driver=drv):
            assert _cpu_latency_request(dev) == 0
            raise RuntimeError("the timed runs failed")
    assert _cpu_latency_request(dev) == before


def _spinner_pids(parent: int) -> list[int]:
    """The SCHED_IDLE children of `parent` (runner._spinners')."""
    import os

    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            st = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        f = st[st.rfind(")") + 2 :].split()
        try:
            if int(f[1]) == parent and f[0] not in "ZX" and os.sched_getscheduler(int(d)) == os.SCHED_IDLE:
                out.append(int(d))
        except OSError:  # exited meanwhile
            pass
    return out


def _running(pid: int) -> bool:
    try:
        st = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return st[st.rfind(")") + 2] not in "ZX"


def test_without_a_cpuidle_driver_the_servers_cpu_spins_instead(tmp_path):
    """Session 33: a kernel without a cpuidle driver halts its idle CPUs whatever latency is
    requested, and the results said "poll" over CPUs that halted. There `cpus_awake` keeps each CPU
    of `spin_cpus` busy with a SCHED_IDLE loop pinned to it for the block, says so, and stops it
    after; with no CPU to spin it says the CPUs halted, and why. A spinner whose parent dies exits
    on its own."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tailscope.clone import report, runner

    none = tmp_path / "current_driver"
    none.write_text("none\n")
    assert runner.cpuidle_driver(none) is None and runner.cpuidle_driver(tmp_path / "missing") is None
    with runner.cpus_awake("poll", device=tmp_path / "no-device", driver=none) as how:
        assert how.startswith("halt (this kernel has no cpuidle driver")
    assert "halted" in report.idle_note({"idle": how})
    with runner.cpus_awake("poll", spin_cpus=(0,), driver=none) as how:
        assert how.startswith("poll (a SCHED_IDLE spinner on CPU 0: this kernel has no cpuidle driver")
        deadline = time.monotonic() + 5
        while not (pids := _spinner_pids(os.getpid())) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(pids) == 1, pids
        assert os.sched_getaffinity(pids[0]) == {0}
    assert _spinner_pids(os.getpid()) == []
    note = report.idle_note({"idle": how})
    assert note.startswith("The CPUs did not halt when idle: a SCHED_IDLE spinner on CPU 0")
    # a validator killed outright: its spinner sees its parent gone and exits
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from pathlib import Path\n"
        "from tailscope.clone import runner\n"
        "with runner.cpus_awake('poll', spin_cpus=(0,), driver=Path(sys.argv[2])):\n"
        "    print('in', flush=True); time.sleep(60)\n"
    )
    python_dir = str(Path(runner.__file__).resolve().parents[2])
    parent = subprocess.Popen([sys.executable, "-c", code, python_dir, str(none)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "in"
        deadline = time.monotonic() + 5
        while not (pids := _spinner_pids(parent.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(pids) == 1, pids
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while _running(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(pids[0]), "the spinner outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


@needs_valgrind
@needs_gcc
def test_ll_conflict_rings_miss_the_profiled_ll_only_and_scale_with_their_knobs(tmp_path):
    """The LL conflict rings (session 10): a generated mix of code- and data-side LL misses per
    event, by the LL size at which they hit (the profile's LL sweep bins), is recovered per side
    at the profiled 2 MiB LL, is gone at the LL size of its bin (the 4 MiB bin's at 4 MiB, all at
    8 MiB), and each side's misses are linear in its own knob (code_llc_scale, data_llc_scale)."""
    spec = _spec(
        instructions=3000,
        chunk_insns=5,
        icode_bins=[(2048, 1.0)],
        llc_code=[(4 << 20, 0.3), (8 << 20, 0.2)],
        llc_data=[(4 << 20, 0.1), (8 << 20, 0.25)],
    )
    calls = 1200

    def measure(d, knobs, lls):
        asmgen.write_standalone(spec, d, seed=6, calls=calls, knobs=knobs)
        got = {}
        for ll in lls:
            tc = _cg_run(d, d / "harness", calls, f"ll{ll >> 20}", ("--cache-sim=yes", f"--LL={ll},16,64"))
            # the first 120 events fill the rings (a line's first fetch misses any LL)
            got[ll >> 20] = (tc.fn_total("ILmr", "clone_llc"), tc.fn_total("DLmr", "clone_llc"))
        return got

    got = measure(tmp_path / "a", {}, (2 << 20, 4 << 20, 8 << 20))
    warm = 60 + 60  # cold first fetches of the rings' lines (K = 30 and 60 per side)
    code2, data2 = got[2]
    assert abs(code2 / calls - 0.5) <= 0.05 * 0.5 + warm / calls, got
    assert abs(data2 / calls - 0.35) <= 0.05 * 0.35 + warm / calls, got
    # at 4 MiB the 4 MiB bin hits: the 8 MiB bin's misses (and the first fetches) are left
    code4, data4 = got[4]
    assert abs(code4 / calls - 0.2) <= 0.05 * 0.2 + warm / calls, got
    assert abs(data4 / calls - 0.25) <= 0.05 * 0.25 + warm / calls, got
    # at 8 MiB only the first fetches of the rings' lines miss
    assert got[8][0] <= warm and got[8][1] <= warm, got
    # each side's knob scales its own side only
    got2 = measure(tmp_path / "b", {"code_llc_scale": 2.0, "data_llc_scale": 0.5}, (2 << 20,))
    code2b, data2b = got2[2]
    assert abs(code2b / calls - 1.0) <= 0.05 + warm / calls, (got, got2)
    assert abs(data2b / calls - 0.175) <= 0.05 * 0.175 + warm / calls, (got, got2)


def test_the_cold_code_is_capped_at_the_code_misses_no_swept_ll_keeps():
    """generate._cap_cold_code: the cold ring's fetches miss every LL, so all bodies' cold lines
    per request are scaled, in proportion, to the original's code misses at its largest swept LL:
    down, and since session 24 up (by at most COLD_RAISE_MAX); no LL sweep leaves them as counted."""

    def specs(a, b):
        w, t = _spec(name="worker", cold_code_lines=a), _spec(name="timer", cold_code_lines=b)
        t.events_per_request = 3.0
        return {0: w, 1: t}

    prof = {"valgrind": {"ll_sweep": {"sizes": [2 << 20, 4 << 20, 8 << 20], "IL": [0.014, 0.0126, 0.0127]}}}
    sp = specs(0.01, 0.002)  # 0.016 per request
    generate._cap_cold_code(sp, prof)
    # (0.0126 and 0.0127 rise: the non-increasing fit takes their mean for both)
    assert sp[0].cold_code_lines + 3 * sp[1].cold_code_lines == pytest.approx(0.01265)
    assert sp[0].cold_code_lines / sp[1].cold_code_lines == pytest.approx(5.0)
    # fewer first fetches than the sweep's persistent misses are raised to them (session 24), by at
    # most COLD_RAISE_MAX
    sp = specs(0.008, 0.0)
    generate._cap_cold_code(sp, prof)
    assert sp[0].cold_code_lines == pytest.approx(0.01265) and sp[1].cold_code_lines == 0.0
    sp = specs(0.003, 0.0)
    generate._cap_cold_code(sp, prof)
    assert sp[0].cold_code_lines == pytest.approx(0.003 * generate.COLD_RAISE_MAX)
    sp = specs(0.0, 0.0)  # no first fetches at all: nothing to scale
    generate._cap_cold_code(sp, prof)
    assert sp[0].cold_code_lines == 0.0
    # what the skeleton alone misses at that LL is left to it (session 25)
    sp = specs(0.01, 0.0)
    generate._cap_cold_code(sp, prof, 0.00265)
    assert sp[0].cold_code_lines == pytest.approx(0.01)
    sp = specs(0.01, 0.0)
    generate._cap_cold_code(sp, prof, 0.02)
    assert sp[0].cold_code_lines == 0.0
    assert generate._skeleton_ll({"_ll": {"IL_at_max": 0.001}}) == {"IL_at_max": 0.001}
    assert generate._skeleton_ll({"worker": {}}) == {}
    with pytest.raises(CloneError, match="corrupt"):
        generate._skeleton_ll({"_ll": {"IL_at_max": "x"}})
    for bad in ({}, {"valgrind": {"ll_sweep": {"sizes": [2 << 20], "IL": [0.001]}}}):
        sp = specs(0.01, 0.002)
        generate._cap_cold_code(sp, bad)
        assert (sp[0].cold_code_lines, sp[1].cold_code_lines) == (0.01, 0.002)


def test_ll_sweep_bins_and_the_split_tuning_step():
    """The LL sweep as bins per side (non-increasing, the last size's misses persistent), and the
    tuning step that moves each side's own knob: code-side misses from the code rings, the
    data-side persistent share from the walkers, the rest from the data rings."""
    from tailscope.clone import tune

    sw = {"sizes": [2 << 20, 4 << 20, 8 << 20], "IL": [0.014, 0.006, 0.003], "DL": [0.009, 0.0095, 0.001]}
    b = generate.llc_bins(sw)
    assert b["code"] == [(4 << 20, pytest.approx(0.008)), (8 << 20, pytest.approx(0.003))]
    # a draw that missed more at 4 MiB is pooled with the point before it (the least-squares
    # non-increasing fit, session 22): no bin at 4 MiB, and both points at their mean
    assert b["data"] == [(8 << 20, pytest.approx(0.00825))]
    assert b["persistent"]["data"] == pytest.approx(0.001 / 0.00925)
    assert b["persistent"]["code"] == pytest.approx(0.003 / 0.014)
    assert b["persistent_misses"] == {"code": pytest.approx(0.003), "data": pytest.approx(0.001)}
    assert generate.llc_bins(None) == {"code": [], "data": [], "persistent": {}, "persistent_misses": {}}
    with pytest.raises(CloneError, match="ll_sweep IL or sizes hold a non-number: corrupt profile"):
        generate.llc_bins({**sw, "IL": [0.014, "x", 0.003]})
    knobs = dict(generate.DEFAULT_KNOBS)
    target = {"IL_misses_per_request": 0.014, "DL_misses_per_request": 0.010, "DL_persistent_fraction": 0.2}
    m = {"IL_misses_per_request": 0.010, "DL_misses_per_request": 0.020}
    split = {
        "threads": {},
        "far": {"I1mr": 0.0, "DLmr": 0.012, "DLmw": 0.0},
        "llc": {"ILmr": 0.006, "DLmr": 0.004, "DLmw": 0.0},
    }
    k = tune.update_knobs(knobs, m, target, split, {})
    # code: 0.004 from the rest, the rings must give 0.010 instead of 0.006
    assert k["code_llc_scale"] == pytest.approx(0.010 / 0.006)
    # data: rest 0.004; walkers want 0.2 x 0.010 - 0.004 < 0 -> their floor step; rings 0.006
    assert k["data_ll_scale"] == pytest.approx(0.05)
    assert k["data_llc_scale"] == pytest.approx(0.006 / 0.004)
    # session 13: with the walkers beyond the LL at their floor, clone_far_'s misses are those of
    # the walkers within it and stay: the rings give what is left (0.010 - 0.001 - 0.003), not
    # what the walkers were asked for (memcached's DL sat 20-30% over with the rings at 1.0)
    floor = dict(knobs, data_ll_scale=tune.LL_KNOB_FLOOR)
    m = {"IL_misses_per_request": 0.014, "DL_misses_per_request": 0.013}
    split["far"] = {"I1mr": 0.0, "DLmr": 0.003, "DLmw": 0.0}
    split["llc"] = {"ILmr": 0.006, "DLmr": 0.009, "DLmw": 0.0}
    k = tune.update_knobs(floor, m, target, split, {})
    assert k["data_ll_scale"] == tune.LL_KNOB_FLOOR
    assert k["data_llc_scale"] == pytest.approx(0.006 / 0.009)


@needs_valgrind
@needs_gcc
def test_random_branch_unit_mispredicts_linearly_in_its_knob(tmp_path):
    """The random-branch unit (asmgen.brx_function): branch_x conditional branches per event on
    an LCG's top bit; callgrind's predictor mispredicts a large share of them, and the unit's
    mispredictions per event grow linearly with the knob (what the tuning step assumes)."""
    got = []
    for x in (6.0, 12.0):
        spec = _spec(instructions=3000, chunk_insns=5, icode_bins=[(2048, 1.0)], branch_unit=True)
        d = tmp_path / f"x{x}"
        asmgen.write_standalone(spec, d, seed=6, calls=1000, knobs={"branch_x": x})
        tc = _cg_run(d, d / "harness", 1000, "b", ("--branch-sim=yes",))
        got.append((tc.fn_total("Bc", "clone_brx_t") / 1000, tc.fn_total("Bcm", "clone_brx_t") / 1000))
        # its instructions come out of the body's budget: the body's total stays the target
        ir = sum(tc.fn_total("Ir", f) for f in ("clone_body_t", "clone_far_t", "clone_brx_t", "clone_fill_t")) / 1000
        assert abs(ir - 3000) <= 0.01 * 3000, (x, ir)
    (bc1, m1), (bc2, m2) = got
    assert abs(bc1 - (2 * 6 + 1)) <= 1.5 and abs(bc2 - (2 * 12 + 1)) <= 1.5, got
    assert 0.3 * 6 <= m1 <= 0.8 * 6 + 1, got
    assert abs((m2 - m1) / (m1 or 1e-9) - 1.0) <= 0.35, got
    # without the flag (or at knob 0) there is no unit
    asmgen.write_standalone(_spec(instructions=3000, chunk_insns=5), tmp_path / "n", 6, 100, {"branch_x": 6.0})
    assert "clone_brx_t" not in (tmp_path / "n" / "body.S").read_text()


def test_branch_unit_tuning_step():
    """Mispredictions: a Newton step on the unit's share at the clone's own branch count; a rest
    that alone mispredicts too much sends the unit to its floor and moves the excess's share of
    the patterns to the counter-mask form (session 13); once nearly all have, the transition
    rates step down."""
    from tailscope.clone import tune

    knobs = {**generate.DEFAULT_KNOBS, "branch_x": 4.0}
    target = {"branch_mispredict_rate": 0.02}
    m = {"branch_mispredict_rate": 0.015, "cond_branches_per_request": 1000}
    split = {"threads": {}, "far": {}, "brx": {"Bc": 9.0, "Bcm": 3.0}}
    k = tune.update_knobs(knobs, m, target, split, {})
    # 15 mispredicted, 3 by the unit: the rest's 12 stay, the unit must give 8
    assert k["branch_x"] == pytest.approx(4.0 * 8 / 3)
    assert k["branch_r_scale"] == knobs["branch_r_scale"]
    # from near its floor the step is at most x10 (the unit's few mispredictions are noisy)
    k0 = tune.update_knobs({**knobs, "branch_x": 0.01}, m, target, {**split, "brx": {"Bc": 0.02, "Bcm": 0.01}}, {})
    assert k0["branch_x"] == pytest.approx(0.1)
    m2 = {"branch_mispredict_rate": 0.03, "cond_branches_per_request": 1000}
    split2 = {"threads": {}, "far": {}, "brx": {"Bc": 9.0, "Bcm": 3.0}}
    k2 = tune.update_knobs(knobs, m2, target, split2, {})
    # 30 mispredicted, 27 by the rest against 20 wanted: 7 / 27 of the patterns to the mask form
    assert k2["branch_x"] == pytest.approx(0.2)
    assert k2["branch_mask_frac"] == pytest.approx(7 / 27)
    assert k2["branch_r_scale"] == knobs["branch_r_scale"]
    k3 = tune.update_knobs(k2, m2, target, split2, {})
    assert k3["branch_mask_frac"] == pytest.approx(7 / 27 + (1 - 7 / 27) * 7 / 27)
    assert k3["branch_r_scale"] == knobs["branch_r_scale"]
    # from half the patterns on, the transition rates step down as well
    k5 = tune.update_knobs({**knobs, "branch_mask_frac": tune.MASK_FRAC_R_FROM}, m2, target, split2, {})
    assert k5["branch_mask_frac"] > tune.MASK_FRAC_R_FROM and k5["branch_r_scale"] < knobs["branch_r_scale"]
    full = {**knobs, "branch_mask_frac": tune.MASK_FRAC_MAX}
    k4 = tune.update_knobs(full, m2, target, split2, {})
    assert k4["branch_mask_frac"] == tune.MASK_FRAC_MAX and k4["branch_r_scale"] < knobs["branch_r_scale"]


def test_layout_knobs_freeze_at_the_best_iteration():
    """From LAYOUT_FREEZE_AFTER on, the knobs that change the blocks' code take the best
    iteration's values and the others keep their step (session 13: memcached's branch error
    moved 4-26% while cond_scale and mem_scale stepped, 0.7-5.8% once they stayed)."""
    from tailscope.clone import tune

    best = {**generate.DEFAULT_KNOBS, "cond_scale": 1.19, "mem_scale": 0.9, "branch_mask_frac": 0.06}
    new = {**best, "cond_scale": 1.23, "mem_scale": 0.85, "branch_mask_frac": 0.3, "branch_x": 7.0}
    assert tune.freeze_layout(new, best, tune.LAYOUT_FREEZE_AFTER - 1) == new
    frozen = tune.freeze_layout(new, best, tune.LAYOUT_FREEZE_AFTER)
    assert {k: frozen[k] for k in tune.LAYOUT_KNOBS} == {k: best[k] for k in tune.LAYOUT_KNOBS}
    assert frozen["branch_x"] == 7.0 and new["cond_scale"] == 1.23  # (the step's dict is not changed)
    # (session 29) the bodies' footprints freeze too: the best's, 1.0 where the best had none
    new = {**new, "footprint_scale:bg3": 0.6, "footprint_scale:worker": 0.8}
    best = {**best, "footprint_scale:worker": 0.9}
    frozen = tune.freeze_layout(new, best, tune.LAYOUT_FREEZE_AFTER)
    assert frozen["footprint_scale:worker"] == 0.9 and frozen["footprint_scale:bg3"] == 1.0
    # (session 49) ... unless the half-I1 point is out of its tolerance: then they keep their
    # step (the layout knobs still freeze) until FOOTPRINT_FREEZE_AFTER
    out, inside = 1.5 * tune.HALF_I1_TOLERANCE, 0.5 * tune.HALF_I1_TOLERANCE
    stepping = tune.freeze_layout(new, best, tune.LAYOUT_FREEZE_AFTER, out)
    assert stepping["footprint_scale:worker"] == 0.8 and stepping["footprint_scale:bg3"] == 0.6
    assert {k: stepping[k] for k in tune.LAYOUT_KNOBS} == {k: best[k] for k in tune.LAYOUT_KNOBS}
    for it, err in ((tune.LAYOUT_FREEZE_AFTER, inside), (tune.FOOTPRINT_FREEZE_AFTER, out)):
        frozen = tune.freeze_layout(new, best, it, err)
        assert frozen["footprint_scale:worker"] == 0.9 and frozen["footprint_scale:bg3"] == 1.0
    # ... and once they have stepped past the freeze, they stop where the iteration had them
    current = {**best, "footprint_scale:worker": 0.7, "footprint_scale:bg3": 0.5}
    assert tune.freeze_layout(new, best, tune.LAYOUT_FREEZE_AFTER, inside, current)["footprint_scale:worker"] == 0.9
    kept = {k: best[k] for k in tune.LAYOUT_KNOBS if k != "branch_mask_frac"}
    for it, err in ((tune.LAYOUT_FREEZE_AFTER + 1, inside), (tune.FOOTPRINT_FREEZE_AFTER, out)):
        stopped = tune.freeze_layout(new, best, it, err, current)
        assert stopped["footprint_scale:worker"] == 0.7 and stopped["footprint_scale:bg3"] == 0.5
        assert {k: stopped[k] for k in kept} == kept
        # (session 50) but a step up of the patterns' counter share stands: the loop takes one
        # only with the random-branch unit at its floor, the rest alone over the target
        assert stopped["branch_mask_frac"] == 0.3
    assert tune.LAYOUT_FREEZE_AFTER < tune.FOOTPRINT_FREEZE_AFTER < tune.MAX_ITERATIONS
    # ... and, once past the freeze, it does not go back below the last iteration's, whatever
    # the best iteration had; at the freeze itself a step up stands, an earlier share does not
    best0, late = {**best, "branch_mask_frac": 0.0}, tune.LAYOUT_FREEZE_AFTER + 2
    was = {**current, "branch_mask_frac": 0.2}
    assert tune.freeze_layout(was, best0, late, inside, was)["branch_mask_frac"] == 0.2
    assert tune.freeze_layout({**was, "branch_mask_frac": 0.35}, best0, late, inside, was)["branch_mask_frac"] == 0.35
    assert tune.freeze_layout(was, best0, tune.LAYOUT_FREEZE_AFTER, inside, was)["branch_mask_frac"] == 0.0
    raised = {**was, "branch_mask_frac": 0.25}
    assert tune.freeze_layout(raised, best0, tune.LAYOUT_FREEZE_AFTER, inside, was)["branch_mask_frac"] == 0.25


def test_half_i1_step_moves_each_bodys_footprint():
    """tune.half_i1_step (session 29): each body whose misses per request at half of A's I1 are
    off by more than HALF_I1_DEADBAND steps its own footprint knob; a body within it, or with less
    than HALF_I1_MIN_SHARE of the misses, does not. The figures: memcached's clone against its
    original at 16 KiB (8 ways)."""
    from tailscope.clone import tune
    from tailscope.clone import valgrind as vg

    assert tune.half_i1_config() == {**vg.CONFIG_A, "I1": "16384,8,64"}
    assert tune.half_i1_config()["I1"] != vg.CONFIG_B["I1"]  # B stays held out
    knobs = dict(generate.DEFAULT_KNOBS)
    target = {"acceptor": 0.4, "worker": 137.6, "bg3": 32.0}
    clone = {"acceptor": 0.5, "worker": 140.0, "bg3": 55.4}
    k = tune.half_i1_step(knobs, clone, target)
    lo, hi = tune.FOOTPRINT_STEP
    want = max(lo, min(hi, (32.0 / 55.4) ** tune.FOOTPRINT_POWER))
    assert k["footprint_scale:bg3"] == pytest.approx(want) and want < 1.0
    assert "footprint_scale:worker" not in k  # 1.7% off: within
    assert "footprint_scale:acceptor" not in k  # 25% off, but 0.2% of the misses
    # a second step multiplies the first; under target steps up
    k2 = tune.half_i1_step(k, {**clone, "bg3": 20.0}, target)
    assert k2["footprint_scale:bg3"] == pytest.approx(want * min(hi, (32.0 / 20.0) ** tune.FOOTPRINT_POWER))
    # the generator's factor: the global code_scale times the body's own
    k2["code_scale"] = 0.9
    assert asmgen.code_footprint_scale(k2, "bg3") == pytest.approx(0.9 * k2["footprint_scale:bg3"])
    assert asmgen.code_footprint_scale(k2, "worker") == pytest.approx(0.9)
    # the half-I1 error joins the stop rule and the score where it was measured
    errs = {key: 0.0 for key in tune.TOLERANCE}
    assert tune.within(errs) and tune.score(errs) == 0.0
    errs[tune.HALF_I1_KEY] = tune.HALF_I1_TOLERANCE
    assert tune.within(errs)
    errs[tune.HALF_I1_KEY] = 2 * tune.HALF_I1_TOLERANCE
    assert not tune.within(errs) and tune.score(errs) == pytest.approx(2.0)
    m = {"I1_miss_rate": 0.01, tune.HALF_I1_KEY: 0.03}
    assert tune.HALF_I1_KEY not in tune.errors(m, {"I1_miss_rate": 0.01})
    assert tune.errors(m, {"I1_miss_rate": 0.01, tune.HALF_I1_KEY: 0.025})[tune.HALF_I1_KEY] == pytest.approx(0.2)


@needs_valgrind
@needs_gcc
def test_counter_mask_share_lowers_the_mispredictions(tmp_path):
    """branch_mask_frac moves a share of the patterns to the counter form (`cmp` of the block's
    pass counter, asmgen._threshold_branch), which callgrind's predictor (7 global history bits,
    7 address bits) mispredicts far less than the rotating patterns, at the same taken rate:
    the lever the tuning loop needs when the rest of the clone alone mispredicts too much
    (redis: branch_r_scale from 0.5 to 0.2 moved its rate by 7%)."""
    import capstone

    def rate(frac: float, r: float, p: float = 0.5) -> float:
        d = tmp_path / f"f{frac}_r{r}"
        bins = [(512, 0.2), (1024, 0.2), (2048, 0.2), (4096, 0.2), (8192, 0.2)]
        spec = _spec(instructions=3000, branches=[[p, r, 1]], icode_bins=bins)
        asmgen.write_standalone(spec, d, seed=1, calls=1000, knobs={"branch_mask_frac": frac})
        exe = d / "harness"
        out = d / "cg.out"
        cg = ["valgrind", "--tool=callgrind", "--branch-sim=yes", "--dump-instr=yes", f"--callgrind-out-file={out}"]
        subprocess.run([*cg, str(exe), "1000"], check=True, capture_output=True)
        tc = callgrind.parse(out)
        lo, size = _body_range(exe, "t")
        ins = list(capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64).disasm(isa.ElfImage(exe).read(lo, size), lo))
        forms = ("bt", "test", "cmp")
        tests = {b.address for a, b in itertools.pairwise(ins) if a.mnemonic in forms and b.mnemonic[0] == "j"}
        ib, im = tc.events.index("Bc"), tc.events.index("Bcm")
        bc = sum(c[ib] for (_, a), c in tc.instr.items() if a in tests)
        assert bc > 50_000
        if frac == 1.0:  # every pattern in the counter form: the taken rate is still p
            cg2 = tmp_path / f"j{frac}_{r}_{p}.out"
            cj = [
                "valgrind",
                "--tool=callgrind",
                "--dump-instr=yes",
                "--collect-jumps=yes",
                f"--callgrind-out-file={cg2}",
            ]
            subprocess.run([*cj, str(exe), "1000"], check=True, capture_output=True)
            tj = callgrind.parse(cg2)
            taken = sum(tj.jcnd.get((str(exe), a), [0, 0])[0] for a in tests)
            execd = sum(c[tj.events.index("Ir")] for (_, a), c in tj.instr.items() if a in tests)
            assert abs(taken / execd - p) <= 0.02, (taken / execd, p)  # (a partial last cycle of 256)
        return sum(c[im] for (_, a), c in tc.instr.items() if a in tests) / bc

    for r in (0.05, 0.45):
        none, full = rate(0.0, r), rate(1.0, r)
        assert full < none / 5, (r, none, full)
        # (a share between is not monotone draw by draw: at r = 0.45 half the patterns moved
        # gave 0.246 against 0.232 with none, in a body of 10 patterns; the loop's step is
        # judged on the whole clone, and the random-branch unit makes up an overshoot)
    # a taken rate the mask form would round to a power of two (0.36 -> 0.5) stays 0.36
    assert rate(1.0, 0.3, p=0.36) < 0.05


def test_the_counter_share_changes_only_the_branches_it_moves():
    """A branch_mask_frac step turns some patterns' `bt`/`jc` into `cmp`/`jb` (and their
    rotating register's start value to the default) and changes nothing else: every draw is
    taken whatever the form (review of session 13: the bit index was drawn only in the `bt`
    form, so each step reshuffled the rest of the block)."""
    spec = _layout_spec()
    spec.branches = [[0.3, 0.2, 1], [0.6, 0.4, 1]]
    a, _, _ = asmgen.generate_body(spec, np.random.default_rng(4), {})
    b, _, _ = asmgen.generate_body(spec, np.random.default_rng(4), {"branch_mask_frac": 0.6})
    assert len(a) == len(b)
    diff = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    assert any("cmp byte ptr" in y for _, y in diff), diff[:5]
    moved = re.compile(r"\s*(bt qword ptr|jc |cmp byte ptr|jb |mov r1[01], )")
    assert all(moved.match(x) and moved.match(y) for x, y in diff), [d for d in diff if not moved.match(d[0])][:5]


@needs_valgrind
@needs_gcc
def test_ll_conflict_rings_are_warm_at_a_larger_ll_from_their_first_use(tmp_path):
    """At a clone's real rates (~0.01 accesses per event) a ring goes round about once in a
    window, so its lines are warmed at start-up (clone_llc_warm_<name>, which the harness and the
    skeleton call): at the profiled LL every access still misses, at a 4x larger one none does."""
    spec = _spec(
        instructions=3000,
        chunk_insns=5,
        icode_bins=[(2048, 1.0)],
        llc_code=[(4 << 20, 0.02)],
        llc_data=[(4 << 20, 0.03)],
    )
    calls = 1500
    asmgen.write_standalone(spec, tmp_path, seed=7, calls=calls)
    text = (tmp_path / "body.S").read_text()
    assert "clone_llc_warm_t:" in text
    # (session 48) every ring's table starts on a line, so the warm's one read per 64 bytes reads
    # each of its lines: at 4-byte alignment a table's last line could be left for the window
    lines = text.splitlines()
    tabs = [i for i, x in enumerate(lines) if x.endswith("_tab:")]
    assert tabs and all(lines[i - 1].strip() == f".p2align {asmgen.TABLE_ALIGN}" for i in tabs)
    got = {}
    for ll in (2 << 20, 8 << 20):
        tc = _cg_run(tmp_path, tmp_path / "harness", calls, f"w{ll >> 20}", ("--cache-sim=yes", f"--LL={ll},16,64"))
        # the rings' own misses: the warm-up's data loads are clone_llc_warm_t's; its calls fetch
        # the variants (clone_llcv_t), K = (16 - LLC_SLACK) x 4 MiB / 2 MiB first fetches, taken off
        k = (16 - asmgen.LLC_SLACK) * 2
        got[ll >> 20] = (
            tc.fn_total("ILmr", "clone_llcv_t") + tc.fn_total("ILmr", "clone_llc_t") - k,
            tc.fn_total("DLmr", "clone_llc_t"),
        )
    # at 2 MiB: every access misses, but for the first pass over lines that the start-up touch
    # left among the last 16 of their set (the harness touches the whole region, downwards)
    assert abs(got[2][0] - 0.02 * calls) <= 3, got
    assert 0.03 * calls - 16 <= got[2][1] <= 0.03 * calls + 3, got
    # (the data side none at all: the code ring's table is read at start-up too, session 24)
    assert got[8][0] <= 3 and got[8][1] == 0, got


def _walker_spec(per_event: list[tuple[int, float]]):
    """A body of 4,000 instructions (0.4 data references each) whose walker bins take the given
    accesses per event: data_bins are their shares, main_fraction their total over the 1,600."""
    total = sum(n for _, n in per_event)
    return _spec(
        instructions=4000,
        mix={"arith/reg": 0.6, "mov/load": 0.4},
        cond_per_insn=0.0,
        branches=[],
        data_bins=[(s_, n / total) for s_, n in per_event],
        mem_per_insn=0.4,
        main_fraction=total / 1600,
        icode_bins=[(512, 1.0)],
    )


def _in_event_spec():
    """A 16 KiB bin of 160 lines per event beside a 256 KiB bin of 100 (4,000 instructions):
    the 16 KiB bin's walkers take more lines per event than their region allows."""
    return _walker_spec([(16384, 160), (262144, 100)])


@needs_valgrind
@needs_gcc
def test_a_bin_reused_within_the_event_hits(tmp_path):
    """A bin whose walkers take more lines per event than the region its reuse distance allows
    is cycled within the event (a static walker, session 14). Up to session 13 a walker's region
    held at least two events' loads, so its lines came back after two events' traffic: here the
    16 KiB bin (160 lines per event) beside a 256 KiB bin (100) missed a 32 KiB D1 on nearly
    every access, where its reuse distance says it hits."""
    spec = _in_event_spec()
    asmgen.layer_walkers([spec], {})
    walkers, _ = asmgen.plan_walkers(spec, 4000, {}, 0, 1 << 16)
    small = [w for w in walkers if w["bin"] == 16384]
    assert small and all(w.get("static") and w["bytes"] < 64 * w["per_pass"] for w in small), small
    asmgen.write_standalone(spec, tmp_path, seed=1, calls=300)
    tc = _cg_run(tmp_path, tmp_path / "harness", 300, "h", ("--cache-sim=yes", "--D1=32768,8,64", "--I1=32768,8,64"))
    got = tc.fn_total("D1mr", "clone_far_t") / 300
    # the 256 KiB bin's 100 lines miss; of the 16 KiB bin's 160, at most a quarter
    assert got <= 100 + 0.25 * 160, got
    assert got >= 0.9 * 100, got  # (and the far bin's lines do miss: the walkers ran)


def test_the_static_walker_mode_does_not_flip_with_the_knob():
    """Whether a bin's walkers cycle within the event is decided at the profiled rate (review of
    session 14): the layer model's region sizes do not move with a uniform rate, so a test at
    the knob's rate made the 16 KiB bin's walkers cursor walkers at 0.5x and static at 2x, and
    the misses fell as the rate rose (the loop's D1 step assumes they rise)."""
    spec = _in_event_spec()
    modes = []
    for scale in (0.3, 0.5, 0.8, 1.0, 1.2, 2.0):
        knobs = {"data_far_scale": scale}
        asmgen.layer_walkers([spec], knobs)
        walkers, _ = asmgen.plan_walkers(spec, 4000, knobs, 0, 1 << 16)
        modes.append(tuple(bool(w.get("static")) for w in walkers if w["bin"] == 16384))
    assert len(set(modes)) == 1 and all(modes[0]), modes


def test_static_first_passes_are_the_events_own_lines():
    """plan_walkers (session 16): a static walker's first pass in an event comes back from one
    event's traffic, as an original's once-per-event lines do; those are the accesses of the bins
    within the D1, so the cursor walkers of those bins make only what the first passes do not
    (redis: the 2-8 KiB bins' static regions, 157 lines, took the whole 16 KiB bin's 143 per
    request and half the 32 KiB bin's; the clone's event touched ~500 lines where redis's ~250).
    The credit is counted at the profiled rate, so no walker comes or goes with the knob; bins
    beyond the D1 keep their lines."""
    # per event: 120 accesses in the 4 KiB bin (static: more than its 45-line region), 60 in
    # the 16 KiB bin, 30 in the 32 KiB bin, 40 in the 256 KiB bin
    spec = _walker_spec([(4096, 120), (16384, 60), (32768, 30), (262144, 40)])

    def lines_by_bin(knobs):
        asmgen.layer_walkers([spec], knobs)
        walkers, _ = asmgen.plan_walkers(spec, 4000, knobs, 0, 1 << 16)
        out: dict[int, float] = {}
        for w in walkers:
            out[w["bin"]] = out.get(w["bin"], 0.0) + w["lines"]
        return out, walkers

    got, walkers = lines_by_bin({})
    static = [w for w in walkers if w.get("static")]
    assert [w["bin"] for w in static] == [4096] and static[0]["bytes"] // 64 == 45
    # the first pass (45 lines) takes the 16 KiB bin's 60 down to 15, which cycle the static
    # region (a bin within half the D1: session 17); the 32 KiB bin keeps its 30
    assert got[4096] == pytest.approx(120 + 15) and 16384 not in got
    assert got[32768] == pytest.approx(30) and got[262144] == pytest.approx(40)
    # a larger first pass takes the next bin within the D1 too, never a bin beyond it
    # (the 8 KiB bin's region: 90 lines; 30 of them the 16 KiB bin's, 60 of the 32 KiB bin's 80)
    spec.data_bins = [(8192, 150 / 300), (16384, 30 / 300), (32768, 80 / 300), (262144, 40 / 300)]
    spec.main_fraction = 300 / 1600
    got, _ = lines_by_bin({})
    assert 16384 not in got and got[32768] == pytest.approx(20)
    assert got[262144] == pytest.approx(40)
    # at half and twice the rate: the same walkers, their lines scaled
    base = [(w["bin"], w.get("static", False)) for w in lines_by_bin({})[1]]
    for scale in (0.5, 2.0):
        got_s, walkers_s = lines_by_bin({"data_far_scale": scale})
        assert [(w["bin"], w.get("static", False)) for w in walkers_s] == base
        assert got_s[32768] == pytest.approx(scale * 20) and 16384 not in got_s


def test_walkers_within_the_d1_aim_low_in_their_bin():
    """asmgen.walk_quartiles (session 16): the sweep's caches are 8-way, so a bin within the
    profiled D1 is what hits an 8-way cache of its size; at 0.84 x 32 KiB (430 lines over 64
    sets) a reuse misses a 32 KiB 8-way D1 about a third of the time. Walkers of those bins aim
    at 0.55 and 0.65 of the bin (still inside it); bins beyond the D1 keep the quartiles."""
    assert asmgen.walk_quartiles(32768, {}) == asmgen.WALK_QUARTILES_IN_D1
    assert asmgen.walk_quartiles(65536, {}) == asmgen.WALK_QUARTILES
    assert asmgen.walk_quartiles(65536, {"d1_bytes": 65536}) == asmgen.WALK_QUARTILES_IN_D1
    assert all(0.5 < q < 1 for q in asmgen.WALK_QUARTILES_IN_D1)
    spec = _in_event_spec()
    spec.data_bins = [(32768, 20 / 120), (262144, 100 / 120)]
    spec.main_fraction = 120 / 1600
    asmgen.layer_walkers([spec], {})
    near = [v for (s_, _h), v in spec.walk_sizes.items() if s_ == 32768]
    # the region sizes the layer model solved for the lower aims are smaller than at the quartiles
    asmgen.WALK_QUARTILES_IN_D1, saved = asmgen.WALK_QUARTILES, asmgen.WALK_QUARTILES_IN_D1
    try:
        asmgen.layer_walkers([spec], {})
        at_quartiles = [v for (s_, _h), v in spec.walk_sizes.items() if s_ == 32768]
    finally:
        asmgen.WALK_QUARTILES_IN_D1 = saved
    assert sum(near) < sum(at_quartiles), (near, at_quartiles)


def test_the_blocks_order_follows_the_originals_miss_curve():
    """asmgen.zigzag_order (session 15): a body's parts run in a zig-zag when the original's own
    sweep falls smoothly between I1/4 and I1/2 (memcached's worker: 254 misses per event at 8 KiB,
    108 at 16 KiB), in one order when it is a step there (redis: 445, 364); a spec without the
    original's curve keeps one order. A corrupt curve is a one-line error."""
    mc = [(128, 2468.6), (4096, 53.6), (8192, 52.5), (16384, 146.6), (32768, 102.5), (65536, 5.1)]
    rd = [(128, 7001.8), (4096, 104.7), (8192, 56.1), (16384, 80.8), (32768, 261.0), (65536, 89.2), (131072, 13.6)]
    assert asmgen.zigzag_order(_spec(code_curve=mc), 32768)
    assert not asmgen.zigzag_order(_spec(code_curve=rd), 32768)
    assert not asmgen.zigzag_order(_spec(), 32768)
    # the sizes are the knob's I1's quarter and half: at a 16 KiB I1 they are 4 and 8 KiB, where
    # memcached's curve is nearly flat (360 and 307)
    assert not asmgen.zigzag_order(_spec(code_curve=mc), 16384)
    body = {"instructions_per_event": 1000, "mix": {"arith/reg": 1.0}, "I_bins": [[128, 1.0], ["x", 2]]}
    with pytest.raises(CloneError, match=r"I_bins entry .* corrupt profile"):
        generate.body_spec("worker", body, None)


@needs_valgrind
@needs_gcc
def test_a_zigzag_body_misses_half_its_code_at_half_the_i1(tmp_path):
    """Two blocks of ~12 KiB run once per event: in one order every line comes back after both
    (~24 KiB) and misses a 16 KiB I1 on every event; in the zig-zag each line comes back after
    one block on every other event, so about half the fetches hit. Same instructions per event
    (the parity, the table reads and the calls come out of the blocks' budget); both hit a 32 KiB
    I1. The order is an indirect call through a table, never a conditional branch on the parity
    (in the clone its history is the skeleton's: it mispredicted on every event)."""
    smooth = [(128, 1000.0), (8192, 300.0), (16384, 150.0), (32768, 100.0)]
    got = {}
    for name, curve in (("one", None), ("zig", smooth)):
        spec = _spec(
            instructions=6000,
            chunk_insns=16,
            cond_per_insn=0.0,
            branches=[],
            icode_bins=[(16384, 0.5), (32768, 0.5)],
            code_curve=curve,
        )
        d = tmp_path / name
        asmgen.write_standalone(spec, d, seed=3, calls=400)
        text = (d / "body.S").read_text()
        assert ("_order:" in text) == (curve is not None) and "_rev" not in text
        for i1 in (16384, 32768):
            tc = _cg_run(d, d / "harness", 400, f"i{i1}", ("--cache-sim=yes", f"--I1={i1},8,64"))
            fns = ("clone_body_t", "clone_far_t", "clone_fill_t")
            got[name, i1] = sum(tc.fn_total("I1mr", f) for f in fns) / 400
            got[name, "ir"] = sum(tc.fn_total("Ir", f) for f in fns) / 400
    lines = 6000 / 16  # line entries per event
    assert got["one", 16384] >= 0.85 * lines, got
    assert got["zig", 16384] <= 0.65 * got["one", 16384], got
    assert got["zig", 16384] >= 0.3 * got["one", 16384], got  # (the lines do come back from beyond)
    assert got["one", 32768] <= 0.05 * lines and got["zig", 32768] <= 0.05 * lines, got
    assert abs(got["zig", "ir"] - 6000) <= 60 and abs(got["one", "ir"] - 6000) <= 60, got


def test_the_i1_step_is_a_secant_over_the_far_rate():
    """tune.i1_secant (session 15): the misses outside the far function grow with its rate too
    (each far pass flushes the I1), so the Newton step on the far function's share overshot and
    the loop swung 0.63 <-> 2.1. On a response total = 2 + 6 s (far's own 3 s, the flushes 3 s)
    with the target at 8, the secant over two iterations lands on s = 1 exactly; it keeps the
    Newton step when code_scale or the layout moved, or the two rates are too close."""
    from tailscope.clone import tune

    def it(s, code=1.0, mask=0.2):
        total = 2 + 6 * s
        return {
            "knobs": {"icode_far_scale": s, "code_scale": code, "branch_mask_frac": mask},
            "metrics": {"I1_miss_rate": total / 1000, "instructions_per_request": 1000},
        }

    target = {"I1_miss_rate": 8 / 1000}
    newton = {"icode_far_scale": 1.8, "code_scale": 1.0, "branch_mask_frac": 0.2}
    k = tune.i1_secant(newton, [it(0.5), it(1.6)], target)
    assert k["icode_far_scale"] == pytest.approx(1.0)
    assert k["code_scale"] == 1.0 and k["branch_mask_frac"] == 0.2
    # not a clean pair: the Newton step stays
    assert tune.i1_secant(newton, [it(0.5, code=0.8), it(1.6)], target) == newton
    assert tune.i1_secant(newton, [it(0.5, mask=0.3), it(1.6)], target) == newton
    assert tune.i1_secant(newton, [it(1.55), it(1.6)], target) == newton
    assert tune.i1_secant({**newton, "code_scale": 0.7}, [it(0.5), it(1.6)], target)["icode_far_scale"] == 1.8
    assert tune.i1_secant(newton, [it(1.6)], target) == newton


def test_the_ll_sides_step_by_regula_falsi_once_bracketed():
    """tune.ll_bracket (session 37): redis's loop in session 36 swung data_llc_scale 0.09 <-> 0.15
    for seven iterations, the data side's misses 0.0125 <-> 0.0217 per request around ~0.017, as
    each Newton step overshot by ~2x. Once two iterations of one layout bracket the target, the
    knob goes to where the line through them meets it (at each one's own accesses per request),
    between the two. A response steeper than Newton thinks (DL = 0.15 x - 0.0015, the Newton
    step assuming half that slope) cycles without it and settles with it."""
    from tailscope.clone import tune

    def it(x, dl, cond=1.08, acc=1000.0, il=0.02, code=0.9):
        return {
            "knobs": {"data_llc_scale": x, "code_llc_scale": code, "cond_scale": cond, "mem_scale": 1.0},
            "metrics": {
                "DL_misses_per_request": dl,
                "IL_misses_per_request": il,
                "instructions_per_request": acc,
                "data_refs_per_request": 0.0,
            },
        }

    target = {"DL_misses_per_request": 0.017, "IL_misses_per_request": 0.02, "instructions_per_request": 1000.0}
    newton = {**it(0.09, 0)["knobs"]}
    hist = [it(0.0928, 0.0125), it(0.1485, 0.0217)]
    k = tune.ll_bracket(newton, hist, target)
    assert k["data_llc_scale"] == pytest.approx(0.0928 + 0.0045 * 0.0557 / 0.0092)
    assert 0.115 < k["data_llc_scale"] < 0.125 and {**k, "data_llc_scale": 0.09} == newton
    # the partner may be further back, past an iteration on the same side as the last
    k = tune.ll_bracket(newton, [it(0.0928, 0.0125), it(0.2, 0.03), it(0.1485, 0.0217)], target)
    assert k["data_llc_scale"] == pytest.approx(0.0928 + 0.0045 * 0.0557 / 0.0092)
    # the target at the clone's own accesses: 10% more accesses, 10% more misses wanted
    k = tune.ll_bracket(newton, [it(0.0928, 0.0125, acc=1100), it(0.1485, 0.0217, acc=1100)], target)
    assert k["data_llc_scale"] == pytest.approx(0.0928 + (0.0187 - 0.0125) * 0.0557 / 0.0092)
    # not bracketed, another layout in between, too close, or a response that fell: Newton stays
    assert tune.ll_bracket(newton, [it(0.0928, 0.0185), it(0.1485, 0.0217)], target) == newton
    assert tune.ll_bracket(newton, [it(0.0928, 0.0125, cond=1.17), it(0.1485, 0.0217)], target) == newton
    between = [it(0.0928, 0.0125), it(0.0928, 0.02, cond=1.17), it(0.1485, 0.0217)]
    assert tune.ll_bracket(newton, between, target) == newton
    assert tune.ll_bracket(newton, [it(0.145, 0.0125), it(0.1485, 0.0217)], target) == newton
    assert tune.ll_bracket(newton, [it(0.0928, 0.0217), it(0.1485, 0.0125)], target) == newton
    assert tune.ll_bracket(newton, hist[-1:], target) == newton
    # the code side the same way
    k = tune.ll_bracket(newton, [it(0.1, 0.017, il=0.016, code=0.6), it(0.1, 0.017, il=0.024, code=1.0)], target)
    assert k["code_llc_scale"] == pytest.approx(0.8) and k["data_llc_scale"] == 0.09
    # (session 39) with code rings the cold ring steps at the sweep's largest LL: its knob is never
    # bracketed on A's code side, and the rings' knob only between iterations of one cold ring,
    # and not while the cold ring steps
    code = [it(0.1, 0.017, il=0.016, code=0.6), it(0.1, 0.017, il=0.024, code=1.0)]
    for h, c in zip(code, (1.0, 1.5), strict=True):
        h["knobs"]["cold_code_scale"] = c
    assert tune.ll_bracket({**newton, "cold_code_scale": 1.5}, code, target)["code_llc_scale"] == 0.9
    code[0]["knobs"]["cold_code_scale"] = 1.5
    assert tune.ll_bracket({**newton, "cold_code_scale": 1.5}, code, target)["code_llc_scale"] == pytest.approx(0.8)
    assert tune.ll_bracket({**newton, "cold_code_scale": 1.2}, code, target)["code_llc_scale"] == 0.9
    cold = [it(0.1, 0.017, il=0.016), it(0.1, 0.017, il=0.024)]
    for h, c in zip(cold, (0.6, 1.0), strict=True):
        h["knobs"]["cold_code_scale"] = c
    assert tune.ll_bracket({**newton, "cold_code_scale": 1.0}, cold, target)["cold_code_scale"] == 1.0
    no_rings = {**target, "IL_ring_bins": 0.0}
    assert tune.ll_bracket({**newton, "cold_code_scale": 1.0}, cold, no_rings)["cold_code_scale"] == pytest.approx(0.8)

    # the loop on a response twice as steep as the Newton step's slope
    def run(bracket: bool) -> list[float]:
        x, hist, xs = 0.15, [], []
        for _ in range(10):
            dl = 0.15 * x - 0.0015
            hist.append(it(x, dl))
            xs.append(x)
            k = {**hist[-1]["knobs"], "data_llc_scale": x * (0.017 - (dl - 0.075 * x)) / (0.075 * x)}
            x = (tune.ll_bracket(k, hist, target) if bracket else k)["data_llc_scale"]
        return xs

    want = (0.017 + 0.0015) / 0.15
    assert max(abs(x - want) for x in run(False)[-4:]) > 0.2 * want  # the cycle
    assert abs(run(True)[-1] - want) < 0.01 * want


def test_the_branch_unit_step_is_a_secant_over_its_rate():
    """tune.branch_secant (session 27): the unit's random outcomes fill the global history the
    rest of the clone's branches are predicted on, so the total moves ~18 times what the unit's
    own mispredictions say (memcached: 0.5 of 24 per request at branch_x 1.0, a slope of ~9).
    On memcached's measured pair (0.1 -> 16.4, 1.0 -> 24.0 per request, 1335 branches, target
    rate 0.01764) the Newton step went to 0.17; the secant stays near 0.95. It keeps the Newton
    step when the layout or the transition rates moved, the rates are too close, or the slope is
    not positive (noise)."""
    from tailscope.clone import tune

    def it(x, total, mask=0.127, r=1.0):
        return {
            "knobs": {
                "branch_x": x,
                "cond_scale": 1.33,
                "mem_scale": 1.0,
                "branch_mask_frac": mask,
                "branch_r_scale": r,
            },
            "metrics": {"branch_mispredict_rate": total / 1335.3, "cond_branches_per_request": 1335.3},
        }

    target = {"branch_mispredict_rate": 0.017641}
    newton = {**it(0.174, 0)["knobs"]}
    hist = [it(0.1, 16.387), it(1.0, 23.975)]
    k = tune.branch_secant(newton, hist, target)
    slope = (23.975 - 16.387) / 0.9
    assert k["branch_x"] == pytest.approx(1.0 + (0.017641 * 1335.3 - 23.975) / slope)
    assert 0.9 < k["branch_x"] < 1.0
    assert {key: v for key, v in k.items() if key != "branch_x"} == {
        key: v for key, v in newton.items() if key != "branch_x"
    }
    # not a clean pair: the Newton step stays
    assert tune.branch_secant(newton, [it(0.1, 16.387, mask=0.0), it(1.0, 23.975)], target) == newton
    assert tune.branch_secant(newton, [it(0.1, 16.387, r=0.7), it(1.0, 23.975)], target) == newton
    assert tune.branch_secant({**newton, "branch_mask_frac": 0.3}, hist, target) == {**newton, "branch_mask_frac": 0.3}
    assert tune.branch_secant(newton, [it(0.95, 16.387), it(1.0, 23.975)], target) == newton
    assert tune.branch_secant(newton, [it(0.1, 25.0), it(1.0, 23.975)], target) == newton
    assert tune.branch_secant(newton, hist[-1:], target) == newton
    # far from the target, the step is at most x4 either way
    far = tune.branch_secant(newton, [it(0.1, 1.0), it(0.2, 1.5)], target)
    assert far["branch_x"] == pytest.approx(0.8)


def test_the_layer_model_counts_the_traffic_the_walkers_make():
    """layer_walkers takes the walkers from walker_list, as plan_walkers does (session 17). Up to
    session 16 the LRU stack counted every bin's accesses at the profile's rate, and the lines the
    static walkers' first passes take from the cursor walkers within the D1 were counted twice:
    here the 16 KiB bin's walkers were sized for 45 lines per event where they walk 22.5, so they
    came round after twice the traffic, 1.59 x their reuse distance. Under the traffic the plan
    makes (the model restated here: a region of L lines walked at a lines per event is reused
    after everything else brings min(L_q, L / a x a_q) lines), every cursor walker's reuse
    distance is its target."""
    spec = _walker_spec([(4096, 120), (16384, 90), (32768, 60), (65536, 30), (262144, 40)])
    asmgen.layer_walkers([spec], {})
    walkers, _ = asmgen.plan_walkers(spec, 4000, {}, 0, 1 << 16)
    assert any(w.get("static") and "h" not in w for w in walkers)  # a first pass to credit

    def lines(w):  # the region the model sees: a static walker's own, a cursor walker's solved
        return w["bytes"] / 64 if w.get("static") else spec.walk_sizes[(w["bin"], w["h"])] / 64

    cursor = [w for w in walkers if not w.get("static")]
    assert {w["bin"] for w in cursor} >= {32768, 65536, 262144}, walkers
    for w in cursor:
        period = lines(w) / w["lines"]  # events between two passes over a line
        d = sum(lines(q) if q.get("static") else min(lines(q), period * q["lines"]) for q in walkers)
        target = asmgen.walk_quartiles(w["bin"], {})[w["h"]] * w["bin"]
        assert abs(64 * d / target - 1) <= 0.03, (w, 64 * d / target)


def test_the_static_regions_nest():
    """walker_list (session 17): the static walkers of the bins share one region, each cycling its
    first WALK_MID x S bytes, so the event's own lines are the largest region's, not the sum of
    all (redis: 90 lines, not 157), and a larger bin's first pass over the smaller regions' lines
    comes back from their distance. The first passes' credit and the layer model's fixed layer
    are the union's lines; what is left of a bin within half the D1 cycles the region (no cursor
    walker: new lines every event), a bin beyond half the D1 keeps its cursor walkers."""
    # per event: 100 in the 2 KiB bin (22-line region), 100 in the 8 KiB bin (90 lines),
    # 120 in the 16 KiB bin, 30 in the 32 KiB bin, 40 in the 256 KiB bin
    spec = _walker_spec([(2048, 100), (8192, 100), (16384, 120), (32768, 30), (262144, 40)])
    asmgen.layer_walkers([spec], {})
    walkers, _ = asmgen.plan_walkers(spec, 4000, {}, 0, 1 << 16)
    static = [w for w in walkers if w.get("static")]
    assert [w["bin"] for w in static] == [2048, 8192], walkers
    assert static[0]["off"] == static[1]["off"]  # one region
    assert [w["bytes"] // 64 for w in static] == [22, 90] and [w["new_lines"] for w in static] == [22, 68]
    # the credit is the union's 90 lines: the 16 KiB bin keeps 30, which cycle the region
    assert 16384 not in {w["bin"] for w in walkers}
    assert static[1]["lines"] == pytest.approx(100 + 30) and static[1]["per_pass"] == 130
    # the 32 KiB bin (beyond half the D1) keeps its cursor walkers and all of its 30 lines
    assert sum(w["lines"] for w in walkers if w["bin"] == 32768 and not w.get("static")) == pytest.approx(30)
    # the regions after the nested one start past its largest member
    others = [w for w in walkers if not w.get("static") and not w["cold"]]
    assert min(w["off"] for w in others) >= static[0]["off"] + 90 * 64
    # the code: the 8 KiB walker's loads cycle its 90 lines from the region's start
    lines, _blocks, _ = asmgen.generate_body(spec, np.random.default_rng(1), {})
    offs = [int(x) for x in re.findall(r"add r12, qword ptr \[r15 \+ (\d+)\]", "\n".join(lines))]
    assert len(offs) == 100 + 130  # the static loads (a cursor walker's are r15 + r13 + ...)
    base = min(offs)
    assert offs.count(base) == 5 + 2, offs.count(base)  # 100 loads over 22 lines, 130 over 90
    assert max(offs) == base + 89 * 64


def test_a_bins_walkers_take_the_share_the_mid_bin_sweep_measured():
    """The profile's mid-bin sweep (session 18): workingset.lower_share is the share of a bin's
    accesses that hit at its mid size (11 ways over the sets of the bin's lower size: 1.375 x),
    and a bin beyond the D1 gives its lower walker that share of its lines (half each without
    one). memcached's workers' (32, 64] KiB distances all lie below 48 KiB; split evenly, half of
    them missed the held-out 48 KiB D1."""
    from tailscope.clone import workingset

    assert workingset.mid_sizes([2048, 4096, 32768, 1 << 20]) == [5632, 45056]
    assert workingset.mid_cache_arg(45056) == "45056,11,64"
    # hits per access unit at 16, 32, 64 KiB; at the mid sizes 22 and 44 KiB
    share = workingset.lower_share([16384, 32768, 65536], [50.0, 60.0, 80.0], {22528: 52.5, 45056: 78.0})
    assert share == {32768: pytest.approx(0.25), 65536: pytest.approx(0.9)}
    assert workingset.lower_share([16384, 32768], [50.0, 50.0], {22528: 50.0}) == {}  # an empty bin
    spec = _walker_spec([(65536, 40), (262144, 20)])
    spec.data_split = {65536: 0.9, 262144: 0.0}
    even = _walker_spec([(65536, 40), (262144, 20)])
    asmgen.layer_walkers([spec], {})
    asmgen.layer_walkers([even], {})
    got = {(w["bin"], w["h"]): w["lines"] for w in asmgen.walker_list(spec, 4000, {}, 0) if "h" in w}
    assert got[65536, 0] == pytest.approx(36) and got[65536, 1] == pytest.approx(4)
    assert (262144, 0) not in got and got[262144, 1] == pytest.approx(20)  # (no lower walker)
    got = {(w["bin"], w["h"]): w["lines"] for w in asmgen.walker_list(even, 4000, {}, 0) if "h" in w}
    assert got[65536, 0] == pytest.approx(20) and got[65536, 1] == pytest.approx(20)
    # the profile: per body, from the sweep's hits per reference (each run's own references)
    from tailscope.clone.profile import _ws_bins

    sw = {
        "sizes": [16384, 32768, 65536],
        "threads": {"7": {"I": [90.0] * 3, "D": [50.0, 60.0, 80.0], "Ir": [100.0] * 3, "Dref": [100.0] * 3}},
        "mid": {"sizes": [22528, 45056], "threads": {"7": {"D": [105.0, 156.0], "Dref": [200.0, 200.0]}}},
    }
    b = _ws_bins(sw, ["7"], 1000.0, 100.0)
    assert b["D_split"] == {"32768": pytest.approx(0.25), "65536": pytest.approx(0.9)}
    assert "D_split" not in _ws_bins({k: v for k, v in sw.items() if k != "mid"}, ["7"], 1000.0, 100.0)
    # the profile's D_split reaches the spec clamped to [0, 1]; a corrupt one is a one-line error
    body = {"instructions_per_event": 8000, "mix": {}, "D_split": {"65536": 1.2, "131072": 0.25}}
    assert generate.body_spec("w", body, None).data_split == {65536: 1.0, 131072: 0.25}
    for bad in ({"x": 0.5}, {"65536": "half"}, {"65536": float("nan")}, [1, 2], 7):
        with pytest.raises(CloneError, match=r"D_split is not a map of sizes to shares.*corrupt profile"):
            generate.body_spec("w", {**body, "D_split": bad}, None)


def test_the_mid_bin_sweep_describes_its_l1s_only(monkeypatch):
    """valgrind.sweep with the mid sizes' description (11 ways) gives it to the I1 and D1 only: the
    LL stays a power-of-two-sets cache (an 11-way 2 MiB LL is not one, and valgrind refused it)."""
    from types import SimpleNamespace

    from tailscope.clone import valgrind as vg
    from tailscope.clone import workingset

    seen = []

    def fake_window(*args, cache=None, **kw):
        seen.append(cache)
        return SimpleNamespace(requests=1, threads=[])

    monkeypatch.setattr(vg, "window", fake_window)
    vg.sweep({}, 1, [], 1.0, 1, Path("/nonexistent"), [45056], arg=workingset.mid_cache_arg)
    vg.sweep({}, 1, [], 1.0, 1, Path("/nonexistent"), [32768])
    assert seen == [
        {"I1": "45056,11,64", "D1": "45056,11,64", "LL": "2097152,16,64"},
        {"I1": "32768,8,64", "D1": "32768,8,64", "LL": "2097152,16,64"},
    ]


def test_the_report_says_how_close_the_held_out_l1s_lie_to_the_profiled_sizes():
    from tailscope.clone import report
    from tailscope.clone import valgrind as vg

    configs = {"A": vg.CONFIG_A, "B": vg.CONFIG_B}
    sizes = [128 << i for i in range(18)]
    octave_only = {"body": {"0": {"ws_sizes": sizes}}}
    with_mid = {"body": {"0": {"ws_sizes": sizes, "D_split": {"65536": 0.7}}}}
    # B's D1 (48 KiB, 12 ways): 0.42 octave from the swept 64 KiB, 0.13 from the 44 KiB mid size
    assert "D1 (48 KiB, 12 ways, 64 sets) lies 0.42 octave from the nearest profiled one (64 KiB, 8 ways" in (
        report.held_out_note(configs, octave_only)
    )
    note = report.held_out_note(configs, with_mid)
    assert "lies 0.13 octave from the nearest profiled one (44 KiB, 11 ways, 64 sets)" in note
    assert "I1 (16 KiB, 4 ways, 64 sets) has the size of the nearest profiled one (16 KiB, 8 ways, 32 sets)" in note
    assert note.endswith("Nothing is tuned at B.")
    # a loop that tuned the I1's second point (session 29) says so
    tuning = {"history": [{"metrics": {"I1_miss_rate": 0.001, "I1half_miss_rate": 0.02}}]}
    note = report.held_out_note(configs, with_mid, tuning)
    assert "matched the I1 at A and at its second point, 16 KiB with 8 ways (32 sets)" in note
    assert "Nothing is tuned at B" not in note
    assert report.held_out_note(configs, with_mid, {"history": [{"metrics": {}}]}).endswith("Nothing is tuned at B.")
    # nothing to compare with, or a description that is not "size,ways,line": no claim
    assert report.held_out_note(configs, {"body": {}}) == ""
    assert report.held_out_note({"B": {"D1": "big"}}, with_mid) == ""
    assert report.held_out_note({"B": {"D1": "0,4,64"}}, with_mid) == ""
    assert report.held_out_note(configs, {"body": {"0": {"ws_sizes": ["x", 0]}}}) == ""


def test_a_timer_clusters_sleep_table_and_its_flat_rows():
    """profile.sleep_table keeps the cluster's own threads' sleeps by replies since the last one
    (none under MIN_SLEEPS); generate.sleep_rows flattens it, an empty row borrowing the nearest
    full one, and a malformed table is a one-line corrupt-profile error."""
    from tailscope.clone import profile, trace

    cap = trace.SERVED_CAP
    slp = {(7, 0, 20008): 150, (7, 3, 504): 100, (7, 3, 520): 50, (8, 1, 999): 10**6, (7, cap + 1, 8): 5}
    table = profile.sleep_table(slp, [7])
    assert len(table) == cap + 1 and table[0] == [[20008, 150]] and table[3] == [[504, 100], [520, 50]]
    assert all(not table[n] for n in range(cap + 1) if n not in (0, 3))  # other threads, n > cap: out
    assert profile.sleep_table({(7, 0, 8): profile.MIN_SLEEPS - 1}, [7]) is None
    us, cum, at = generate.sleep_rows(table, "c")
    assert len(at) == cap + 2 and at[0] == 0 and at[-1] == len(us) == len(cum)
    rows = [list(zip(us[at[n] : at[n + 1]], cum[at[n] : at[n + 1]], strict=True)) for n in range(cap + 1)]
    assert rows[0] == [(20008, 150)] and rows[3] == [(504, 100), (520, 150)]  # cumulative counts
    assert rows[1] == rows[0]  # nearest full row, the fewer replies first on a tie (0 and 3: 0)
    assert rows[2] == rows[3] and rows[cap] == rows[3]
    for bad in (
        None,
        table[:-1],
        [[["x", 1]]] * (cap + 1),
        [[[5, 0]]] * (cap + 1),
        [[[5, 2**23], [6, 2**23]]] * (cap + 1),
        [[]] * (cap + 1),
        [5] * (cap + 1),
    ):
        with pytest.raises(CloneError, match="corrupt profile"):
            generate.sleep_rows(bad, "c")
    assert [trace.sleep_bucket(x) for x in (0, 15, 4095, 4096, 70000, 10**9)] == [
        8,
        8,
        4088,
        4224,
        71680,
        10000000 // 4096 * 4096 + 2048,
    ]


@needs_gcc
def test_a_clone_timer_sleeps_by_the_replies_since_its_last_wake_and_the_trace_recovers_it(tmp_path):
    """End to end with real bpftrace: a clone whose timer asks for 20 ms after a wake with no
    reply written and 0.5 ms after one with replies; the profile's trace (@slp) recovers exactly
    that law, and the timer's mix of sleeps follows the load (mostly short at 2,000 req/s, mostly
    long at 20 req/s), as memcached's LRU maintainer's does."""
    import os

    from tailscope.clone import runner, trace, tune
    from tailscope.clone.tools import find_loadgen

    if os.geteuid() != 0 or shutil.which("bpftrace") is None:
        pytest.skip("needs root and bpftrace for the syscall trace")
    try:
        find_loadgen()
    except CloneError as exc:
        pytest.skip(str(exc))
    cap = trace.SERVED_CAP
    prof = generate.neutral_profile("memcached", port=9998)
    sleeps = [[[20000, 1]]] + [[[500, 1]]] * cap
    prof["threads"]["clusters"].append(
        {"role": "timer", "tids": [2], "count": 1, "period_us": 1000, "samples": 0, "sleeps": sleeps}
    )
    d = tmp_path / "clone"
    generate.generate(prof, d, seed=1)
    generate.build(d)
    long_q, short_q = trace.sleep_bucket(20000), trace.sleep_bucket(500)
    shares = {}
    with runner.NetNs() as ns:
        srv = runner.start(ns, tune.clone_launch(d, 9998), 9998, tmp_path / "clone.log")
        try:
            for rate in (2000, 20):

                def window(rate=rate):
                    out = tmp_path / str(rate)
                    out.mkdir(exist_ok=True)
                    st = trace.SyscallTrace("bpftrace", srv.pid, [], [], out, gate_conns=True)
                    lg = runner.loadgen(ns, 9998, ["--protocol", "memcached", "--keys", "100"], rate, 1.5)
                    return lg, st.stop().get("slp", {})

                lg, slp = _traced(window)
                assert lg["completed"] > rate and lg["errors"] == 0, lg
                assert slp, "the trace recorded no sleep of the clone's timer"
                assert {q for (_t, _n, q) in slp} <= {long_q, short_q}, slp  # the lengths, exact
                # which row: the clone's count and the trace's are two counters read on two CPUs,
                # so a reply written while the timer reads its count can fall on either side of
                # a sleep (a few per cent of the sleeps at 2,000 req/s, session 20)
                total = sum(slp.values())
                off = sum(c for (_t, n, q), c in slp.items() if q != (long_q if n == 0 else short_q))
                assert off <= 0.05 * total, (rate, off, total, slp)
                shares[rate] = sum(c for (_t, n, _q), c in slp.items() if n == 0) / total
        finally:
            srv.stop()
    assert shares[2000] < 0.5 < shares[20], shares


def test_the_loops_timer_turns_give_the_clones_tick_burst():
    """profile.timer_turns: the median of the workers' timer turns (other threads' left out) and
    their rate per worker, None under MIN_TIMER_TURNS; generate.tick_burst: the period is the
    epoll timeout when the turns came about once per timeout, else one over their rate, and a
    malformed entry is a one-line corrupt-profile error."""
    from tailscope.clone import profile

    tturn = {(7, 136): 4, (7, 152): 6, (7, 312): 1, (8, 152): 10, (9, 4000): 100}
    got = profile.timer_turns(tturn, [7, 8], 1.0)
    assert got == {"us": 152, "per_second": 10.5, "turns": 21}
    assert profile.timer_turns(tturn, [7], 2.0) == {"us": 152, "per_second": 5.5, "turns": 11}
    assert profile.timer_turns({(7, 136): 4, (9, 8): 50}, [7], 1.0) is None  # fewer than MIN
    assert profile.timer_turns({}, [], 1.5) is None
    # the loaded window's reply gaps: worker 7's gaps of at least half the idle turn (76 us) come
    # 6 times in 2 s, 3 a second against 5.5 timer turns (over a quarter): before the reply; their
    # median (104) less the short gaps' (8) is the turn under load. Thread 9's are not a worker's.
    rgap = {(7, 8): 500, (7, 24): 40, (7, 104): 4, (7, 120): 2, (9, 200): 100}
    got = profile.timer_turns(tturn, [7], 2.0, rgap, 2.0)
    assert got == {
        "us": 152,
        "per_second": 5.5,
        "turns": 11,
        "deferred_per_second": 3.0,
        "before_reply": True,
        "loaded_us": 96,
    }, got
    # a loop that writes first: its long gaps are rare (a host's stall between a read and a write)
    got = profile.timer_turns(tturn, [7], 2.0, {(7, 8): 500, (7, 104): 2}, 2.0)
    assert got["before_reply"] is False and "loaded_us" not in got, got
    got = profile.timer_turns(tturn, [7], 2.0, {(7, 8): 500, (7, 104): 5}, 4.0)  # 1.25 a second: 0.23
    assert got["before_reply"] is False and got["deferred_per_second"] == 1.25, got
    net = {"epoll_timeout_ms": 100, "timer_turn": {"us": 152, "per_second": 9.4, "turns": 14}}
    assert generate.tick_burst(net) == (152, 100_000, False)  # 106 ms from the rate: the timeout's
    net["epoll_timeout_ms"] = 20
    assert generate.tick_burst(net) == (152, 106_383, False)  # five timeouts a turn: the rate's
    assert generate.tick_burst({"epoll_timeout_ms": -1, "timer_turn": None}) == (0, 0, False)
    assert generate.tick_burst({"epoll_timeout_ms": 100}) == (0, 0, False)  # a profile from before it
    assert generate.tick_burst({"timer_turn": {"us": 600, "per_second": 1000}}) == (600, 1200, False)
    # the turn under load, held before the replies (profile.timer_turns' before_reply, loaded_us)
    net = {"epoll_timeout_ms": 100, "timer_turn": {"us": 152, "per_second": 9.4, "before_reply": True, "loaded_us": 96}}
    assert generate.tick_burst(net) == (96, 100_000, True)
    bads = [{"us": 0, "per_second": 10}, {"us": 150, "per_second": 0}, {"us": 1.5, "per_second": 10}, [150, 10]]
    bads += [{"us": 150, "per_second": 10, "before_reply": 1}, {"us": 150, "per_second": 10, "loaded_us": -3}]
    for bad in bads:
        with pytest.raises(CloneError, match=r"timer_turn .* corrupt profile"):
            generate.tick_burst({"epoll_timeout_ms": 100, "timer_turn": bad})


@needs_gcc
def test_a_clones_tick_burst_is_what_the_profiles_trace_measures(tmp_path):
    """End to end with real bpftrace: a clone whose loop waits 25 ms at most and spends 400 us on
    its own timer at each wake; the profile's trace of its idle loop (@tturn, the same program the
    original's idle window runs) gives back a turn of 400 us (plus the loop's own few) about 39
    times a second (25 ms and the turn), so the window ends where the probes did. Without the
    burst the same clone's timer turns are a few us."""
    import os
    import time

    from tailscope.clone import profile, runner, trace, tune

    if os.geteuid() != 0 or shutil.which("bpftrace") is None:
        pytest.skip("needs root and bpftrace for the syscall trace")
    got = {}
    for name, turn in (("burst", {"us": 400, "per_second": 40.0, "turns": 60}), ("none", None)):
        prof = generate.neutral_profile("redis", port=9995)
        prof["network"]["epoll_timeout_ms"] = 25
        prof["network"]["timer_turn"] = turn
        d = tmp_path / name
        generate.generate(prof, d, seed=1)
        assert ("#define CLONE_TICK_BURST_US 400" in (d / "clone_params.h").read_text()) == (turn is not None)
        generate.build(d)
        with runner.NetNs() as ns:
            srv = runner.start(ns, tune.clone_launch(d, 9995), 9995, tmp_path / f"{name}.log")
            try:

                def window(name=name, srv=srv):
                    out = tmp_path / f"{name}-trace"
                    out.mkdir(exist_ok=True)
                    st = trace.SyscallTrace("bpftrace", srv.pid, [], [], out)
                    time.sleep(2.0)
                    return st.stop()

                maps = _traced(window)
            finally:
                srv.stop()
        tids = sorted({tid for (tid, _us) in maps.get("tturn", {})})
        assert len(tids) == 1, maps.get("tturn")  # the one worker's loop; no other thread waits so
        got[name] = profile.timer_turns(maps["tturn"], tids, maps["duration_s"])
    b = got["burst"]
    assert 400 <= b["us"] <= 460, got
    assert 36 <= b["per_second"] <= 40, got
    assert got["none"]["us"] < 100 and 37 <= got["none"]["per_second"] <= 40.5, got


@needs_gcc
def test_a_clone_that_holds_its_replies_for_its_timer_is_measured_so(tmp_path):
    """End to end with real bpftrace and load (session 35): two clones whose loop spends 400 us on
    its own timer every 25 ms, one that runs it before the turn's replies (CLONE_TICK_BEFORE_REPLY,
    as redis does) and one that writes first. The trace's reply gaps (@rgap, the program the
    original's loaded window runs) under 2,000 req/s give profile.timer_turns' before_reply back for
    each, and for the first the turn under load (~400 us)."""
    import os

    from tailscope.clone import profile, runner, target, trace, tune

    if os.geteuid() != 0 or shutil.which("bpftrace") is None:
        pytest.skip("needs root and bpftrace for the syscall trace")
    got = {}
    for before in (True, False):
        prof = generate.neutral_profile("redis", port=9994)
        prof["network"]["epoll_timeout_ms"] = 25
        turn = {"us": 400, "per_second": 40.0, "turns": 60, "before_reply": before}
        prof["network"]["timer_turn"] = turn
        d = tmp_path / str(before)
        generate.generate(prof, d, seed=1)
        assert f"#define CLONE_TICK_BEFORE_REPLY {int(before)}" in (d / "clone_params.h").read_text()
        generate.build(d)
        with runner.NetNs() as ns:
            srv = runner.start(ns, tune.clone_launch(d, 9994), 9994, tmp_path / f"{before}.log")
            try:
                listen = [x["fd"] for x in target.inspect(srv.pid)["listeners"]]

                def window(before=before, srv=srv, listen=listen):
                    out = tmp_path / f"{before}-trace"
                    out.mkdir(exist_ok=True)
                    st = trace.SyscallTrace("bpftrace", srv.pid, listen, [], out)
                    args = ["--protocol", "redis", "--keys", "100", "--value-size", "32"]
                    return runner.loadgen(ns, 9994, args, 2000, 2.0), st.stop()

                lg, maps = _traced(window)
            finally:
                srv.stop()
        assert lg["completed"] > 3000, lg
        tids = sorted({tid for (tid, _us) in maps.get("rgap", {})})
        assert len(tids) == 1, maps.get("rgap")  # the one worker writes the replies
        idle = {(tids[0], 408): 60}  # the idle window's turns (the other test measures those)
        got[before] = profile.timer_turns(idle, tids, 1.5, maps["rgap"], maps["duration_s"])
    assert got[True]["before_reply"] is True and got[False]["before_reply"] is False, got
    assert got[True]["deferred_per_second"] >= 15 > 2 >= got[False]["deferred_per_second"], got
    assert 360 <= got[True]["loaded_us"] <= 480, got


@needs_valgrind
@needs_gcc
def test_the_skeletons_tables_are_read_at_start_up(tmp_path):
    """skeleton.c tables_warm (session 24): sample_cum scans a row of a table up to its draw, so a
    rarely drawn tail line was read for the first time whenever the draw first reached it, a miss
    at any LL (memcached's clone: 4-6 data-side LL misses per window at 8 MiB, the original ~3 in
    all). A timer with a 3,000-entry sleep row: under callgrind with an 8 MiB LL, sample_cum misses
    in the data LL over the timer's first draws is nothing with the warm-up, and the row's lines
    without it (measured: 0 and 373)."""
    import time

    from tailscope.clone import runner, trace, tune
    from tailscope.clone import valgrind as vg

    cap = trace.SERVED_CAP
    prof = generate.neutral_profile("memcached", port=9996)
    row = [[200 + i, 1] for i in range(3000)]  # 24 KB of durations and cumulative counts
    prof["threads"]["clusters"].append(
        {"role": "timer", "tids": [2], "count": 1, "period_us": 1000, "samples": 0, "sleeps": [row] * (cap + 1)}
    )
    d = tmp_path / "clone"
    generate.generate(prof, d, seed=1)
    src = (d / "clone.c").read_text()
    assert "tables_warm();" in src
    cold = tmp_path / "cold"
    shutil.copytree(d, cold)
    (cold / "clone.c").write_text(src.replace("tables_sum = tables_warm();", "tables_sum = 0;"))
    got = {}
    for tag, cd in (("warm", d), ("cold", cold)):
        generate.build(cd)
        out = tmp_path / f"{tag}.cg"
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--cache-sim=yes"]
        cmd += ["--LL=8388608,16,64", "--toggle-collect=bg_main"]
        with runner.NetNs() as ns:
            srv = runner.start(ns, tune.clone_launch(cd, 9996), 9996, tmp_path / f"{tag}.log", prefix=cmd, startup_s=90)
            try:
                time.sleep(1.5)  # ~200 sleeps of 0.2-3.2 ms under valgrind
                subprocess.run(["callgrind_control", "-d", str(srv.pid)], check=True, capture_output=True, timeout=60)
                vg._wait_dump(out, srv.pid)
            finally:
                srv.stop()
        tc = [callgrind.parse(f, with_instr=False) for f in callgrind.dumps(out)]
        got[tag] = sum(t.fn_total("DLmr", "sample_cum") + t.fn_total("DLmw", "sample_cum") for t in tc)
    # (sample_cum is a function of its own at -O2: if a compiler inlined it, "cold" finds nothing)
    assert got["cold"] >= 150, got  # the row's 375 lines, most of them first read in the draws
    assert got["warm"] <= 5, got


def test_a_clone_timer_without_a_table_wakes_at_its_profiled_period(tmp_path):
    """skeleton.c bg_wait: a timer cluster with no sleep table sleeps to absolute deadlines, so an
    idle clone's timer wakes at the profiled 2 ms period (its threads' voluntary context switches
    over 2 s: the workers sleep in epoll_wait with no connection and do not wake)."""
    import time

    from tailscope.clone import runner, target, tune

    prof = generate.neutral_profile("memcached", port=9997)
    prof["threads"]["clusters"].append({"role": "timer", "tids": [2], "count": 1, "period_us": 2000, "samples": 0})
    d = tmp_path / "clone"
    generate.generate(prof, d, seed=1)
    generate.build(d)
    with runner.NetNs() as ns:
        srv = runner.start(ns, tune.clone_launch(d, 9997), 9997, tmp_path / "clone.log")
        try:
            time.sleep(0.3)
            before = sum(t["vcsw"] for t in target.threads(srv.pid))
            t0 = time.monotonic()
            time.sleep(2.0)
            wakes = (sum(t["vcsw"] for t in target.threads(srv.pid)) - before) / (time.monotonic() - t0)
        finally:
            srv.stop()
    # 500 per second; a busy CI machine delays wakes, and a deadline more than a period late resyncs
    assert 350 <= wakes <= 560, wakes


def test_a_rare_events_spread_is_never_below_its_counting_noise():
    """validate.counting_floor: three windows of the original that agree by chance do not make a
    row of ~60 pooled LL misses judgeable (2/sqrt(60) = 26%); with 60,000 misses the same
    agreement judges it, and results without the pool's request count keep the old spread."""
    from tailscope.clone import validate

    def side(ll_rate, requests):
        s = {"instructions_per_request": 8000.0, "data_refs_per_request": 2000.0, "LL_miss_rate": ll_rate}
        s["runs"] = [dict(s), dict(s), dict(s)]  # identical windows: an empirical spread of 0
        if requests is not None:
            s["requests"] = requests
        return s

    few = side(60 / (10000.0 * 18000), 18000)  # 60 misses in the pool
    many = side(60000 / (10000.0 * 18000), 18000)
    assert abs(validate.counting_floor(few, "LL_miss_rate") - 2 / 60**0.5) < 1e-9
    assert validate.original_spread(few, "LL_miss_rate") > 0.25
    assert validate.original_spread(many, "LL_miss_rate") < 0.01
    assert validate.original_spread(side(60 / (10000.0 * 18000), None), "LL_miss_rate") == 0.0
    assert validate.counting_floor(few, "instructions_per_request") is None
    assert validate.counting_floor(side(0.0, 18000), "LL_miss_rate") == 2.0  # no event: N counts as 1
    corrupt = dict(few, data_refs_per_request="x")
    assert validate.counting_floor(corrupt, "LL_miss_rate") is None
    for orig, holds in ((few, None), (many, False)):  # the clone 25% over each: judged only at 60,000
        err = validate.rel_err(orig["LL_miss_rate"] * 1.25, orig["LL_miss_rate"])
        rows = [("cache B", err, validate.original_spread(orig, "LL_miss_rate"))]
        assert validate.verdict(rows, 0.10)["holds"] is holds


def test_a_native_rows_spread_is_never_below_its_medians_sampling_noise():
    """validate.median_floor (session 22): two sessions of the original whose medians agree by
    chance do not make a latency row judgeable when its runs scatter; the floor is two standard
    errors of the median from the runs' median absolute deviation, so one run disturbed by the
    host does not set it, and results without runs keep the sessions' spread."""
    from tailscope.clone import validate

    def side(p99s: list[float]) -> dict:
        runs = [{k: 100.0 for k in validate.NATIVE_KEYS} | {"latency_p99_us": v} for v in p99s]
        half = len(runs) // 2
        sessions = [validate._medians(runs[:half]), validate._medians(runs[half:])]
        return validate._medians(runs) | {"runs": runs, "sessions": sessions}

    # session 21's memcached original at high load: sessions 170 and 164 µs (3.5% apart), runs 127-195
    scattered = side([185, 127, 170, 195, 164, 147])
    assert validate.spread(*(s["latency_p99_us"] for s in scattered["sessions"])) < 0.04
    mad = 19.0  # |runs - 167|: 18, 40, 3, 28, 3, 20 -> median 19
    want = 2 * 1.2533 * 1.4826 * mad / 6**0.5 / 167.0
    assert validate.median_floor(scattered, "latency_p99_us") == pytest.approx(want)
    assert validate.original_spread(scattered, "latency_p99_us") == pytest.approx(want)  # 17.4% > 15%
    # the clone 10% over: within the limit, but the original's figure moves more than the limit
    rows = [("high load", 0.10, validate.original_spread(scattered, "latency_p99_us"))]
    assert validate.verdict(rows, 0.15)["holds"] is None
    # steady runs, one disturbed by the host (630 µs): the MAD ignores it, the row is judged
    steady = side([160, 162, 630, 161, 163, 159])
    assert validate.original_spread(steady, "latency_p99_us") < 0.02
    assert validate.verdict([("high load", 0.10, validate.original_spread(steady, "latency_p99_us"))], 0.15)["holds"]
    # where the sessions' medians are further apart than the floor, their spread stands
    apart = side([100, 101, 99, 140, 141, 139])
    assert validate.original_spread(apart, "latency_p99_us") == pytest.approx(40 / 120)
    # no floor: too few runs, a key the runs lack, a figure that is not a number, the syscall mix
    assert validate.median_floor(side([160, 170]), "latency_p99_us") is None
    assert validate.median_floor(scattered, "syscall_mix") is None
    bad = dict(scattered, runs=[dict(r, latency_p99_us="x") for r in scattered["runs"]])
    assert validate.median_floor(bad, "latency_p99_us") is None
    assert validate.median_floor(dict(scattered, runs=[]), "latency_p99_us") is None


def test_without_code_rings_the_cold_ring_makes_up_the_code_ll_misses():
    """tune._ll_by_side (session 22): where the profile's LL sweep has no code bin (the same code
    misses at every swept LL: redis's high mode), the clone has no code conflict ring, and the code
    side's step moves cold_code_scale, linear in its misses, within COLD_KNOB_RANGE; with bins, the
    rings' knob moves as before and the cold ring stays."""
    from tailscope.clone import tune

    target = {"IL_misses_per_request": 0.0217, "DL_misses_per_request": 0.01, "IL_ring_bins": 0.0}
    m = {"IL_misses_per_request": 0.0166, "DL_misses_per_request": 0.01}
    k = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(k, m, target, {}, {})
    assert k["cold_code_scale"] == pytest.approx(0.0217 / 0.0166)
    assert k["code_llc_scale"] == generate.DEFAULT_KNOBS["code_llc_scale"]
    k2 = dict(k)
    tune._ll_by_side(k2, {**m, "IL_misses_per_request": 0.0001}, target, {}, {})  # a step of at most 4x
    assert k2["cold_code_scale"] == tune.COLD_KNOB_RANGE[1]
    # with code bins: the rings' knob, on the rings' own misses; the cold ring stays
    k3 = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(k3, m, {**target, "IL_ring_bins": 2.0}, {}, {"ILmr": 0.002})
    assert k3["cold_code_scale"] == 1.0
    assert k3["code_llc_scale"] == pytest.approx((0.0217 - (0.0166 - 0.002)) / 0.002)
    # a target from before session 22 (no IL_ring_bins): the rings, as before
    k4 = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(k4, m, {k: v for k, v in target.items() if k != "IL_ring_bins"}, {}, {"ILmr": 0.002})
    assert k4["cold_code_scale"] == 1.0 and k4["code_llc_scale"] != 1.0


def test_walkers_a_larger_ll_keeps_are_tuned_with_the_rings(tmp_path):
    """asmgen.far_data_knob / generate's far_ll_lines / tune._ll_by_side (session 24): a walker of
    a bin between the profiled LL and the largest LL of the LL sweep misses A's LL but hits B's, as
    the LL conflict rings do, so it runs at the rings' knob; only the bins beyond the sweep and the
    cold walker run at data_ll_scale, and the loop sets that knob on their share of clone_far_'s
    misses, not on all of them (redis: 39 misses per window at A, 10 of them at B)."""
    from tailscope.clone import tune

    mb = 1 << 20
    kn = {"ll_bytes": 2 * mb, "ll_keep_bytes": 8 * mb}
    got = {s_: asmgen.far_data_knob(s_, False, kn) for s_ in (mb, 2 * mb, 4 * mb, 8 * mb, 16 * mb)}
    assert got == {
        mb: "data_far_scale",
        2 * mb: "data_ll_scale",  # (its walkers hit the LL; as before)
        4 * mb: "data_llc_scale",
        8 * mb: "data_llc_scale",
        16 * mb: "data_ll_scale",
    }
    assert asmgen.far_data_knob(4 * mb, True, kn) == "data_ll_scale"  # the cold walker
    assert asmgen.far_data_knob(4 * mb, False, {"ll_bytes": 2 * mb}) == "data_ll_scale"  # no sweep: as before
    # the generator takes the sweep's largest LL and reports the two groups' lines per request,
    # in the shares of their bins' accesses (3:1 here)
    prof = generate.neutral_profile(
        "redis", data_bins=[(0, 0.5), (65536, 0.3), (4 * mb, 0.15), (32 * mb, 0.05)], mem_per_insn=0.4
    )
    prof["valgrind"]["ll_sweep"] = {"sizes": [2 * mb, 4 * mb, 8 * mb], "IL": [0.01, 0.01, 0.01], "DL": [0.5, 0.3, 0.1]}
    meta = generate.generate(prof, tmp_path / "c", seed=1)
    assert meta["knobs"]["ll_keep_bytes"] == 8 * mb
    lines = meta["far_ll_lines"]
    assert lines["keep"] > 0 and lines["persist"] > 0
    assert lines["keep"] / lines["persist"] == pytest.approx(3.0, rel=0.1)
    # a body none of whose walkers misses the sweep's largest LL gets a cold walker for the misses
    # that LL still has (generate._persistent_cold_walker): 0.1 per request here
    only = generate.neutral_profile("redis", data_bins=[(0, 0.5), (65536, 0.3), (4 * mb, 0.2), (32 * mb, 0.0)])
    only["valgrind"]["ll_sweep"] = prof["valgrind"]["ll_sweep"]
    only["valgrind"]["requests"] = only["body"]["0"]["events"]  # one event per request
    lines = generate.generate(only, tmp_path / "o", seed=1)["far_ll_lines"]
    assert lines["persist"] == pytest.approx(0.1, rel=0.1) and lines["keep"] > 0
    only["valgrind"]["ll_sweep"] = {**prof["valgrind"]["ll_sweep"], "DL": [0.5, 0.3, 0.0]}
    assert generate.generate(only, tmp_path / "z", seed=1)["far_ll_lines"]["persist"] == 0.0
    # without a sweep every walker beyond the LL is persistent, as before
    del prof["valgrind"]["ll_sweep"]
    meta = generate.generate(prof, tmp_path / "n", seed=1)
    assert "ll_keep_bytes" not in meta["knobs"] and meta["far_ll_lines"]["keep"] == 0.0
    # the tuning step: the walkers' persistent knob on their share of clone_far_'s misses, the
    # rings' knob on the rings' misses plus the rest of clone_far_'s
    target = {"IL_misses_per_request": 0.0, "DL_misses_per_request": 0.04, "DL_persistent_fraction": 0.25}
    m = {"IL_misses_per_request": 0.0, "DL_misses_per_request": 0.04}
    far, llc = {"DLmr": 0.02}, {"DLmr": 0.015}  # rest: 0.005
    k = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(k, m, target, far, llc, {"keep": 3.0, "persist": 1.0})
    want_far = 0.25 * 0.04 - 0.005
    assert k["data_ll_scale"] == pytest.approx(want_far / (0.25 * 0.02))
    assert k["data_llc_scale"] == pytest.approx((0.04 - 0.005 - want_far) / (0.015 + 0.75 * 0.02))
    k0 = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(k0, m, target, far, llc)  # no shares (a clone from before session 24): all persistent
    assert k0["data_ll_scale"] == pytest.approx(want_far / 0.02)


@needs_valgrind
@needs_gcc
def test_walkers_every_ll_misses_are_counted_apart(tmp_path):
    """asmgen._far_function (session 24): the walkers every LL misses (the cold walker, the bins
    beyond the LL sweep's largest LL) run in clone_farp_<name>, so callgrind counts their LL misses
    apart from the walkers a larger LL keeps (clone_far_<name>), and tune._ll_by_side steps
    data_ll_scale on what they measure. At a 2 MiB LL both groups miss; at 8 MiB only
    clone_farp_'s do. The instructions stay exact with the extra call.

    Session 26: the walkers of a bin beyond the largest swept LL (16 MiB here) are persistent
    too, and their regions are left out of the start-up touch, as the cold one is: touched, their
    lines came back from the few MiB touched after them, and an 8 MiB LL hit them (redis: 18 of
    41 misses a window). The harness touches as the skeleton does (spec.touch, each in its direction)."""
    mb = 1 << 20
    # (32 loads per event beyond NEAR_MAX: 16 a group)
    spec = _loads_spec([(512, 0.5), (4 * mb, 0.25), (16 * mb, 0.125), (64 * mb, 0.125)])
    kn = {"ll_keep_bytes": 8 * mb}
    asmgen.layer_walkers([spec], kn)
    calls = 400
    asmgen.write_standalone(spec, tmp_path, seed=3, calls=calls, knobs=kn, skeleton_touch=True)
    # the 16 MiB bin's region is not touched (nor is the cold one); the 4 MiB bin's is
    walkers, _ = asmgen.plan_walkers(spec, spec.instructions, kn, 0, 0, 0)
    touched = {int(rank) // 4 for o, n, rank, _ in spec.touch if rank > 0}  # rank: bin x 4 + size
    assert any(w["bin"] == 16 * mb and not w["cold"] for w in walkers), walkers
    assert touched == {4 * mb}, spec.touch
    assert "clone_farp_t:" in (tmp_path / "body.S").read_text()
    got = {}
    for ll in (2 * mb, 8 * mb):
        tc = _cg_run(tmp_path, tmp_path / "harness", calls, f"p{ll >> 20}", ("--cache-sim=yes", f"--LL={ll},16,64"))
        got[ll >> 20] = (tc.fn_total("DLmr", "clone_farp_t") / calls, tc.fn_total("DLmr", "clone_far_t") / calls)
        ir = tc.fn_total("Ir", "clone_") / calls
    lines = spec.far_ll_lines
    assert lines["persist"] >= 5 and lines["keep"] >= 5, lines
    # clone_farp_ (the 16 MiB bin's walkers and the cold one): their lines miss at both sizes;
    # clone_far_ (the 4 MiB bin) hits at 8 MiB
    assert abs(got[2][0] - lines["persist"]) <= 0.1 * lines["persist"], (got, lines)
    assert abs(got[8][0] - lines["persist"]) <= 0.1 * lines["persist"], (got, lines)
    assert got[8][1] <= 0.05 * lines["keep"], (got, lines)
    assert abs(ir - spec.expected) <= 0.01 * spec.expected, (ir, spec.expected)
    # the step: data_ll_scale on clone_farp_'s measured misses, not the lines' share
    from tailscope.clone import tune

    target = {"IL_misses_per_request": 0.0, "DL_misses_per_request": 0.04, "DL_persistent_fraction": 0.25}
    m = {"IL_misses_per_request": 0.0, "DL_misses_per_request": 0.04}
    k = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(k, m, target, {"DLmr": 0.02}, {"DLmr": 0.015}, {"keep": 1.0, "persist": 1.0}, {"DLmr": 0.016})
    assert k["data_ll_scale"] == pytest.approx((0.25 * 0.04 - 0.005) / 0.016)
    assert k["data_llc_scale"] == pytest.approx((0.04 - 0.005 - 0.005) / (0.015 + 0.004))


@needs_valgrind
@needs_gcc
def test_the_walkers_within_the_ll_are_touched_from_their_end_down(tmp_path):
    """asmgen's start-up touch (session 37): a walker whose bin is within A's LL (`ll_bytes`) has
    its region touched from the end down (TOUCH_DOWN), so its cursor's first lines are its most
    recent; beyond the LL, from the start up (session 24), so they keep the bin's distance.
    Upwards, redis's (1, 2] MiB walker began at ~1.7 MB of A's 2 MiB LL and missed it 82-210
    times a window. Here a 2 MiB bin's two walkers (regions of 0.6 and 1.1 MB), under an LL of
    half the bin (the edge, made tight): touched upwards the larger one's first lines miss it
    (measured: 4,012 data misses in all), downwards they hit (809)."""
    mb = 1 << 20
    spec = _loads_spec([(512, 0.5), (2 * mb, 0.5)])
    kn = {"ll_bytes": 2 * mb, "ll_keep_bytes": 8 * mb}
    asmgen.layer_walkers([spec], kn)
    calls = 400
    asmgen.write_standalone(spec, tmp_path, seed=3, calls=calls, knobs=kn, skeleton_touch=True)
    walks = {int(rank) // 4: d for _, _, rank, d in spec.touch if rank > 0}
    assert walks == {2 * mb: asmgen.TOUCH_DOWN}, spec.touch
    assert "off -= 64) st.data[off - 64]" in (tmp_path / "harness.c").read_text()
    got = {}
    for how in ("down", "up"):
        exe = tmp_path / "harness"
        if how == "up":
            up = [(o, n, r, asmgen.TOUCH_UP) for o, n, r, _ in spec.touch]
            text = (tmp_path / "harness.c").read_text()
            c = asmgen.harness_c(spec.name, _harness_arena(text), calls, _harness_blocks(text), up)
            (tmp_path / "up.c").write_text(c)
            exe = tmp_path / "harness-up"
            subprocess.run(["gcc", "-O1", "-o", str(exe), str(tmp_path / "up.c"), str(tmp_path / "body.S")], check=True)
        tc = _cg_run(tmp_path, exe, calls, how, ("--cache-sim=yes", f"--LL={mb},16,64"))
        got[how] = tc.fn_total("DLmr", "clone_far_t")
    # (clone_far_ holds the 2 MiB bin's walkers; the cold one is clone_farp_'s)
    assert got["up"] >= 20 and got["down"] <= 0.25 * got["up"], got


def test_the_loop_steps_the_walkers_reach_on_the_d1_at_the_mid_bin_point():
    """tune.d1_reach_step (session 47): the first step as if the rate at 44 KiB went as the reach
    to the 0.4, then a secant through two reaches; none within the deadband; each step within
    x0.75..1.5 of the last reach."""
    from tailscope.clone import tune
    from tailscope.clone import valgrind as vg

    key = tune.MID_D1_KEY
    target = {key: 0.0083}

    def h(reach, rate):
        return {"knobs": {"d1_reach": reach}, "metrics": {key: rate}}

    k = tune.d1_reach_step({}, [h(1.0, 0.0075)], target)
    assert k["d1_reach"] == pytest.approx((0.0083 / 0.0075) ** 2.5)
    # memcached's clone, offline: 0.0075 at 1.0 and 0.0090 at 1.4: the line through them
    k = tune.d1_reach_step({}, [h(1.0, 0.0075), h(1.4, 0.0090)], target)
    assert k["d1_reach"] == pytest.approx(1.4 + (0.0083 - 0.0090) / ((0.0090 - 0.0075) / 0.4))
    # the same reach twice is no secant; a falling rate is none either (the first step's guess)
    k = tune.d1_reach_step({}, [h(1.2, 0.0075), h(1.2, 0.0076)], target)
    assert k["d1_reach"] == pytest.approx(1.2 * (0.0083 / 0.0076) ** 2.5)
    assert tune.d1_reach_step({"x": 1}, [h(1.0, 0.0082)], target) == {"x": 1}  # within 2%
    assert tune.d1_reach_step({}, [h(1.0, 0.002)], target)["d1_reach"] == 1.5
    assert tune.d1_reach_step({}, [h(0.7, 0.02)], target)["d1_reach"] == 0.6
    assert tune.d1_reach_step({}, [{"knobs": {}, "metrics": {}}], target) == {}
    # the rate joins the stop rule and the score
    up = tune.UP_D1_KEY
    assert not tune.within(dict.fromkeys(tune.TOLERANCE, 0.0) | {key: 0.06, up: 0.0})
    assert tune.within(dict.fromkeys(tune.TOLERANCE, 0.0) | {key: 0.04, up: 0.04})
    assert not tune.within(dict.fromkeys(tune.TOLERANCE, 0.0) | {key: 0.04, up: 0.06})
    # (session 50) a loop with a second set stops only once it has measured both points
    assert not tune.within(dict.fromkeys(tune.TOLERANCE, 0.0) | {key: 0.04})
    assert tune.score({key: 0.1}) > tune.score({key: 0.0})
    assert tune.score({key: 0.0, up: 0.1}) > tune.score({key: 0.0, up: 0.0})
    # the set it is measured in: the profile's mid-bin point, never B's D1; the upper point's too
    assert tune.mid_d1_config()["D1"] == "45056,11,64" != vg.CONFIG_B["D1"]
    assert tune.up_d1_config()["D1"] == "57344,14,64" != vg.CONFIG_B["D1"]
    assert [tune.second_point(i) for i in range(1, 5)] == [key, up, key, up]


def test_the_reach_steps_on_both_d1_points_relative_to_a():
    """tune.d1_reach_step (session 50): with A's D1 rate on both sides, the step takes each point's
    rate over A's (the reach shapes the curve, data_far_scale sets its level), and the mid-bin
    and upper points together: the geometric mean of their ratios to the target's
    (`d1_bin_ratio`), 1 where their errors balance. No step after an iteration with neither
    point measured; `carry_second` fills in the point a build was not measured at."""
    from tailscope.clone import tune

    mid, up = tune.MID_D1_KEY, tune.UP_D1_KEY
    target = {"D1_miss_rate": 0.0147, mid: 0.0087, up: 0.0056}

    def h(reach, ms, carried=()):
        return {"knobs": {"d1_reach": reach}, "metrics": ms, **({"carried": list(carried)} if carried else {})}

    # session 49's first iteration: A 74% over, 44 KiB 66% over; in shape 0.569 against 0.592:
    # the reach goes up, not down to 0.75
    k = tune.d1_reach_step({}, [h(1.0, {"D1_miss_rate": 0.02554, mid: 0.01453})], target)
    assert k["d1_reach"] == pytest.approx(((0.0087 / 0.0147) / (0.01453 / 0.02554)) ** 2.5)
    assert k["d1_reach"] > 1.0
    # the same shape as the target: no step, whatever the level
    assert tune.d1_reach_step({}, [h(1.0, {"D1_miss_rate": 0.0294, mid: 0.0174})], target) == {}
    # 4% under at 44 KiB, 4% over at 56 (the clone's flatter shape): balanced, no step
    bal = {"D1_miss_rate": 0.0147, mid: 0.0087 * 0.96, up: 0.0056 * 1.04}
    assert tune.d1_bin_ratio(bal, target) == pytest.approx((0.96 * 1.04) ** 0.5)
    assert tune.d1_reach_step({}, [h(1.4, bal)], target) == {}
    # 2% over at 44 KiB and 9% over at 56 (session 49's clone at B's neighbours): the reach down
    over = {"D1_miss_rate": 0.0147, mid: 0.0087 * 1.02, up: 0.0056 * 1.09}
    k = tune.d1_reach_step({}, [h(1.4, over, [up])], target)
    assert k["d1_reach"] == pytest.approx(1.4 * (1.02 * 1.09) ** -1.25)
    # a secant through two reaches on the mean ratio
    under = {"D1_miss_rate": 0.0147, mid: 0.0087 * 0.90, up: 0.0056 * 0.95}
    k = tune.d1_reach_step({}, [h(1.0, under), h(1.4, over, [up])], target)
    c0, c1 = (0.90 * 0.95) ** 0.5, (1.02 * 1.09) ** 0.5
    assert k["d1_reach"] == pytest.approx(1.4 + (1 - c1) / ((c1 - c0) / 0.4))
    # neither point measured by the last build (no second set): no step
    assert tune.d1_reach_step({}, [h(1.4, {"D1_miss_rate": 0.0147})], target) == {}
    # carry_second: the point this build was not measured at, from the last iteration that did
    hist = [h(1.0, {mid: 0.009, up: 0.006}), h(1.2, {mid: 0.008, up: 0.007}, [up])]
    m = {mid: 0.0085}
    assert tune.carry_second(m, hist) == [up] and m[up] == 0.006
    m = {mid: 0.0085, up: 0.0065}
    assert tune.carry_second(m, hist) == [] and m[up] == 0.0065
    assert tune.carry_second({mid: 0.0085}, []) == []


@needs_valgrind
@needs_gcc
def test_the_reach_moves_the_walkers_beyond_the_d1_further_out(tmp_path):
    """asmgen.d1_reach (session 47): layer_walkers aims the walkers of the bin just beyond the
    profiled D1, (32, 64] KiB, at d1_reach times its quartiles, and no other bin's. Run, a body
    whose data half lies in that bin misses a 44 KiB, 11-way D1 more at a reach of 1.5 than at 1
    (its walkers' lines come back from further out), and a 32 KiB one no less."""
    kb = 1 << 10
    got = {}
    for reach in (1.0, 1.5):
        spec = _loads_spec([(512, 0.5), (64 * kb, 0.5)], main_fraction=0.1, cold_bin=0)
        kn = {"ll_bytes": 2 << 20, "d1_bytes": 32 * kb, "d1_reach": reach}
        asmgen.layer_walkers([spec], kn)
        d = tmp_path / str(reach)
        d.mkdir()
        asmgen.write_standalone(spec, d, seed=3, calls=3000, knobs=kn, skeleton_touch=True)
        rates = {}
        for name, d1 in (("A", "32768,8,64"), ("mid", "45056,11,64")):
            tc = _cg_run(d, d / "harness", 3000, name, ("--cache-sim=yes", f"--D1={d1}", "--LL=8388608,16,64"))
            rates[name] = tc.fn_total("D1mr", "clone_far_t") + tc.fn_total("D1mw", "clone_far_t")
        got[reach] = (spec.walk_sizes, rates)
    (sizes1, r1), (sizes15, r15) = got[1.0], got[1.5]
    # the lower walker's only (session 48, asmgen.REACH_HALVES): the upper one keeps its aim, its
    # region the smaller by what the lower one's grew
    assert (64 * kb, 0) in sizes1 and sizes15[(64 * kb, 0)] > 1.3 * sizes1[(64 * kb, 0)], (sizes1, sizes15)
    assert sizes15[(64 * kb, 1)] < sizes1[(64 * kb, 1)], (sizes1, sizes15)
    assert {k: v for k, v in sizes15.items() if k[0] != 64 * kb} == {k: v for k, v in sizes1.items() if k[0] != 64 * kb}
    assert (
        asmgen.d1_reach(64 * kb, {"d1_reach": 1.5}, 0) == 1.5 and asmgen.d1_reach(64 * kb, {"d1_reach": 1.5}, 1) == 1.0
    )
    # (measured: 205,481 and 120,056 misses at 1; 239,917 and 239,811 at 1.5: at 1, aimed at
    # 38.9 and 53.8 KiB, some of the lines already come back within 32 KiB, the shortfall the
    # loop's step makes up in the clone)
    assert r1["A"] > 0 and r15["A"] >= r1["A"], (r1, r15)
    assert r15["mid"] > 1.5 * r1["mid"], (r1, r15)


def _loads_spec(data_bins: list, main_fraction: float = 0.02, cold_bin: int = 64 << 20) -> "asmgen.BodySpec":
    """A 4,000-instruction body of loads and arithmetic with these data bins (by default with a
    64 MiB cold one): the walker tests' body, with `main_fraction` of its loads beyond NEAR_MAX."""
    return _spec(
        instructions=4000,
        mix={"arith/reg": 0.6, "mov/load": 0.4},
        cond_per_insn=0.0,
        branches=[],
        data_bins=data_bins,
        mem_per_insn=0.4,
        main_fraction=main_fraction,
        icode_bins=[(512, 1.0)],
        cold_bin=cold_bin,
    )


def _harness_arena(text: str) -> int:
    return int(re.search(r"mmap\(NULL, (\d+),", text).group(1))


def _harness_blocks(text: str) -> int:
    return int(re.search(r"blocks\[2 \* (\d+)\]", text).group(1))


def test_the_rest_a_larger_ll_keeps_leaves_the_persistent_walkers_their_share():
    """tune._ll_by_side (session 25): the clone's misses outside its walkers and rings (the rest)
    count against the share every LL misses only as far as the skeleton still misses at the LL
    sweep's largest size (measure_skeleton's "_ll"). memcached's rest at A was over that share,
    so the walkers every LL misses sat at their floor and the clone's data side at B was half
    the original's; without the measurement, all the rest is taken as persistent, as before."""
    from tailscope.clone import tune

    target = {"IL_misses_per_request": 0.0, "DL_misses_per_request": 0.008, "DL_persistent_fraction": 0.1}
    m = {"IL_misses_per_request": 0.0, "DL_misses_per_request": 0.008}
    far, llc, farp = {"DLmr": 0.0025}, {"DLmr": 0.003}, {"DLmr": 0.0002}  # rest 0.0025, above 0.0008
    k = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(k, m, target, far, llc, None, farp)
    assert k["data_ll_scale"] == pytest.approx(0.05)  # (want 0: the step's floor)
    k = dict(generate.DEFAULT_KNOBS)
    tune._ll_by_side(k, m, {**target, "skeleton_DL_persistent": 0.0001}, far, llc, None, farp)
    assert k["data_ll_scale"] == pytest.approx((0.1 * 0.008 - 0.0001) / 0.0002)
    # the skeleton's "_ll" reaches the target; a profile without an LL sweep measures nothing more
    assert tune.skeleton_ll_size({"valgrind": {"ll_sweep": {"sizes": [2 << 20, 4 << 20, 8 << 20]}}}) == 8 << 20
    assert tune.skeleton_ll_size({"valgrind": {"ll_sweep": {"sizes": [2 << 20]}}}) is None
    assert tune.skeleton_ll_size({"valgrind": {}}) is None


def test_the_ll_sweeps_points_are_taken_relative_to_their_anchor_windows():
    """profile.ll_sweep with anchors (session 34): each swept size's misses are taken over those of
    the windows at A's LL that ran beside them, times the tuning target's: a sweep run while the
    host slowed valgrind (both its windows and their anchors missing twice as much) gives the same
    share as one run on a quiet host, where the raw points gave redis's data side a persistent
    share of 0.56 against the validation's 0.36."""
    from tailscope.clone import profile

    target = {"IL_misses_per_request": 0.024, "DL_misses_per_request": 0.019}
    quiet = profile.ll_sweep(
        target,
        2 << 20,
        [4 << 20, 8 << 20],
        [
            {"IL_misses_per_request": 0.019, "DL_misses_per_request": 0.008},
            {"IL_misses_per_request": 0.018, "DL_misses_per_request": 0.006},
        ],
        [6, 10, 10],
        [{"IL_misses_per_request": 0.024, "DL_misses_per_request": 0.016}] * 2,
    )
    slow = profile.ll_sweep(
        target,
        2 << 20,
        [4 << 20, 8 << 20],
        [
            {"IL_misses_per_request": 0.038, "DL_misses_per_request": 0.016},
            {"IL_misses_per_request": 0.036, "DL_misses_per_request": 0.012},
        ],
        [6, 10, 10],
        [{"IL_misses_per_request": 0.048, "DL_misses_per_request": 0.032}] * 2,
    )
    for sw in (quiet, slow):
        assert sw["DL"] == pytest.approx([0.019, 0.019 * 0.5, 0.019 * 0.375])
        assert sw["IL"] == pytest.approx([0.024, 0.019, 0.018])
        assert generate.llc_bins(sw)["persistent"]["data"] == pytest.approx(0.375)
    assert slow["raw"]["DL"] == [0.016, 0.012] and slow["anchor"]["DL"] == [0.032, 0.032]
    # an anchor that missed nothing on a side: that point as measured
    z = profile.ll_sweep(target, 2 << 20, [4 << 20], [{"DL_misses_per_request": 0.004}], None, [{}])
    assert z["DL"] == [0.019, 0.004] and z["IL"] == [0.024, 0.0]
    with pytest.raises(ValueError):
        profile.ll_sweep(target, 2 << 20, [4 << 20], [{}], None, [])


def test_the_ll_sweeps_anchor_windows_run_beside_or_between_the_swept_ones(monkeypatch):
    """profile.ll_sweep_windows (session 34): a single-threaded original's swept windows each run
    beside their own anchor at A's LL; a multi-threaded one's run one at a time, an anchor before
    each round (two copies of memcached side by side missed more at A's LL, not at 8 MiB)."""
    from tailscope.clone import profile
    from tailscope.clone import valgrind as vg

    ran: list = []

    def window(**job):
        ran.append((job["tag"], job["cache"]["LL"]))
        return vg.Window([], 1, 1.0, {})

    def side_by_side(jobs):
        ran.append(tuple(j["tag"] for j in jobs))
        return [window(**j) for j in jobs]

    monkeypatch.setattr(profile.vg, "window", window)
    monkeypatch.setattr(profile.vg, "side_by_side", side_by_side)
    job = {"tag": None, "cache": vg.CONFIG_A}
    sized = [{**job, "cache": {"LL": "4194304,16,64"}}, {**job, "cache": {"LL": "8388608,16,64"}}]
    wins, anchors = profile.ll_sweep_windows(job, sized, 2, True, lambda m: None)
    assert [r for r in ran if len(r) == 2 and str(r[1]).startswith("ll")] == [
        ("llanchor0-0", "llsweep0-0"),
        ("llanchor0-1", "llsweep0-1"),
        ("llanchor1-0", "llsweep1-0"),
        ("llanchor1-1", "llsweep1-1"),
    ]
    assert len(wins) == len(anchors) == 2 and all(len(ws) == 2 for ws in wins + anchors)
    ran.clear()
    wins, anchors = profile.ll_sweep_windows(job, sized, 2, False, lambda m: None)
    assert [t for t, _ in ran] == ["llanchor-0", "llsweep0-0", "llsweep1-0", "llanchor-1", "llsweep0-1", "llsweep1-1"]
    assert ran[0][1] == vg.CONFIG_A["LL"] and ran[2][1] == "8388608,16,64"
    assert all(len(ws) == 2 for ws in wins + anchors) and anchors[0][0] is anchors[1][0]  # one anchor a round
    # what the profile keeps of them for the tuning target (tune.target_anchors): each window once
    assert len(profile._unique(w for ws in anchors for w in ws)) == 2
    # (session 47) the pool's windows as a multi-threaded original's anchors: one a round, no
    # window of the sweep's own at A
    ran.clear()
    pool = [vg.Window([], 1, 1.0, {}) for _ in range(2)]
    wins, anchors = profile.ll_sweep_windows(job, sized, 2, False, lambda m: None, anchor=lambda j: pool[j])
    assert [t for t, _ in ran] == ["llsweep0-0", "llsweep1-0", "llsweep0-1", "llsweep1-1"]
    assert anchors == [pool, pool] and all(len(ws) == 2 for ws in wins)


def test_the_ll_sweep_weighs_the_swept_windows_modes_as_the_anchors_hold_them():
    """profile.mode_balanced (session 35), on the code and data misses of one redis profile's sweep
    at 8 MiB (per 6,000-request window): the anchors drew the upper mode six times of ten, the
    swept windows three. Pooled, the 8 MiB point kept 0.73 of A's code misses; each mode keeps
    0.90-0.96, and weighed as the anchors hold them the point keeps 0.93 (code) and 0.41 (data),
    where the validation's original kept 0.95 and 0.44. One mode on a side, or a mode with no
    window on one side, leaves the pooled ratio (None)."""
    from tailscope.clone import profile

    def ws(pairs):  # (vg.metrics of each window: only the LL sides matter here)
        rest = dict.fromkeys(("instructions_per_request", "data_refs_per_request", "I1_miss_rate", "D1_miss_rate"), 0.0)
        return [
            {**rest, "IL_misses_per_request": il / 6000, "DL_misses_per_request": dl / 6000, "requests": 6000}
            for il, dl in pairs
        ]

    anchors = ws(
        [(80, 69), (80, 62), (155, 113), (155, 110), (142, 116), (142, 106), (80, 61), (142, 95), (80, 59), (155, 129)]
    )
    swept = ws([(74, 23), (130, 40), (140, 52), (91, 25), (74, 41), (74, 19), (74, 15), (74, 24), (77, 27), (74, 27)])
    pooled = sum(w["IL_misses_per_request"] for w in swept) / sum(w["IL_misses_per_request"] for w in anchors)
    assert 0.70 < pooled < 0.76
    got = profile.mode_balanced(swept, anchors)
    assert got["modes"] == [6, 2], got  # the 91 sits with the lower mode (the gap 91 -> 130)
    assert 0.90 < got["IL"] < 0.96 and 0.36 < got["DL"] < 0.44, got
    assert profile.split_modes([60, 64, 70, 75, 81, 89]) is None  # memcached-like: no clear gap
    assert profile.mode_balanced(swept, ws([(80, 60)] * 10)) is None  # the anchors in one mode
    assert profile.mode_balanced(ws([(74, 20)] * 9 + [(75, 21)]), anchors) is None
    # ll_sweep takes the balanced ratio where a size has one, the pooled one where it has None
    target = {"IL_misses_per_request": 0.02, "DL_misses_per_request": 0.016}
    pool = {"IL_misses_per_request": 0.015, "DL_misses_per_request": 0.005}
    anchor = {"IL_misses_per_request": 0.02, "DL_misses_per_request": 0.015}
    sw = profile.ll_sweep(target, 2 << 20, [4 << 20, 8 << 20], [pool, pool], None, [anchor, anchor], [None, got])
    assert sw["IL"][1] == pytest.approx(0.015) and sw["IL"][2] == pytest.approx(0.02 * got["IL"])
    assert sw["DL"][2] == pytest.approx(0.016 * got["DL"]) and sw["modes"] == [None, [6, 2]]


def test_the_ll_sweep_is_fitted_non_increasing_by_least_squares():
    """generate.nonincreasing / llc_bins (session 22): a larger LL never misses more in LRU, so a
    sweep point above the one before it is a draw; the points are fitted by weighted least squares
    (pool adjacent violators, each point weighed by the windows it pools), not cut to a running
    minimum, which made a low draw the persistent misses (redis: 0.0261, 0.0126, 0.0217 code misses
    per request at 2, 4, 8 MiB, its windows bimodal)."""
    from tailscope.clone import profile

    assert generate.nonincreasing([3.0, 2.0, 1.0], [1, 1, 1]) == [3.0, 2.0, 1.0]
    assert generate.nonincreasing([1.0, 2.0, 3.0], [1, 1, 1]) == [2.0, 2.0, 2.0]
    assert generate.nonincreasing([5.0, 1.0, 3.0, 0.5], [1, 1, 1, 1]) == [5.0, 2.0, 2.0, 0.5]
    assert generate.nonincreasing([5.0, 1.0, 3.0], [1, 3, 1]) == [5.0, 1.5, 1.5]
    sw = profile.ll_sweep(
        {"IL_misses_per_request": 0.0261, "DL_misses_per_request": 0.0193},
        2 << 20,
        [4 << 20, 8 << 20],
        [{"IL_misses_per_request": 0.0126, "DL_misses_per_request": 0.006}, {"IL_misses_per_request": 0.0217}],
        [3, 2, 2],
    )
    assert sw["windows"] == [3, 2, 2] and sw["DL"][2] == 0.0
    b = generate.llc_bins(sw)
    assert b["persistent_misses"]["code"] == pytest.approx((0.0126 + 0.0217) / 2)
    assert b["code"] == [(4 << 20, pytest.approx(0.0261 - 0.01715))]
    # all three rising: one mean, each point weighed by its windows (the profile's pool of three
    # more than a swept point of two), and no bin
    sw2 = dict(sw, IL=[0.010, 0.0126, 0.0217])
    b2 = generate.llc_bins(sw2)
    assert b2["persistent_misses"]["code"] == pytest.approx((3 * 0.010 + 2 * 0.0126 + 2 * 0.0217) / 7)
    assert b2["code"] == [] and b2["persistent"]["code"] == pytest.approx(1.0)
    # an older profile (no window counts) or a corrupt count: every point weighs the same
    for w in (None, ["x", 1, 1], [0, 1, 1]):
        old = {k: v for k, v in sw2.items() if k != "windows"} | ({"windows": w} if w else {})
        assert generate.llc_bins(old)["persistent_misses"]["code"] == pytest.approx((0.010 + 0.0126 + 0.0217) / 3)
