#!/usr/bin/env bash
# Installs what the benchmarks (perf/) need on top of tools/setup.sh, on
# Debian 12: nginx (upstream and limit_req anchor), apache2-utils (ab),
# chromium (renders the HTML report to PNG in a test), valgrind (callgrind:
# instructions per request, perf/icount) and matplotlib (pinned in
# requirements.txt). Idempotent; apt and PyPI only.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== setup-perf: %s\n' "$*"; }

missing=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v ab >/dev/null || missing+=(apache2-utils)
command -v chromium >/dev/null || missing+=(chromium fonts-dejavu-core)
command -v callgrind_control >/dev/null || missing+=(valgrind)
if [ ${#missing[@]} -gt 0 ]; then
  step "apt: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q \
    --no-install-recommends "${missing[@]}"
fi
# The Debian package may start a system nginx on :80; the benchmarks never use
# it (they run their own nginx on free loopback ports with their own config).

step "Python packages (requirements.txt: matplotlib for the report)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt

step "versions"
{ nginx -v 2>&1 || /usr/sbin/nginx -v 2>&1; } | sed -n 1p
ab -V | sed -n 1p
chromium --version 2>/dev/null | tail -1
valgrind --version
.venv/bin/python -c 'import matplotlib; print("matplotlib", matplotlib.__version__)'
