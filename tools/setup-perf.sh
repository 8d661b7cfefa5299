#!/usr/bin/env bash
# Installs what the benchmarks (perf/) need on top of tools/setup.sh, on
# Debian 12 (rows of tools/tools.tsv, into build/bin): nginx (upstream and limit_req anchor), apache2-utils (ab),
# chromium (renders the HTML report to PNG in a test), valgrind (callgrind:
# instructions per request, perf/icount) and matplotlib (pinned in
# requirements.txt). Idempotent; apt and PyPI only.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${THROTTLE_TOOLS_BIN:-$PWD/build/bin}  # where tools/install.sh puts the tools

step() { printf '\n== setup-perf: %s\n' "$*"; }

step "nginx, ab, chromium, valgrind (tools/tools.tsv, linked into build/bin)"
bash tools/install.sh nginx ab chromium valgrind

step "Python packages (requirements.txt: matplotlib for the report)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt

step "versions"
"$BIN/nginx" -v 2>&1 | sed -n 1p
"$BIN/ab" -V | sed -n 1p
"$BIN/chromium" --version 2>/dev/null | tail -1
"$BIN/valgrind" --version
.venv/bin/python -c 'import matplotlib; print("matplotlib", matplotlib.__version__)'
