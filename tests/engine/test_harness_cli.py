"""The `python -m harness.engine` contract: one JSON line with a complete Envoy
cluster named `throttle_engine` that reaches the service, everything on
loopback, and everything stopped on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from harness.engine import DOMAIN, LIMIT, descriptor, post_json
from harness.net import can_connect, free_port, wait_until
from harness.procs import ROOT, envoy_bin

pytestmark = pytest.mark.integration


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_prints_one_cluster_line_and_stops_everything_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "harness.engine"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        doc = json.loads(line)
        assert list(doc) == ["envoy_cluster"]
        cluster = doc["envoy_cluster"]
        assert cluster["name"] == "throttle_engine"
        [ep] = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        addr = ep["endpoint"]["address"]["socket_address"]
        assert addr["address"] == "127.0.0.1"
        port = addr["port_value"]
        # It reaches the service: a claim is counted.
        status, body = post_json(port, {"domain": DOMAIN, "descriptors": [
            descriptor("throttle_slots", "cli:1:1:1", 2)]})
        assert status == 200 and json.loads(body)["statuses"][0]["limitRemaining"] == LIMIT - 2
        # Envoy accepts the cluster as it is.
        cfg = {"static_resources": {"clusters": [cluster]},
               "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": free_port()}}}}
        path = tmp_path / "envoy.yaml"
        path.write_text(yaml.safe_dump(cfg))
        v = subprocess.run([envoy_bin(), "--mode", "validate", "-c", str(path)], capture_output=True, text=True,
                           timeout=120)
        assert v.returncode == 0, v.stdout + v.stderr
        # Nothing it started listens beyond loopback.
        kids = children_of(proc.pid)
        assert len(kids) == 2, kids  # redis-server and ratelimit
        ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
        mine = [row for row in ss.splitlines() if any(f"pid={k}," in row for k in kids)]
        assert mine and all(" 127.0.0.1:" in row for row in mine), mine
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout.read() == "", "exactly one line on stdout"
        wait_until(lambda: not can_connect(port), 10, "the service's port to close")
        assert all(not os.path.exists(f"/proc/{k}") for k in kids)
    finally:
        # SIGTERM first: the harness stops its own children; SIGKILL would orphan them.
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
