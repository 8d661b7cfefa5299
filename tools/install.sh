#!/usr/bin/env bash
# Installs tools of the table tools/tools.tsv into $THROTTLE_TOOLS_BIN (default build/bin/ of
# this checkout), the one directory the harness looks in (harness/tools.py). `make tool-NAME`
# runs it for one row; `make test` gives each tier an empty directory of its own.
#   tools/install.sh NAME...
# go rows: `go install SOURCE@VERSION` with GOBIN pointing into that directory, the binary
# renamed as the row says (a warm Go build cache makes this a link: seconds).
# apt rows: the Debian package(s), if the binary is not on the system yet, then a symbolic
# link in the directory; a service the package starts is stopped (the project runs its own).
# Idempotent: a go tool whose module version matches is kept; apt never upgrades.
# Nothing is downloaded outside the Go module proxy and Debian's archive.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
TABLE=tools/tools.tsv
BIN=${THROTTLE_TOOLS_BIN:-$PWD/build/bin}
mkdir -p "$BIN"
[ "$#" -gt 0 ] || { echo "usage: tools/install.sh NAME... (rows of $TABLE)" >&2; exit 2; }

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_updated=0
apt_install() {
  if [ $apt_updated = 0 ]; then
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq
    apt_updated=1
  fi
  # dpkg's progress goes to a log, printed only if the install fails.
  local log
  log=$(mktemp)
  if ! $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
      --no-install-recommends "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

# A system service the package started: stopped and kept off, by its unit or its pid file
# (never by process name).
stop_service() {
  local svc=$1
  if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
    $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
  elif [ -x "/etc/init.d/$svc" ]; then
    $SUDO "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
  fi
  local pidfile
  for pidfile in "/run/$svc.pid" "/run/${svc%-server}/$svc.pid" "/run/$svc/$svc.pid"; do
    if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      $SUDO kill "$(cat "$pidfile")" || true
    fi
  done
}

# The module version a Go binary was built from (go install leaves no -v string).
modversion() { [ -x "$1" ] && go version -m "$1" 2>/dev/null | awk '$1 == "mod" {print $3}'; }

install_go() {
  local name=$1 source=$2 version=$3 binaries=$4
  local built=${binaries%%=*} as=${binaries#*=}
  if [ "$(modversion "$BIN/$as")" = "$version" ]; then
    echo "$name $version: $BIN/$as"
    return
  fi
  local start tmp
  start=$(date +%s)
  tmp=$(mktemp -d "$BIN/.go-install.XXXXXX")
  GOBIN=$tmp nice -n 10 go install "$source@$version"
  mv "$tmp/$built" "$BIN/$as"
  rm -rf "$tmp"
  echo "$name $version: $BIN/$as (go install, $(( $(date +%s) - start )) s)"
}

# Where the system has a binary (apt puts some in /usr/sbin, outside a user's PATH).
system_path() { PATH="$PATH:/usr/sbin:/sbin" command -v "$1" 2>/dev/null || true; }

install_apt() {
  local name=$1 source=$2 binaries=$3 service=$4
  local b missing=0
  IFS=, read -r -a bins <<<"$binaries"
  for b in "${bins[@]}"; do [ -n "$(system_path "$b")" ] || missing=1; done
  if [ $missing = 1 ]; then
    IFS=, read -r -a pkgs <<<"$source"
    echo "$name: apt-get install ${pkgs[*]}"
    apt_install "${pkgs[@]}"
    [ "$service" = "-" ] || stop_service "$service"
  fi
  for b in "${bins[@]}"; do
    local at
    at=$(system_path "$b")
    [ -n "$at" ] || { echo "install: $name: $b not found after installing $source" >&2; exit 1; }
    ln -sfn "$at" "$BIN/$b"
  done
  # Whatever started it (a reboot with the unit enabled, an earlier install): kept off.
  [ "$service" = "-" ] || stop_service "$service"
  echo "$name (apt $source): $BIN/{$binaries}"
}

for want in "$@"; do
  row=$(awk -v n="$want" '$1 == n && $0 !~ /^#/' "$TABLE")
  [ -n "$row" ] || { echo "install: no tool \"$want\" in $TABLE" >&2; exit 2; }
  read -r name how source version binaries service <<<"$row"
  case $how in
    go) install_go "$name" "$source" "$version" "$binaries" ;;
    apt) install_apt "$name" "$source" "$binaries" "$service" ;;
    *) echo "install: $TABLE: $name: unknown way \"$how\"" >&2; exit 2 ;;
  esac
done
