"""The plugin configuration of every shipped Istio resource is parsed by the
filter itself: the string Istio hands the filter -- for a WasmPlugin, its
`pluginConfig` serialised by Istio's own code (tools/istio/pluginjson:
istio.io/api WasmPlugin, protomarshal.ToJSON, as pilot does); for an
EnvoyFilter, its `configuration` value -- is put into envoy/demo.yaml and run
through `envoy --mode validate` with the built .wasm, which runs the filter's
on_configure (a refused config makes Envoy exit non-zero)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from harness.procs import Envoy, free_port, render
from k8sutil import ROOT, run

ISTIO_FILES = sorted(p for p in (ROOT / "istio").rglob("*.yaml") if p.name != "kustomization.yaml")


def plugin_configs() -> list[tuple[str, str, dict]]:
    """(file, resource, plugin config) for every WasmPlugin and throttle EnvoyFilter under istio/."""
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


def test_every_kind_has_configs():
    kinds = {w.split(":")[1].split("/")[0] for _, w, _ in CONFIGS}
    assert kinds == {"WasmPlugin", "EnvoyFilter"}
    assert len(CONFIGS) >= 5


def _validate(plugin: dict | str, wasm: Path) -> tuple[int, str]:
    cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=free_port(),
                 plugin=plugin, wasm=wasm)
    return Envoy(cfg, concurrency=1).validate()


@pytest.fixture(scope="module")
def istio_strings(tools) -> dict[str, str]:
    """{file:WasmPlugin/name: the configuration string Istio builds from pluginConfig}."""
    files = [f for f in ISTIO_FILES if "kind: WasmPlugin" in f.read_text()]
    r = run([tools["pluginjson"], *map(str, files)])
    assert r.returncode == 0, r.stderr
    out = {}
    for line in r.stdout.splitlines():
        d = json.loads(line)
        out[f"{Path(d['file']).relative_to(ROOT)}:WasmPlugin/{d['name']}"] = d["configuration"]
    return out


@pytest.mark.parametrize("where, plugin", [(w, c) for _, w, c in CONFIGS], ids=[w for _, w, _ in CONFIGS])
def test_plugin_config_accepted_by_the_filter(where, plugin, wasm, istio_strings):
    if ":WasmPlugin/" in where:
        text = istio_strings[where]  # exactly what istiod puts into the filter's configuration
        assert json.loads(text) == plugin, "Istio's serialisation changes the configuration"
    else:
        text = json.dumps(plugin)
    rc, out = _validate(text, wasm)
    assert rc == 0, f"{where}: refused by the filter:\n{out[-3000:]}"
    assert "OK" in out


def test_every_wasmplugin_went_through_istio(istio_strings):
    assert set(istio_strings) == {w for _, w, _ in CONFIGS if ":WasmPlugin/" in w}


def test_the_check_can_fail(wasm):
    """The same path refuses a broken copy of a shipped config, naming the field."""
    _, where, plugin = CONFIGS[0]
    broken = json.loads(json.dumps(plugin))
    broken["rules"][0]["rate"] = "fast"
    rc, out = _validate(broken, wasm)
    assert rc != 0, out[-2000:]
    assert "rules[0].rate" in out, out[-3000:]


def test_sidecar_wasmplugin_and_envoyfilter_agree():
    """The EnvoyFilter alternative configures each workload exactly like the WasmPlugin."""
    by_file: dict[str, dict[str, dict]] = {}
    for f, where, cfg in CONFIGS:
        name = where.rsplit("/", 1)[1]
        by_file.setdefault(f, {})[name] = cfg
    wp = by_file["istio/wasmplugin-sidecar/wasmplugin.yaml"]
    ef = by_file["istio/envoyfilter-sidecar/envoyfilter.yaml"]
    assert wp == ef
    assert by_file["istio/wasmplugin-waypoint/wasmplugin.yaml"] == wp
