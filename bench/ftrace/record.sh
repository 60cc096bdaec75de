#!/usr/bin/env bash
# ftrace baseline for the varmri bench: sched, irq and irq_vectors events of
# every CPU into a private tracefs instance, streamed as raw per-CPU pages to
# DIR/cpuN (what `trace-cmd record` does). trace-cmd itself cannot run in this
# VM: it writes /proc/sys/kernel/ftrace_enabled, which the kernel refuses
# ("Can't enable ftrace"). Stops on SIGINT/SIGTERM (send SIGTERM: a shell
# started with SIGINT ignored, e.g. in the background, cannot trap SIGINT) and
# removes the instance; also removes instances left by earlier runs that died
# (SIGKILL), which would otherwise trace every CPU until reboot.
# usage: bench/ftrace/record.sh DIR
set -euo pipefail
out=$1
mkdir -p "$out"
T=/sys/kernel/tracing
[ -d "$T/instances" ] || mount -t tracefs nodev "$T"
for old in "$T"/instances/tailscope-bench-*; do
  [ -d "$old" ] || continue
  p=${old##*-}
  if ! kill -0 "$p" 2>/dev/null; then
    echo 0 > "$old/tracing_on" || true
    echo 0 > "$old/events/enable" || true
    rmdir "$old" 2>/dev/null || echo "record.sh: cannot remove stale $old" >&2
  fi
done
inst="$T/instances/tailscope-bench-$$"
mkdir "$inst"
pids=()
cleanup() {
  [ -d "$inst" ] || return 0
  echo 0 > "$inst/tracing_on" || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo 0 > "$inst/events/enable" || true
  rmdir "$inst" 2>/dev/null || true
}
trap 'cleanup; exit 0' INT TERM
trap cleanup EXIT
echo 4096 > "$inst/buffer_size_kb"
for ev in sched irq irq_vectors; do echo 1 > "$inst/events/$ev/enable"; done
echo 1 > "$inst/tracing_on"
for d in "$inst"/per_cpu/cpu*; do
  cat "$d/trace_pipe_raw" > "$out/${d##*/}" &
  pids+=($!)
done
while true; do sleep 1; done
