#!/usr/bin/env bash
# Idempotent setup for tailscope: system packages, kernel filesystems, the
# Python virtualenv. Safe to run on every `make` invocation: each step checks
# before it acts, so a ready machine costs a second or two.
#
# Usage: scripts/setup.sh [--quiet]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "tailscope's setup installs packages and loads eBPF; run as root (sudo make ...)"

# --- 1. Debian packages -------------------------------------------------
PKGS=(clang llvm libbpf-dev bpftool libelf-dev zlib1g-dev pkg-config make gcc
      redis-server memcached nginx wrk
      bpftrace linux-perf trace-cmd
      chromium chromium-driver
      dpkg-dev libevent-dev
      clang-format
      g++ binutils uftrace
      valgrind iproute2)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Never let package scripts start services (we start our own instances).
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
  fi
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install failed for: ${missing[*]}"
fi

# --- 2. Kernel filesystems the agent needs --------------------------------
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || say "warning: could not mount tracefs"
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf 2>/dev/null || say "warning: could not mount bpffs"

# --- 3. Rust toolchain ----------------------------------------------------
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust (rustup) first"
if ! cargo clippy --version >/dev/null 2>&1 || ! cargo fmt --version >/dev/null 2>&1; then
  rustup component add clippy rustfmt >/dev/null 2>&1 || say "warning: clippy/rustfmt unavailable; lint will be skipped"
fi

# --- 4. Python virtualenv -------------------------------------------------
VENV="$ROOT/.venv"
STAMP="$VENV/.tailscope-installed"
want=$(sha256sum python/pyproject.toml | cut -c1-16)
if [ ! -x "$VENV/bin/python" ]; then
  say "creating Python venv in .venv"
  python3 -m venv "$VENV"
fi
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  say "installing the tailscope Python package into .venv"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q -e "python[test]" || die "pip install failed"
  echo "$want" > "$STAMP"
fi
exit 0
