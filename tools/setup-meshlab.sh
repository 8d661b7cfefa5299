#!/usr/bin/env bash
# Prerequisites of the mesh lab (perf/meshlab): iproute2 (`ip netns`), the openssl CLI
# (per-run mesh certificates), matplotlib (report charts, pinned in requirements.txt).
# Idempotent. Installs from Debian apt only when running as root; otherwise it says what is
# missing and the lab skips itself.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== setup-meshlab: apt-get install ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq "${missing[@]}"
  else
    echo "== setup-meshlab: missing ${missing[*]} (not root): the mesh lab will skip itself"
  fi
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup-meshlab: .venv missing: run \`make setup\` first" >&2
  exit 1
fi
.venv/bin/python -c "import matplotlib" 2>/dev/null \
  || .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
echo "== setup-meshlab: ip $(ip -V 2>/dev/null | grep -o 'iproute2-[0-9.]*' || echo missing)," \
     "$(openssl version 2>/dev/null || echo 'openssl missing')," \
     "matplotlib $(.venv/bin/python -c 'import matplotlib; print(matplotlib.__version__)')"
