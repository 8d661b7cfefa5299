"""Helpers shared by the test files (imported as `tests.support.<module>`, never from a conftest):
`clients` (concurrent HTTP/1.1 requests, each reply with its own status, headers and latency),
`rawclients` (thousands of raw HTTP/1.1 connections from one process; h2c with raw header bytes),
`dynamic` (an Envoy whose listener comes from a watched LDS file), `k8s` (the Istio/Kubernetes
checks' paths and tool runners), `env` (sizes of the bounded runs from the environment)."""
