#!/usr/bin/env bash
# Installs what the Bazel build needs on a fresh Debian 12 machine: Debian's
# bazel-bootstrap (Bazel 4.2.3, with its JDK) plus the bazel-skylib and
# bazel-platforms sources that WORKSPACE points local_repository at.
# Everything comes from Debian apt. Idempotent; safe to re-run.
set -euo pipefail

PKGS=(bazel-bootstrap bazel-skylib bazel-platforms)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  printf '\n== setup-bazel: apt-get install %s\n' "${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get -o DPkg::Lock::Timeout=300 update -qq
  $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

bazel --version
# The paths WORKSPACE uses (bazel/deps.bzl) must exist.
for d in /usr/share/bazel/tools/skylib /usr/share/bazel/tools/platforms; do
  [ -d "$d" ] || { echo "setup-bazel: expected $d (from Debian's package) is missing" >&2; exit 1; }
done
