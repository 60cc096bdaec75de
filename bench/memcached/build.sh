#!/usr/bin/env bash
# bench/memcached/build.sh — build memcached from its Debian source with
# tailscope request markers (markers.patch) around each ASCII command.
#
# Idempotent: the source is fetched once into bench/work/memcached-src; the
# binary is rebuilt only when markers.patch or libtailscope.a changed.
# Output: build/memcached-marked (top-level build/ is gitignored); the path is
# printed on the last line of stdout. Beside it, build/memcached-plain: the
# same source, configure and compiler flags without the patch, so that
# benchmarks can tell the markers' cost from the build's (Debian's package is
# built with other flags and features).
#
# Needs root for apt (deb-src line, build deps). Set TS_NO_APT=1 to skip apt.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="$root/bench/work/memcached-src"
out="$root/build/memcached-marked"
plain="$root/build/memcached-plain"
patch="$here/markers.patch"
lib="$root/runtime/build/libtailscope.a"
stamp="$work/.tailscope-stamp"

log() { echo "[memcached-build] $*" >&2; }

ensure_deb_src() {
	if grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ ||
		grep -qs '^deb-src' /etc/apt/sources.list; then
		return
	fi
	log "adding deb-src for bookworm main"
	cat >/etc/apt/sources.list.d/tailscope-src.sources <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
	apt-get update -qq
}

ensure_deps() {
	if dpkg -s libevent-dev >/dev/null 2>&1 && dpkg -s dpkg-dev >/dev/null 2>&1; then
		return
	fi
	log "installing minimal build deps"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libevent-dev dpkg-dev >/dev/null
}

fetch_source() {
	if [ -f "$work/proto_text.c" ]; then return; fi
	log "fetching Debian source of memcached"
	local tmp="$root/bench/work/memcached-fetch"
	rm -rf "$tmp" && mkdir -p "$tmp"
	(cd "$tmp" && apt-get source -qq memcached >/dev/null)
	local dir
	dir="$(find "$tmp" -maxdepth 1 -mindepth 1 -type d -name 'memcached-*' | head -1)"
	rm -rf "$work" && mv "$dir" "$work" && rm -rf "$tmp"
	cp -a "$work" "$work.orig-tree" 2>/dev/null || true
}

stamp_value() {
	cat "$patch" "$lib" | sha256sum | cut -d' ' -f1
}

# Both binaries: the same configure line and flags; the control links
# neither the patch nor the runtime (whose lock shim the marked build gets).
configure_make() {
	(cd "$work.build" &&
		./configure -q CPPFLAGS="-I$root/runtime/include" \
			LIBS="$1 -pthread" >/dev/null &&
		make -s -j"$(nproc)" memcached >/dev/null)
}

build() {
	if [ -x "$out" ] && [ -x "$plain" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(stamp_value)" ]; then
		log "up to date"
		return
	fi
	mkdir -p "$(dirname "$out")"
	log "configure + make (unpatched control)"
	rm -rf "$work.build" && cp -a "$work.orig-tree" "$work.build"
	configure_make ""
	cp "$work.build/memcached" "$plain"
	log "applying markers.patch"
	# Start from pristine sources each time the patch changes.
	rm -rf "$work.build" && cp -a "$work.orig-tree" "$work.build"
	(cd "$work.build" && patch -p1 -s <"$patch")
	log "configure + make"
	configure_make "$lib"
	cp "$work.build/memcached" "$out"
	stamp_value >"$stamp"
}

make -s -C "$root/runtime" >/dev/null
if [ "${TS_NO_APT:-0}" != 1 ]; then
	ensure_deb_src
	ensure_deps
fi
fetch_source
build
echo "$out"
