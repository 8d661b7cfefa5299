"""Istio and Kubernetes checks against the real tools (marker `k8s`, `make k8s-check`)."""
