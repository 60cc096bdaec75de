# tailscope — top-level entry points.
#
#   make demo    record a real redis-server under injected interference, print the report path
#   make test    every test: Rust, C, Python, eBPF, browser, accuracy suite, bad input
#   make bench   the benchmarks (results land in bench/results/)
#   make lint    cargo fmt/clippy, ruff, clang-format
#
# Every target first runs scripts/setup.sh, which installs what is missing and
# is a no-op on a ready machine.

SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
CARGO_FLAGS := --release --workspace

.PHONY: all setup build build-rust build-c test test-rust test-c test-py demo bench lint fmt clean

all: build

setup:
	@scripts/setup.sh

build: setup build-rust build-c

build-rust:
	cargo build $(CARGO_FLAGS)

build-c:
	$(MAKE) -C runtime
	$(MAKE) -C tests/accuracy
	$(MAKE) -C bench/runtime
	$(MAKE) -C tests/ldb
	$(MAKE) -C bench/ldb

test: build test-rust test-c test-py

test-rust:
	cargo test $(CARGO_FLAGS) -- --test-threads=1

test-c:
	$(MAKE) -C runtime test

# pytest last: its closing line is the run's verdict.
test-py:
	$(PY) -m pytest -q python/tests tests

demo: build
	$(PY) scripts/demo.py

bench: build
	bench/memcached/build.sh
	$(PY) bench/run.py

lint: setup
	cargo fmt --all -- --check
	cargo clippy $(CARGO_FLAGS) --all-targets -- -D warnings
	$(VENV)/bin/ruff check python bench scripts tests
	$(VENV)/bin/ruff format --check python bench scripts tests
	clang-format --dry-run --Werror $$(git ls-files 'runtime/*.[ch]' 'bpf/*.[ch]' 'tests/accuracy/*.c' 'bench/runtime/*.c')

fmt:
	cargo fmt --all
	$(VENV)/bin/ruff format python bench scripts tests
	clang-format -i $$(git ls-files 'runtime/*.[ch]' 'bpf/*.[ch]' 'tests/accuracy/*.c' 'bench/runtime/*.c')

clean:
	cargo clean
	rm -rf build runtime/build tests/accuracy/build bench/runtime/build demo-out
	rm -rf tests/ldb/build bench/ldb/build
