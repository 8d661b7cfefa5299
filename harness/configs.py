"""Envoy configurations: the shipped ones of envoy/, as dicts, with ports, the .wasm
path and the throttle's plugin configuration replaced; the pieces other configs are
built from (the connection managers, the throttle's HTTP filter)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from harness.procs import ROOT, WASM

HCM_NAME = "envoy.filters.network.http_connection_manager"


def load_config(name: str) -> dict:
    """A shipped Envoy config from envoy/, as a dict."""
    return yaml.safe_load((ROOT / "envoy" / name).read_text())


def hcms(cfg: dict) -> list[dict[str, Any]]:
    """The typed configs of every HTTP connection manager of the static listeners."""
    return [f["typed_config"] for listener in cfg.get("static_resources", {}).get("listeners", [])
            for chain in listener.get("filter_chains", []) for f in chain.get("filters", [])
            if f.get("name") == HCM_NAME]


def hcm(cfg: dict) -> dict[str, Any]:
    """The first listener's HTTP connection manager."""
    return hcms(cfg)[0]


def throttle_filter(cfg: dict) -> dict | None:
    """The throttle filter entry of a config's first HTTP connection manager."""
    return next((hf for h in hcms(cfg) for hf in h.get("http_filters", []) if hf.get("name") == "throttle"), None)


def plugin_json(cfg: dict) -> str:
    """The throttle's JSON plugin configuration inside an Envoy config."""
    hf = throttle_filter(cfg)
    if hf is None:
        raise KeyError("no throttle filter in config")
    return str(hf["typed_config"]["config"]["configuration"]["value"])


def throttle_http_filter(plugin: dict | str | None = None, wasm: Path = WASM, *, name: str | None = None,
                         runtime: str | None = None) -> dict:
    """The throttle's HTTP filter of envoy/demo.yaml with this .wasm and (if given) plugin
    configuration; with `name`, its own filter name, plugin name and VM (so its shared data
    and statistics are its own); with `runtime`, another Wasm runtime (`wamr`, ...)."""
    hf = throttle_filter(render("demo.yaml", listen_port=0, admin_port=0, upstream_port=0, plugin=plugin, wasm=wasm))
    assert hf is not None, "envoy/demo.yaml has a throttle filter"
    c = hf["typed_config"]["config"]
    if name is not None:
        hf["name"] = c["name"] = f"throttle-{name}"
        c["vm_config"]["vm_id"] = f"vm-{name}"
    if runtime is not None:
        c["vm_config"]["runtime"] = f"envoy.wasm.runtime.{runtime}"
    return hf


def render(base: str, *, listen_port: int, admin_port: int, upstream_port: int,
           plugin: dict | str | None = None, wasm: Path = WASM) -> dict:
    """A shipped config with ports, .wasm path and (optionally) plugin config replaced."""
    cfg = copy.deepcopy(load_config(base))
    cfg["admin"]["address"]["socket_address"]["port_value"] = admin_port
    for listener in cfg["static_resources"]["listeners"]:
        listener["address"]["socket_address"]["port_value"] = listen_port
    for cluster in cfg["static_resources"]["clusters"]:
        for ep in cluster["load_assignment"]["endpoints"]:
            for lb in ep["lb_endpoints"]:
                lb["endpoint"]["address"]["socket_address"]["port_value"] = upstream_port
    hf = throttle_filter(cfg)
    if hf is not None:
        c = hf["typed_config"]["config"]
        c["vm_config"]["code"]["local"]["filename"] = str(wasm)
        if plugin is not None:
            c["configuration"]["value"] = plugin if isinstance(plugin, str) else json.dumps(plugin)
    return cfg
