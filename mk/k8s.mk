# Istio and Kubernetes: manifests, OCI image, dashboards (issue 6).
.PHONY: k8s-setup k8s-check k8s-pin k8s-dashboards k8s-image-push

k8s-setup: ## Install k8s-check tools (apt registry+prometheus, kustomize, kubeconform, crane; build istioctl, promtool)
	@bash tools/setup-k8s.sh

k8s-check: k8s-setup build ## Validate istio/ and k8s/ with real istioctl, kubeconform, Envoy, registry, Prometheus
	K8S_CHECK=1 $(PY) -m pytest tests/k8s -v -p no:cacheprovider

k8s-pin: k8s-setup build ## Rewrite the WasmPlugin/EnvoyFilter sha256 pins from the built .wasm's OCI image
	$(PY) tools/wasm_image.py pin

k8s-dashboards: ## Regenerate the Grafana dashboard JSON (k8s/monitoring/dashboards)
	$(PY) k8s/monitoring/dashboards/generate.py

k8s-image-push: k8s-setup build ## Push the .wasm as an OCI image: make k8s-image-push IMAGE=registry/repo:tag
	@test -n "$(IMAGE)" || { echo "usage: make k8s-image-push IMAGE=registry/repo:tag"; exit 2; }
	$(PY) tools/wasm_image.py push $(IMAGE)

CI_EXTRA += k8s-check
