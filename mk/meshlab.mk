# Mesh comparison on one machine (perf/meshlab/README.md): no mesh vs sidecar vs ambient (+ waypoint,
# + a waypoint at 2 replicas with the throttle in cluster scope: the engine from make setup-engine),
# with and without the throttle, on a Bookinfo-shaped application (perf/bookinfo), in network
# namespaces the lab creates and removes itself; sidecars and waypoint configured by a real istiod
# (make istio-e2e-setup builds it, mk/istio.mk). Needs root, `ip netns` and iptables; without them
# the runs print "SKIPPED: <reason>" and succeed.
.PHONY: setup-meshlab perf-mesh perf-mesh-short mesh-test

setup-meshlab: ## Mesh lab prerequisites: iproute2, iptables, openssl, ruby+webrick, node, JDK (apt, if root); gunicorn, urllib3, matplotlib; compiles reviews
	@bash tools/setup-meshlab.sh

perf-mesh: setup setup-meshlab setup-engine istio-e2e-setup build ## Full mesh comparison (root): saturation, details + scaled productpage cases x 11 topologies x 3 runs
	$(PY) -m perf.meshlab.run

perf-mesh-short: setup setup-meshlab setup-engine istio-e2e-setup build ## Short mesh comparison for CI (root; productpage through 7 topologies, per-hop and pacing checks)
	$(PY) -m perf.meshlab.run --short --check

mesh-test: setup setup-meshlab setup-engine istio-e2e-setup build ## Tests marked lab: the mesh lab and its Bookinfo-shaped app (root + ip netns, else skipped with the reason)
	$(PYTEST) -m lab -v

CI_EXTRA += mesh-test perf-mesh-short
