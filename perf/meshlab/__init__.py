"""Mesh comparison on one machine: no mesh vs sidecar vs ambient, with and without the throttle."""
