#!/usr/bin/env bash
# Installs the cluster-scope engine: Redis (Debian's redis-server) and envoyproxy/ratelimit
# (go install of the pseudo-version the module proxy serves), both rows of tools/tools.tsv,
# into build/bin. Debian's package starts a system Redis on 127.0.0.1:6379; the project never
# uses it (the harness starts its own on a free loopback port), so the installer stops it and
# keeps it off: `redis-cli -p 6379 ping` failing afterwards is expected.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${THROTTLE_TOOLS_BIN:-$PWD/build/bin}  # where tools/install.sh puts the tools
bash tools/install.sh redis ratelimit
"$BIN/redis-server" --version
echo "module source: $(go env GOMODCACHE)/github.com/envoyproxy/ratelimit@$(awk '$1 == "ratelimit" {print $4}' tools/tools.tsv)"
