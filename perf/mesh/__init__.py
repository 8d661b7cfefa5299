"""Mesh comparison on a real cluster: no mesh, sidecar, ambient, ambient + waypoint,
with and without the throttle (see README.md)."""
