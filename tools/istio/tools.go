//go:build tools

// Package tools keeps istiod (pilot-discovery) and pilot-agent, which
// `make istio-e2e` builds from the pinned istio.io/istio (tools/setup-istio-e2e.sh),
// in this module's go.sum.
package tools

import (
	_ "istio.io/istio/pilot/cmd/pilot-agent"
	_ "istio.io/istio/pilot/cmd/pilot-discovery"
)
