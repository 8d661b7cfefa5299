#!/usr/bin/env bash
# Installs the cluster-scope engine on Debian 12: Redis (apt `redis-server`)
# and envoyproxy/ratelimit (go install; the module proxy serves only this
# pseudo-version). Idempotent; apt and the Go module proxy only.
#
# Debian's package starts a system Redis (systemd unit or init script) on
# 127.0.0.1:6379 and ::1 (its /etc/redis/redis.conf binds loopback). The
# project never uses it: the harness starts its own Redis on a free loopback
# port. This script stops and disables the system one so nothing is left
# listening that the project did not start; `redis-cli -p 6379 ping` failing
# afterwards is expected.
set -euo pipefail
cd "$(dirname "$0")/.."

RATELIMIT_MODULE=github.com/envoyproxy/ratelimit
RATELIMIT_VERSION=v1.4.1-0.20260122083618-3fb702589d36
GOBIN_DIR="$(go env GOPATH)/bin"
BIN="$GOBIN_DIR/ratelimit"

step() { printf '\n== setup-engine: %s\n' "$*"; }

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! command -v redis-server >/dev/null; then
  step "apt: redis-server"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q \
    --no-install-recommends redis-server
  # Post-install may have started the system Redis: stop it, keep it off.
  if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
    $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/redis-server ]; then
    $SUDO /etc/init.d/redis-server stop >/dev/null 2>&1 || true
  fi
fi
# Whatever started it (a reboot with the unit enabled, an earlier install):
# a system Redis on 6379 is stopped by its pid file, never by name.
for pidfile in /run/redis/redis-server.pid /var/run/redis/redis-server.pid; do
  if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    step "stopping the system Redis (pid $(cat "$pidfile"), from $pidfile)"
    $SUDO kill "$(cat "$pidfile")" || true
  fi
done

# `go install` of a module path names the binary after the last element
# (`service_cmd`); the harness looks for `ratelimit`, the name the project's
# own image uses, so it is copied once under that name with its version.
if ! [ -x "$BIN" ] || [ "$(cat "$BIN.version" 2>/dev/null)" != "$RATELIMIT_VERSION" ]; then
  step "go install $RATELIMIT_MODULE/src/service_cmd@$RATELIMIT_VERSION (~35 s)"
  go install "$RATELIMIT_MODULE/src/service_cmd@$RATELIMIT_VERSION"
  cp "$GOBIN_DIR/service_cmd" "$BIN"
  echo "$RATELIMIT_VERSION" >"$BIN.version"
fi

step "versions"
redis-server --version
echo "ratelimit $(cat "$BIN.version") at $BIN"
echo "module source: $(go env GOMODCACHE)/$RATELIMIT_MODULE@$RATELIMIT_VERSION"
