"""Helpers shared by the test files (imported as `tests.support.<module>`, never from a conftest):
`clients` (each response's own status, headers and latency: bursts and thousands of raw
HTTP/1.1 connections from one process, pipelining, h2c with raw header bytes), `dynamic` (an
Envoy whose listener comes from a watched LDS file), `k8s` (the Istio/Kubernetes checks' paths
and tool runners), `env` (sizes of the bounded runs from the environment)."""
