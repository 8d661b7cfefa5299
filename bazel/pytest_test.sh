#!/usr/bin/env bash
# sh_test wrapper (bazel/pytest.bzl): runs pytest test files against the
# Bazel-built .wasm, with the host's Envoy, Python/pytest and tools directory recorded in
# host_tools.env (bazel/host_tools.bzl).
#
#   pytest_test.sh WASM HOST_TOOLS_ENV TEST_FILE...    (paths relative to the runfiles root)
set -euo pipefail
wasm=$1 host_env=$2
shift 2

# shellcheck disable=SC1090
source "$host_env"
if [[ -n ${HOST_TOOLS_PROBLEMS} ]]; then
  echo "pytest_test: host tools missing: ${HOST_TOOLS_PROBLEMS}" >&2
  echo "(after fixing, re-detect with: bazel sync --configure)" >&2
  exit 1
fi

export THROTTLE_WASM="$PWD/$wasm"
export ENVOY_BIN THROTTLE_TOOLS_BIN
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
export PYTHONDONTWRITEBYTECODE=1

echo "pytest_test: wasm=${THROTTLE_WASM} ($(wc -c < "$THROTTLE_WASM") bytes), envoy=${ENVOY_BIN}"
exec "$THROTTLE_PYTHON" -m pytest -v -p no:cacheprovider \
  ${XML_OUTPUT_FILE:+--junitxml="$XML_OUTPUT_FILE"} "$@"
