"""Helpers of the end-to-end tests against a real istiod (tests/istio_e2e, harness/mesh.py):
load from a pod, arrival rates at the application, WasmPlugin edits, what istiod and Envoy say."""

from __future__ import annotations

import copy
import json
import re
import time
import urllib.parse
from typing import Any

import yaml

from harness import windows
from harness.fortio import Load
from harness.kubelet import Pod
from harness.net import http_get, wait_until
from harness.nsforward import call_in

XDS_TYPES = ("cluster", "listener", "route", "endpoint", "extensionconfig")
WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"


def _load(url: str, qps: float, connections: int, duration: str, std_client: bool = False) -> Load:
    return Load(url, connections=connections, qps=qps, duration_s=float(duration.removesuffix("s")),
                allow_initial_errors=True, std_client=std_client)


def load(pod: Pod, url: str, *, qps: float, connections: int, duration: str, timeout: float = 120) -> dict[str, Any]:
    """One bounded Fortio run from inside the pod (as `kubectl exec` would): its figures, plus
    start and end (seconds since the epoch, to compare with the application's arrivals)."""
    start = time.time()
    result = _load(url, qps, connections, duration).run(timeout_s=timeout, prefix=pod.node.argv([]))
    return {**result.summary(), "start": start, "end": time.time()}


class Background:
    """A Fortio run from a pod in the background (several clients at once)."""

    def __init__(self, pod: Pod, url: str, *, qps: float, connections: int, duration: str,
                 std_client: bool = False):
        self.pod = pod
        self.start = time.time()
        self.running = _load(url, qps, connections, duration, std_client).start(prefix=pod.node.argv([]))

    def result(self, timeout: float = 120) -> dict[str, Any]:
        result = self.running.result(timeout)
        return {**result.summary(), "start": self.start, "end": time.time()}


def rate_at_app(stamps: list[float], start: float, end: float, trim: float = 1.0) -> float:
    """Arrivals per second at the application over [start + trim, end - trim): the steady part of
    a run (the first second fills the schedule, the last drains the queue)."""
    return windows.rate(stamps, start + trim, end - trim)


def per_second(stamps: list[float], start: float, end: float) -> list[int]:
    return windows.window_counts(stamps, start, end, 1.0)


def get_in(pod: Pod, url: str, headers: dict[str, str] | None = None, timeout: float = 10) -> tuple[int, dict, bytes]:
    """One GET from inside the pod (its capture applies: the pod's proxy sees it). The host name
    is looked up in the pod's /etc/hosts (a thread in the pod's network namespace still reads
    the host's), and sent as the Host header."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    ip = pod.node.hosts.get(host, host)
    target = parts._replace(netloc=f"{ip}:{parts.port}" if parts.port else ip).geturl()
    hdrs_out = {"Host": parts.netloc, **(headers or {})}
    status, hdrs, body = call_in(pod.node.ns, lambda: http_get(target, timeout=timeout, headers=hdrs_out))
    return status, {k.lower(): v for k, v in hdrs.items()}, body


def first_429(pod: Pod, url: str, within: float, parallel: int = 20) -> tuple[int, dict, bytes]:
    """Rounds of `parallel` concurrent GETs from the pod until one is answered 429 (or `within` s
    pass): that answer, else the last one. Under overload a few requests may still find a free
    slot in the queue; many at once cannot."""
    from concurrent.futures import ThreadPoolExecutor

    deadline = time.monotonic() + within
    with ThreadPoolExecutor(parallel) as ex:
        while True:
            answers = list(ex.map(lambda _: get_in(pod, url), range(parallel)))
            hit = [a for a in answers if a[0] == 429]
            if hit or time.monotonic() > deadline:
                return hit[0] if hit else answers[-1]


# -- WasmPlugins ------------------------------------------------------------------------------

def rendered(kubectl_kustomize_out: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(kubectl_kustomize_out) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (d,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return copy.deepcopy(d)


def with_rule(plugin: dict[str, Any], **rule: Any) -> dict[str, Any]:
    """The WasmPlugin with its (only) rule's fields changed, as a user edits and re-applies it."""
    out = copy.deepcopy(plugin)
    (r,) = out["spec"]["pluginConfig"]["rules"]
    r.update(rule)
    for k in [k for k, v in r.items() if v is None]:
        del r[k]
    out["metadata"] = {k: v for k, v in out["metadata"].items() if k in ("name", "namespace", "labels")}
    return out


# -- what Envoy and istiod say ------------------------------------------------------------

CONFIGURED = re.compile(r"throttle\[root \d+\]: configured (\d+) rule\(s\): (.*)")


def configured_lines(pod: Pod) -> list[str]:
    """The filter's 'configured N rule(s): ...' lines in the pod's proxy log, in order."""
    return [m.group(0) for m in CONFIGURED.finditer(pod.log())]


def wait_configured(pod: Pod, before: int, needle: str, timeout: float = 90) -> str:
    """Waits for a new 'configured' line containing `needle` (after the first `before` lines)."""
    def new() -> str | None:
        lines = configured_lines(pod)[before:]
        hit = [line for line in lines if needle in line]
        return hit[-1] if hit else None

    try:
        return str(wait_until(new, timeout, f"'configured ... {needle}' in {pod.name}'s log", interval=0.5))
    except TimeoutError:
        raise TimeoutError(f"no 'configured ... {needle}' in {pod.name}'s log within {timeout} s:\n"
                           f"{pod.log()[-3000:]}") from None


