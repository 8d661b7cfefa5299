#!/usr/bin/env bash
# `make check`: what to run while working. No network (a warm tree: crates and
# .venv in place, i.e. after `make setup`), no Envoy, under a minute warm.
#   rustfmt --check; clippy -D warnings on all host targets and on wasm32-wasip1;
#   rustdoc -D warnings (throttle-core); the core's unit and property tests;
#   ruff; mypy (pyproject.toml); pytest on the pure tests (no tier marker).
# Prints each step's time and a summary line; stops at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
PURE=${PURE:-$(sed -n "s/^PURE := //p" Makefile)}  # the Makefile's, the one definition
if [[ ! -x $PY ]] || ! "$PY" -c "import mypy, ruff, pytest, psutil" 2>/dev/null; then
  echo "check: .venv is missing or incomplete: run \`make setup\`" >&2
  exit 2
fi

t0=$SECONDS
steps=()
step() {
  local name=$1
  shift
  printf '\n== check: %s\n' "$name"
  local t=$SECONDS
  "$@"
  steps+=("$name $((SECONDS - t))s")
}

step "rustfmt" cargo fmt --all -- --check
step "clippy (host, all targets)" cargo clippy --locked -q --workspace --all-targets -- -D warnings
step "clippy (wasm32-wasip1)" cargo clippy --locked -q --release --target wasm32-wasip1 --workspace -- -D warnings
step "clippy (wasm32-wasip1, test-clock)" cargo clippy --locked -q --release --target wasm32-wasip1 -p throttle-wasm --features test-clock -- -D warnings
step "rustdoc" env RUSTDOCFLAGS="-D warnings" cargo doc --locked -q -p throttle-core --no-deps
step "core and glue tests (unit + property)" cargo test --locked -q --workspace
step "ruff" "$PY" -m ruff check --quiet .
step "mypy" "$PY" -m mypy
step "pure-Python tests" "$PY" -m pytest -q -m "$PURE"

printf '\ncheck: passed in %ss (%s)\n' "$((SECONDS - t0))" "$(printf '%s; ' "${steps[@]}" | sed 's/; $//')"
