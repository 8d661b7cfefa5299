#!/usr/bin/env bash
# Installs what the adaptive-pacing benchmark needs beyond tools/setup.sh:
# Vegeta (open-loop load), from the Go module proxy. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$HOME/go/bin:/usr/local/go/bin:$PATH"
want=v12.13.0
if ! command -v vegeta >/dev/null || [ ! -f "$(go env GOPATH)/bin/vegeta.version" ] \
    || [ "$(cat "$(go env GOPATH)/bin/vegeta.version")" != "$want" ]; then
  printf '\n== perf-adaptive-setup: vegeta %s (go install)\n' "$want"
  go install "github.com/tsenart/vegeta/v12@$want"
  echo "$want" > "$(go env GOPATH)/bin/vegeta.version"
fi
echo "vegeta $(cat "$(go env GOPATH)/bin/vegeta.version")"
