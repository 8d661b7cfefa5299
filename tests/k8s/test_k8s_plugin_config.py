"""Every shipped WasmPlugin and EnvoyFilter, through Istio's own code into a real
Envoy running the filter.

tools/istio/istiowasm builds, with Istio's code, the Envoy Wasm filter an Istio
proxy would get (WasmPlugin: pilot's TrafficExtensionWrapper.BuildHTTPWasmFilter;
EnvoyFilter: xds.BuildXDSObjectFromStruct), then runs istio-agent's ECDS
conversion (wasm.MaybeConvertWasmExtensionConfig + LocalFileCache): the module is
pulled from the local registry, its manifest digest checked against the pinned
sha256, and the code rewritten to the local file. That filter config replaces
the throttle's in envoy/demo.yaml and goes through `envoy --mode validate`
(which loads the module and runs the filter's on_configure), and one of them
serves traffic.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from harness.procs import Envoy, free_port, http_get, render, throttle_filter
from k8sutil import ROOT, run

ISTIO_FILES = sorted(p for p in (ROOT / "istio").rglob("*.yaml") if p.name != "kustomization.yaml")


def plugin_configs() -> list[tuple[str, str, dict]]:
    """(file, resource, plugin config as written) for every WasmPlugin and throttle EnvoyFilter under istio/."""
    out = []
    for f in ISTIO_FILES:
        for d in yaml.safe_load_all(f.read_text()):
            if not d:
                continue
            where = f"{f.relative_to(ROOT)}:{d['kind']}/{d['metadata']['name']}"
            if d["kind"] == "WasmPlugin":
                out.append((str(f.relative_to(ROOT)), where, d["spec"]["pluginConfig"]))
            elif d["kind"] == "EnvoyFilter":
                for p in d["spec"]["configPatches"]:
                    tc = p["patch"]["value"].get("typed_config", {})
                    if tc.get("@type", "").endswith("filters.http.wasm.v3.Wasm"):
                        out.append((str(f.relative_to(ROOT)), where,
                                    json.loads(tc["config"]["configuration"]["value"])))
    return out


def duration_s(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert m, text
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


CONFIGS = plugin_configs()
WHERE = [w for _, w, _ in CONFIGS]


def istiowasm(tools, registry, files: list[Path], cache: Path) -> tuple[int, dict[str, dict], str]:
    r = run([tools["istiowasm"], "-registry", registry.host, "-cache", str(cache), *map(str, files)], timeout=180)
    out = {}
    for line in r.stdout.splitlines():
        d = json.loads(line)
        out[f"{Path(d['file']).relative_to(ROOT)}:{d['kind']}/{d['name']}"] = d["config"]["config"]
    return r.returncode, out, r.stderr


@pytest.fixture(scope="module")
def istio_built(tools, registry, pushed, tmp_path_factory) -> dict[str, dict]:
    """{file:Kind/name: the Wasm filter `config` Istio builds and istio-agent converts}."""
    files = [f for f in ISTIO_FILES if re.search(r"^kind: (WasmPlugin|EnvoyFilter)$", f.read_text(), re.M)]
    rc, out, err = istiowasm(tools, registry, files, tmp_path_factory.mktemp("agent-cache"))
    assert rc == 0, err[-3000:]
    return out


def with_istio_filter(config: dict, wasm: Path, upstream_port: int) -> dict:
    cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=upstream_port, wasm=wasm)
    throttle_filter(cfg)["typed_config"]["config"] = config
    return cfg


def test_every_kind_has_configs():
    kinds = {w.split(":")[1].split("/")[0] for w in WHERE}
    assert kinds == {"WasmPlugin", "EnvoyFilter"}
    assert len(CONFIGS) >= 5


def test_istio_builds_every_plugin(istio_built, pushed, wasm):
    assert set(istio_built) == set(WHERE)
    _, digest = pushed
    for where, config in istio_built.items():
        local = Path(config["vm_config"]["code"]["local"]["filename"])
        assert local.name == digest.removeprefix("sha256:") + ".wasm", where  # pinned digest, verified by the agent
        assert local.read_bytes() == wasm.read_bytes(), where
        assert config["failure_policy"] == "FAIL_RELOAD", where  # Istio maps failStrategy FAIL_RELOAD


@pytest.mark.parametrize("where, plugin", [(w, c) for _, w, c in CONFIGS], ids=WHERE)
def test_plugin_config_accepted_by_the_filter(where, plugin, istio_built, wasm, upstream):
    config = istio_built[where]
    # the string the filter's on_configure receives is the configuration as written
    assert json.loads(config["configuration"]["value"]) == plugin
    rc, out = Envoy(with_istio_filter(config, wasm, upstream.port), concurrency=1).validate()
    assert rc == 0, f"{where}: refused:\n{out[-3000:]}"
    assert "OK" in out


def test_istio_built_filter_serves(istio_built, wasm, upstream):
    """The WasmPlugin for details, exactly as Istio builds it, throttling in a real Envoy."""
    (where,) = [w for w in istio_built if w.startswith("istio/wasmplugin-sidecar/") and w.endswith("/throttle-details")]
    with Envoy(with_istio_filter(istio_built[where], wasm, upstream.port), concurrency=2) as envoy:
        codes = [http_get(f"{envoy.url}/details/0")[0] for _ in range(20)]
        assert codes == [200] * 20
        stats = envoy.rule_stats("details")
    assert stats["admitted"] + stats["released"] == 20, stats


def test_stale_pin_is_refused_by_istio(tools, registry, pushed, tmp_path):
    """With a sha256 that is not the image's, istio-agent does not run the module: it puts
    its deny-all RBAC filter in its place (fail closed)."""
    src = ROOT / "istio" / "wasmplugin-sidecar" / "wasmplugin.yaml"
    stale = tmp_path / "wasmplugin.yaml"
    stale.write_text(re.sub(r"sha256: [0-9a-f]{64}", "sha256: " + "ab" * 32, src.read_text()))
    rc, out, err = istiowasm(tools, registry, [stale], tmp_path / "cache")
    assert rc != 0 and not out
    assert "RBAC" in err and "checksum" in err, err[-2000:]


def test_the_check_can_fail(wasm):
    """A broken copy of a shipped plugin config is refused by the filter, naming the field."""
    _, where, plugin = CONFIGS[0]
    broken = json.loads(json.dumps(plugin))
    broken["rules"][0]["rate"] = "fast"
    cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=free_port(),
                 plugin=broken, wasm=wasm)
    rc, out = Envoy(cfg, concurrency=1).validate()
    assert rc != 0, out[-2000:]
    assert "rules[0].rate" in out, out[-3000:]


def test_sidecar_wasmplugin_and_envoyfilter_agree():
    """The EnvoyFilter alternative and the waypoint WasmPlugins configure each service like the sidecar WasmPlugins."""
    by_file: dict[str, dict[str, dict]] = {}
    for f, where, cfg in CONFIGS:
        by_file.setdefault(f, {})[where.rsplit("/", 1)[1]] = cfg
    wp = by_file["istio/wasmplugin-sidecar/wasmplugin.yaml"]
    assert by_file["istio/envoyfilter-sidecar/envoyfilter.yaml"] == wp
    assert by_file["istio/wasmplugin-waypoint/wasmplugin.yaml"] == wp


def test_rule_names_unique_per_waypoint():
    """Istio leaves vm_id empty and proxy-wasm shared data is scoped by vm_id, so all
    throttle plugins on one waypoint share the schedule keys: rule names must differ."""
    names = [r["name"] for f, _, cfg in CONFIGS if f == "istio/wasmplugin-waypoint/wasmplugin.yaml"
             for r in cfg["rules"]]
    assert len(names) == len(set(names)), names
