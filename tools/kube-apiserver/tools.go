//go:build tools

// Package tools pins kube-apiserver for `make istio-e2e` (tools/setup-istio-e2e.sh):
// go.mod requires k8s.io/kubernetes at the version the tests run, and this
// import keeps the command's packages in go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
