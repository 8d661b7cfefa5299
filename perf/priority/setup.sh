#!/usr/bin/env bash
# Installs what the priority benchmark needs beyond tools/setup.sh: Vegeta (open-loop
# load; the Go module proxy) and HAProxy 2.6 (Debian's `haproxy`, the set-priority-class
# anchor). Idempotent. Debian's package may start a system haproxy; the benchmark never
# uses it (it runs its own on free loopback ports with its own configuration).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$HOME/go/bin:/usr/local/go/bin:$PATH"
want=v12.13.0  # harness/vegeta.py VERSION
if ! command -v vegeta >/dev/null || [ ! -f "$(go env GOPATH)/bin/vegeta.version" ] \
    || [ "$(cat "$(go env GOPATH)/bin/vegeta.version")" != "$want" ]; then
  printf '\n== perf-priority-setup: vegeta %s (go install)\n' "$want"
  go install "github.com/tsenart/vegeta/v12@$want"
  echo "$want" > "$(go env GOPATH)/bin/vegeta.version"
fi
if ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then
  printf '\n== perf-priority-setup: apt haproxy\n'
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q \
    --no-install-recommends haproxy
fi
echo "vegeta $(cat "$(go env GOPATH)/bin/vegeta.version")"
{ command -v haproxy >/dev/null && haproxy -v || /usr/sbin/haproxy -v; } | sed -n 1p
