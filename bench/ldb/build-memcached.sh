#!/usr/bin/env bash
# bench/ldb/build-memcached.sh — memcached from its Debian source, with the
# request-marker patch of the foundation (bench/memcached/markers.patch), built
# two more ways for the `ldb` benchmark:
#   build/memcached-ldb  -finstrument-functions + libtailscope (what
#                        `tailscope flags` prints): shadow stacks, lock shim
#   build/memcached-pg   -pg (mcount), for `uftrace record`
# build/memcached-marked (bench/memcached/build.sh) is the uninstrumented
# baseline. Idempotent: rebuilt only when the patch, the runtime or this
# script change. Prints the two paths on its last line.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
"$root/bench/memcached/build.sh" >/dev/null # fetches the source, builds memcached-marked
src="$root/bench/work/memcached-src.orig-tree"
patch="$root/bench/memcached/markers.patch"
lib="$root/runtime/build/libtailscope.a"
inc="$root/runtime/include"

log() { echo "[memcached-ldb] $*" >&2; }

build_variant() { # name extra-cflags
	local name="$1" cflags="$2"
	local work="$root/bench/work/memcached-$name.build" out="$root/build/memcached-$name"
	local stamp="$work/.tailscope-stamp"
	local want
	want="$(cat "$patch" "$lib" "$0" | sha256sum | cut -d' ' -f1)"
	if [ -x "$out" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
		log "$name up to date"
		return
	fi
	log "building $name"
	rm -rf "$work" && cp -a "$src" "$work"
	(cd "$work" && patch -p1 -s <"$patch")
	(cd "$work" &&
		./configure -q CFLAGS="-O2 -g $cflags" CPPFLAGS="-I$inc" LIBS="$lib -pthread" >/dev/null &&
		make -s -j"$(nproc)" memcached >/dev/null)
	mkdir -p "$root/build"
	cp "$work/memcached" "$out"
	echo "$want" >"$stamp"
}

make -s -C "$root/runtime" >/dev/null
build_variant ldb "-finstrument-functions -finstrument-functions-exclude-file-list=/usr/include -fno-omit-frame-pointer"
build_variant pg "-pg -fno-omit-frame-pointer"
echo "$root/build/memcached-ldb $root/build/memcached-pg"
