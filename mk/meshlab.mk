# Mesh comparison on one machine (perf/meshlab/README.md): no mesh vs sidecar vs ambient (+ waypoint),
# with and without the throttle, in network namespaces the lab creates and removes itself.
# Needs root and `ip netns`; without them the runs print "SKIPPED: <reason>" and succeed.
.PHONY: setup-meshlab perf-mesh perf-mesh-short mesh-test

setup-meshlab: ## Mesh lab prerequisites: iproute2, openssl (apt, if root), matplotlib
	@bash tools/setup-meshlab.sh

perf-mesh: setup setup-meshlab build ## Full mesh comparison (root): 4 load cases x 8 topologies, report in perf/meshlab/results/
	$(PY) -m perf.meshlab.run

perf-mesh-short: setup setup-meshlab build ## Short mesh comparison for CI (root; 100 RPS, 5 topologies, sanity checks)
	$(PY) -m perf.meshlab.run --short --check

mesh-test: setup setup-meshlab build ## Tests marked lab: the mesh lab itself (root + ip netns, else skipped with the reason)
	$(PYTEST) -m lab -v

CI_EXTRA += mesh-test perf-mesh-short
