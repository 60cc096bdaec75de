"""Ditto: clone a running network service into a standalone synthetic program.

`tailscope clone` profiles a running server (network and thread model from /proc, eBPF
syscall and sched tracepoints via bpftrace, call stacks from `perf record -e cpu-clock`;
instruction mix, branches, working sets and dependency distances from valgrind
callgrind runs of the same binary relaunched in a private network namespace), writes a C
skeleton plus generated assembly that reproduces those distributions, tunes it against
the original at one simulated cache configuration, and checks that nothing of the original
leaked into it. `tailscope clone-report` compares original and clone metric by metric.

Modules (one concern each):
  profile     orchestrates profiling into profile.json
  target      /proc inspection: listening sockets, threads, fds, socket options
  trace       bpftrace syscall/sched aggregation and perf stacks
  threads     thread clustering by call-graph similarity
  valgrind    running a server under callgrind with the load, in a private netns
  callgrind   the callgrind output parser
  isa         instruction classes, branch statistics, dependency distances (capstone)
  workingset  cache-size sweeps, N(S) = H(S) - H(S/2)
  asmgen      the generated assembly body (mix, branches, working sets, dependencies)
  generate    the clone directory: C skeleton, parameters, Makefile, run.sh
  leakage     proof that no strings, symbols or data of the original are in the clone
  tune        the feedback loop (<= 10 iterations)
  validate    original vs clone at low/medium/high load and two cache hierarchies
  report      the HTML validation report and the error table
"""