def ecds_wasm(pod: Pod) -> list[dict[str, Any]]:
    """The Wasm filters the proxy holds through ECDS (Envoy's /config_dump, ecds_filters)."""
    status, body = pod.admin("/config_dump?resource=ecds_filters")
    assert status == 200, body[:500]
    out = []
    for entry in json.loads(body).get("configs", []):
        f = entry.get("ecds_filter", {})
        if f.get("typed_config", {}).get("@type") == WASM_TYPE:
            out.append(f)
    return out


def ecds_types(pod: Pod, name: str) -> list[str]:
    """The types of the ECDS filters whose name contains `name` (Wasm, or what replaced it)."""
    status, body = pod.admin("/config_dump?resource=ecds_filters")
    assert status == 200, body[:500]
    return [e["ecds_filter"]["typed_config"]["@type"] for e in json.loads(body).get("configs", [])
            if name in e.get("ecds_filter", {}).get("name", "")]


def http_filter_names(pod: Pod, listener_match: str) -> list[list[str]]:
    """For each HCM of the listeners whose name contains `listener_match`: its HTTP filters' names."""
    status, body = pod.admin("/config_dump?resource=dynamic_listeners")
    assert status == 200, body[:500]
    out = []
    for entry in json.loads(body).get("configs", []):
        active = entry.get("active_state", {}).get("listener", {})
        if listener_match not in active.get("name", ""):
            continue
        for chain in active.get("filter_chains", []):
            for f in chain.get("filters", []):
                hcm = f.get("typed_config", {})
                if "http_filters" in hcm:
                    out.append([h["name"] for h in hcm["http_filters"]])
    return out


def rule_stats(pod: Pod, rule: str) -> dict[str, int]:
    """A rule's counters and gauges from the pod's Envoy admin (wasmcustom.throttle.rule.<rule>.<stat>)."""
    status, body = pod.admin(f"/stats?filter=^wasmcustom\\.throttle\\.rule\\.{rule}\\.")
    assert status == 200, body[:500]
    out = {}
    for line in body.splitlines():
        name, _, value = line.partition(": ")
        if value.strip().lstrip("-").isdigit():
            out[name.rsplit(".", 1)[1]] = int(value)
    return out


def cluster_hosts(pod: Pod, cluster: str) -> list[str] | None:
    """The addresses of a cluster's hosts in the pod's Envoy (admin /clusters), None without it."""
    status, body = pod.admin("/clusters?format=json")
    assert status == 200, body[:500]
    for c in json.loads(body)["cluster_statuses"]:
        if c["name"] == cluster:
            return sorted(h["address"]["socket_address"]["address"] for h in c.get("host_statuses", [])
                          if "socket_address" in h.get("address", {}))
    return None


def cluster_endpoints(pod: Pod, cluster: str) -> list[str] | None:
    """A cluster's hosts in the pod's Envoy: `ip` for an address, `<listener>|<endpoint id>` for an
    internal address (Istio's HBONE endpoints: connect_originate with the target as id); None
    without the cluster."""
    status, body = pod.admin("/clusters?format=json")
    assert status == 200, body[:500]
    for c in json.loads(body)["cluster_statuses"]:
        if c["name"] == cluster:
            out = []
            for h in c.get("host_statuses", []):
                addr = h.get("address", {})
                if "socket_address" in addr:
                    out.append(addr["socket_address"]["address"])
                elif "envoy_internal_address" in addr:
                    internal = addr["envoy_internal_address"]
                    out.append(f"{internal.get('server_listener_name', '')}|{internal.get('endpoint_id', '')}")
            return sorted(out)
    return None


def syncz_for(cp: Any, proxy_ids: list[str]) -> dict[str, dict[str, Any]]:
    """istiod's /debug/syncz rows of these proxies."""
    rows = {r["proxy"]: r for r in cp.syncz()}
    return {p: rows[p] for p in proxy_ids if p in rows}


def unacked(row: dict[str, Any]) -> list[str]:
    """The xDS types istiod sent this proxy that it has not acknowledged (or NACKed)."""
    return [t for t in XDS_TYPES if row.get(f"{t}_sent", "") != row.get(f"{t}_acked", "")] + nacked(row)


def nacked(row: dict[str, Any]) -> list[str]:
    """The xDS types this proxy rejected, with the proxy's error."""
    return [f"{t}: {s['lastError']}" for t, s in row.get("resources", {}).items() if s.get("lastError")]


def wait_acked(cp: Any, proxy_ids: list[str], timeout: float = 90) -> dict[str, dict[str, Any]]:
    """istiod's rows of these proxies once each has ACKed every xDS type istiod sent it. istiod
    pushes again whenever an endpoint or a pod changes, so a single read can catch a push in
    flight (sent nonce ahead of the acked one: CI saw that for fortio-0's sidecar, 2026-11-29);
    that is waited out. A NACK is a rejected configuration and fails at once."""
    def settled() -> dict[str, dict[str, Any]] | None:
        rows = syncz_for(cp, proxy_ids)
        rejected = {p: nacked(r) for p, r in rows.items() if nacked(r)}
        assert not rejected, rejected
        return rows if len(rows) == len(proxy_ids) and not any(unacked(r) for r in rows.values()) else None
    return wait_until(settled, timeout, f"istiod: every xDS type ACKed by {proxy_ids}", interval=0.5)
