#!/usr/bin/env bash
# Prerequisites of the mesh lab (perf/meshlab) and of its Bookinfo-shaped application (perf/bookinfo):
#   iproute2 (`ip netns`), iptables (traffic capture, as Istio does; tools/tools.tsv), the openssl CLI (per-run mesh
#   certificates), Ruby + WEBrick (details), Node.js (ratings), a JDK 17 (reviews, compiled here into
#   build/bookinfo/reviews), and from requirements.txt gunicorn + urllib3 (productpage) and
#   matplotlib (report charts).
# Idempotent. Installs from Debian apt only when running as root; otherwise it says what is
# missing and the lab skips itself.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v ruby >/dev/null 2>&1 || missing+=(ruby)
ruby -e 'require "webrick"' >/dev/null 2>&1 || missing+=(ruby-webrick)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v javac >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== setup-meshlab: apt-get install ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "== setup-meshlab: missing ${missing[*]} (not root): the mesh lab will skip itself"
  fi
fi

# iptables is a row of tools/tools.tsv (the control plane's setup installs it too).
if [ "$(id -u)" = 0 ]; then
  bash tools/install.sh iptables
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup-meshlab: .venv missing: run \`make setup\` first" >&2
  exit 1
fi
.venv/bin/python -c "import matplotlib, gunicorn, urllib3" 2>/dev/null \
  || .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt

# reviews (Java): compiled once into build/bookinfo/reviews, again only when the source changes.
if command -v javac >/dev/null 2>&1; then
  .venv/bin/python -c "from perf.bookinfo.services import build_reviews; build_reviews()"
fi
echo "== setup-meshlab: ip $(ip -V 2>/dev/null | grep -o 'iproute2-[0-9.]*' || echo missing)," \
     "$(iptables --version 2>/dev/null || echo 'iptables missing')," \
     "$(openssl version 2>/dev/null | cut -d' ' -f1-2 || echo 'openssl missing')," \
     "ruby $(ruby -e 'require "webrick"; print RUBY_VERSION, " webrick ", WEBrick::VERSION' 2>/dev/null || echo missing)," \
     "node $(node --version 2>/dev/null || echo missing)," \
     "$(javac -version 2>&1 || echo 'javac missing')," \
     "matplotlib $(.venv/bin/python -c 'import matplotlib; print(matplotlib.__version__)')," \
     "gunicorn $(.venv/bin/python -c 'import gunicorn; print(gunicorn.__version__)')"
