# Istio and Kubernetes: manifests, OCI image, dashboards (istio/README.md, k8s/README.md).
.PHONY: k8s-setup k8s-check k8s-pin k8s-dashboards k8s-image-push k8s-engine-pin

k8s-setup: ## Install k8s-check tools (apt registry+prometheus, kustomize, kubeconform, crane; build istioctl, promtool)
	@bash tools/setup-k8s.sh

k8s-check: setup k8s-setup setup-engine build ## Tests marked k8s: istio/ and k8s/ through real istioctl, kustomize, kubeconform, Envoy, registry, Prometheus, the engine
	$(PYTEST) -m k8s -v

k8s-pin: k8s-setup build ## Rewrite the image's sha256 pin (istio/image/image.env) from the built .wasm
	$(PY) -m tools.wasm_image pin

k8s-dashboards: ## Regenerate the Grafana dashboard JSON (k8s/monitoring/dashboards)
	$(PY) k8s/monitoring/dashboards/generate.py

k8s-image-push: k8s-setup build ## Push the .wasm as an OCI image and name it in istio/image/image.env: IMAGE=registry/repo:tag
	@test -n "$(IMAGE)" || { echo "usage: make k8s-image-push IMAGE=<registry>/<repository>:<tag>"; exit 2; }
	$(PY) -m tools.wasm_image push $(IMAGE)

k8s-engine-pin: k8s-setup ## Pin the rate limit service's image digest (k8s/engine/image.env) from its registry (crane; needs Docker Hub)
	$(PY) -m tools.engine_image pin

CI_EXTRA += k8s-check
