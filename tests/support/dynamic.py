"""Envoy fed by file-based dynamic configuration: the listener (with the
throttle filter and its plugin configuration) comes from an LDS file that
Envoy watches. `DynamicEnvoy.update()` replaces the file by an atomic rename,
which is what triggers the watch."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import yaml

from harness.configs import render
from harness.envoy import Envoy
from harness.net import wait_until

LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"


def dynamic_config(*, listen_port: int, admin_port: int, upstream_port: int, plugin: dict | str,
                   wasm: Path, lds_dir: Path) -> tuple[dict, dict]:
    """(bootstrap, listener) from envoy/demo.yaml: the listener moves to LDS."""
    static = render("demo.yaml", listen_port=listen_port, admin_port=admin_port,
                    upstream_port=upstream_port, plugin=plugin, wasm=wasm)
    listener = static["static_resources"].pop("listeners")[0]
    listener["@type"] = LISTENER_TYPE
    lds_path = lds_dir / "lds.yaml"
    static["node"] = {"id": "throttle-reliability", "cluster": "throttle-reliability"}
    static["dynamic_resources"] = {
        "lds_config": {
            "resource_api_version": "V3",
            "path_config_source": {"path": str(lds_path), "watched_directory": {"path": str(lds_dir)}},
        }
    }
    return static, listener


def with_plugin(listener: dict, plugin: dict | str) -> dict:
    """A copy of the listener with another plugin configuration."""
    out = copy.deepcopy(listener)
    hf = out["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0]
    hf["typed_config"]["config"]["configuration"]["value"] = plugin if isinstance(plugin, str) else json.dumps(plugin)
    return out


class DynamicEnvoy(Envoy):
    """An Envoy whose listener is read from a watched LDS file."""

    def __init__(self, bootstrap: dict, listener: dict, lds_dir: Path, concurrency: int = 2,
                 drain_time_s: int | None = None):
        extra = [] if drain_time_s is None else ["--drain-time-s", str(drain_time_s)]
        super().__init__(bootstrap, concurrency=concurrency, extra_args=extra)
        self.port = listener["address"]["socket_address"]["port_value"]
        self.lds_dir = lds_dir
        self.lds_path = lds_dir / "lds.yaml"
        self.listener = listener
        self.version = 0
        self._write(listener)

    def _write(self, listener: dict) -> None:
        self.version += 1
        tmp = self.lds_dir / f".lds-{self.version}.yaml"
        tmp.write_text(yaml.safe_dump({"version_info": str(self.version), "resources": [listener]}))
        os.rename(tmp, self.lds_path)  # atomic: the watch fires on the move

    def _ready(self) -> bool:
        if not super()._ready():
            return False
        return self.counter("listener_manager.lds.update_success") >= 1 and self.counter(
            "listener_manager.total_listeners_active") >= 1

    def lds(self) -> dict[str, int]:
        return {k: self.counter(f"listener_manager.lds.{k}") for k in ("update_success", "update_rejected",
                                                                         "update_attempt")}

    def update(self, listener: dict, timeout: float = 15.0) -> str:
        """Writes a new listener; waits until Envoy accepted or rejected it: returns which."""
        before = self.lds()
        self._write(listener)

        def outcome():
            now = self.lds()
            if now["update_success"] > before["update_success"]:
                return "accepted"
            if now["update_rejected"] > before["update_rejected"]:
                return "rejected"
            return None

        return wait_until(outcome, timeout, "LDS update accepted or rejected")
