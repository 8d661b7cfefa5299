"""Records small Fortio JSON results on this machine, in run.py's layout, for the
offline tests of the parsing and table code (tests/k8s/data/).

    .venv/bin/python -m perf.mesh.record_local tests/k8s/data --duration 3s

Two configurations, each a real Envoy (envoy/*.yaml, --concurrency 2) in front
of `fortio server` on loopback: `envoy-baseline` (no filter) and `envoy-throttle`
(the filter, at a rate above the load: its fast path). The loads are the
cluster loads scaled down (same qps/connection shapes, a few seconds each).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness import units
from harness.configs import render
from harness.envoy import Envoy
from harness.fortio import FortioServer, Load
from harness.net import free_port
from harness.procs import WASM

from .scenarios import LOADS

CONFIGS = {"envoy-baseline": ("baseline.yaml", None),
           "envoy-throttle": ("demo.yaml", {"rules": [{"name": "default", "rate": "20000/s", "burst": 100,
                                                       "max_queue_delay": "500ms"}]})}
SCALE = {"details-100rps-10c": (100, 10), "details-100rps-10c-close": (100, 10),
         "productpage-1000rps-100c": (1000, 100), "productpage-4000rps-400c": (2000, 200)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--duration", default="3s")
    a = ap.parse_args(argv)
    with FortioServer() as upstream:
        for config, (base, plugin) in CONFIGS.items():
            cfg = render(base, listen_port=free_port(), admin_port=free_port(), upstream_port=upstream.port,
                         plugin=plugin, wasm=WASM)
            with Envoy(cfg, concurrency=2) as envoy:
                for load in LOADS:
                    qps, conns = SCALE[load.name]
                    keepalive = not any(h.lower() == "connection: close" for h in load.headers)
                    result = Load(envoy.url + "/echo", connections=conns, qps=qps, keepalive=keepalive,
                                  duration_s=units.seconds(a.duration)).run().raw
                    out = a.out / config / f"{load.name}.json"
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
                    print(f"{config} {load.name}: {result['ActualQPS']:.1f} req/s (asked {qps}, {conns} conns, "
                          f"keepalive={keepalive}) codes {result['RetCodes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
