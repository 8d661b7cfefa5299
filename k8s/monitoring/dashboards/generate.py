"""Generates the Grafana dashboards (JSON) with grafana-foundation-sdk.

    .venv/bin/python k8s/monitoring/dashboards/generate.py          # rewrite the JSON files
    .venv/bin/python k8s/monitoring/dashboards/generate.py --check  # exit 1 if they are stale

Two dashboards, provisioned into Grafana by the `grafana-dashboards` ConfigMap:
- throttle.json: the throttle's decisions per rule, held requests, wait-time quantiles, priority
  classes (passed, share of the releases, rejected and displaced, wait per class), cluster scope
  (calls to the engine per proxy, fallback, grid slots, the rate of all proxies), and adaptive
  rules (the learned rate per proxy vs passed and offered, what moved it);
- mesh.json: request rate and p50/p90/p99 per workload from Istio's standard metrics.

Every query uses only the template variables defined here; tests/k8s/test_k8s_dashboards.py
fills them in and runs each throttle query against a real Prometheus scraping a real Envoy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.builders import timeseries as ts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

HERE = Path(__file__).resolve().parent
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"


def datasource_var() -> db.DatasourceVariable:
    return db.DatasourceVariable("datasource").label("Data source").type("prometheus")


def query_var(name: str, label: str, query: str) -> db.QueryVariable:
    return (db.QueryVariable(name).label(label).datasource(DS).query(query)
            .multi(True).include_all(True).all_value(".*")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC))


def textbox_var(name: str, label: str, default: str, description: str) -> db.TextBoxVariable:
    return (db.TextBoxVariable(name).label(label).description(description).default_value(default)
            .current(dm.VariableOption(selected=True, text=default, value=default)))


def custom_var(name: str, label: str, values: list[str]) -> db.CustomVariable:
    return (db.CustomVariable(name).label(label).values(",".join(values))
            .current(dm.VariableOption(selected=True, text=values[0], value=values[0])))


def panel(title: str, unit: str, targets: list[tuple[str, str]], description: str = "",
          w: int = 12, h: int = 8) -> ts.Panel:
    p = ts.Panel().title(title).description(description).unit(unit).datasource(DS).span(w).height(h).min(0)
    for i, (expr, legend) in enumerate(targets):
        p = p.with_target(prom.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i)).range())
    return p


THROTTLE_SEL = 'throttle_rule=~"$rule", namespace=~"$namespace"'
# One Envoy process: a pod in Kubernetes (`pod`, set by the scrape configuration), a scrape
# target elsewhere (`instance`).
PROXY = "pod, instance"
PROXY_LEGEND = "{{throttle_rule}} {{pod}} {{instance}}"


def rate_of(stat: str, by: str = "throttle_rule") -> str:
    return f"sum by ({by}) (rate(throttle_{stat}{{{THROTTLE_SEL}}}[{RATE}]))"


def cluster_scope_panels(d: db.Dashboard) -> db.Dashboard:
    """The row of `scope: "cluster"` rules (filters/throttle/README.md "Cluster scope"):
    process-scope rules do not define their stats (no series)."""
    d = d.with_row(db.Row("Cluster scope (rules with scope: cluster)"))
    d = d.with_panel(panel("Engine calls /s per proxy", "reqps", [(rate_of("engine_calls", f"throttle_rule, {PROXY}"),
                                                                   PROXY_LEGEND)],
                           "Calls to the rate limit service that carried the rule, per Envoy process: at most "
                           "10 per second each, whatever the traffic, none while the rule has no demand.", w=8))
    d = d.with_panel(panel("Engine failures /s per proxy", "reqps",
                           [(rate_of("engine_failures", f"throttle_rule, {PROXY}"), PROXY_LEGEND)],
                           "Calls that failed: transport error, non-200, later than engine.timeout, or an answer "
                           "that makes no sense. After engine.fallback_after of failures the rule falls back.",
                           w=8))
    d = d.with_panel(panel("Time in fallback per proxy", "percentunit", [(
        f"sum by (throttle_rule, {PROXY}) (rate(throttle_fallback_ms{{{THROTTLE_SEL}}}[{RATE}])) / 1000",
        PROXY_LEGEND)],
        "Share of the time each proxy paced the rule by its on_engine_failure fallback instead of the shared "
        "grid (from the gauge fallback_ms, total milliseconds in fallback).", w=8))
    d = d.with_panel(panel("Grid slots granted vs taken /s", "reqps", [
        (rate_of("slots_granted"), "{{throttle_rule}} granted"),
        (rate_of("slots_taken"), "{{throttle_rule}} taken"),
        (rate_of("slots_forgiven"), "{{throttle_rule}} forgiven"),
    ], "Slots of the shared grid the engine granted to all proxies, and the slots their requests used. "
       "Granted beyond taken is demand that did not come. Forgiven: held requests that went at their "
       "max_queue_delay because a failed engine call cost their proxy the share their turns counted on.", w=8))
    d = d.with_panel(panel("Granted slots unused", "short", [(
        f"sum by (throttle_rule) (throttle_slots_unused{{{THROTTLE_SEL}}})", "{{throttle_rule}}")],
        "Slots granted to the proxies that passed unused (granted - taken - still usable), summed.", w=8))
    d = d.with_panel(panel("Rate of all proxies vs configured", "reqps", [
        (f"{rate_of('released')} + {rate_of('admitted')}", "{{throttle_rule}} passed (all proxies)"),
        (rate_of("requests"), "{{throttle_rule}} offered"),
        ("vector($configured_rate)", "configured rate"),
    ], "Requests passed to the upstream (released + admitted), summed over every proxy: at most the "
       "configured rate while the engine answers. Offered: requests the rule applied to. The configured "
       "rate is the dashboard's `configured_rate` box (the filter does not export it).", w=8))
    return d


CLASS_SEL = f'{THROTTLE_SEL}, throttle_class=~"$class"'
BY_CLASS = "throttle_rule, throttle_class"
CLASS_LEGEND = "{{throttle_rule}} {{throttle_class}}"


def class_rate(stat: str, sel: str = CLASS_SEL) -> str:
    return f"sum by ({BY_CLASS}) (rate(throttle_class_{stat}{{{sel}}}[{RATE}]))"


def class_panels(d: db.Dashboard) -> db.Dashboard:
    """The row of rules with priority classes (filters/throttle/README.md "Priority classes"):
    no series for rules without them."""
    d = d.with_row(db.Row("Priority classes (rules with classes)"))
    passed = f"{class_rate('admitted')} + {class_rate('released')}"
    all_classes = f"{class_rate('admitted', THROTTLE_SEL)} + {class_rate('released', THROTTLE_SEL)}"
    d = d.with_panel(panel("Passed per class /s", "reqps", [(passed, CLASS_LEGEND)],
                           "Requests of each class that went to the upstream (admitted at once + released): "
                           "together, the rule's rate.", w=6))
    d = d.with_panel(panel("Share of the releases per class", "percentunit", [(
        f"({passed}) / ignoring(throttle_class) group_left sum by (throttle_rule) ({all_classes})", CLASS_LEGEND)],
        "Each class's part of what the rule passed. While a class with min_share has requests waiting, its "
        "part stays at or above its min_share, whatever the classes above it offer.", w=6))
    d = d.with_panel(panel("Displaced and rejected per class /s", "reqps", [
        (class_rate("rejected"), "{{throttle_rule}} {{throttle_class}} rejected"),
        (class_rate("displaced"), "{{throttle_rule}} {{throttle_class}} displaced"),
    ], "Rejected: answered at once (estimated turn beyond the class's max_queue_delay, ...). Displaced: held, "
       "then pushed past the class's max_queue_delay by higher classes and answered then.", w=6))
    d = d.with_panel(panel("Wait per class (p50, p99)", "ms", [
        (f"histogram_quantile({q}, sum by ({BY_CLASS}, le) (rate(throttle_class_wait_ms_bucket{{{CLASS_SEL}}}"
         f"[{RATE}])))", f"{{{{throttle_rule}}}} {{{{throttle_class}}}} p{int(q * 100)}")
        for q in (0.5, 0.99)
    ], "How long released requests of each class were held (histogram throttle_class_wait_ms).", w=6))
    return d


def adaptive_panels(d: db.Dashboard) -> db.Dashboard:
    """The row of rules with `adaptive` (filters/throttle/README.md "Adaptive pacing"): one learned
    rate per rule per Envoy process; other rules do not define its stats (no series)."""
    d = d.with_row(db.Row("Adaptive (rules with adaptive)"))
    d = d.with_panel(panel("Learned rate vs passed, per proxy", "reqps", [
        (f"max by (throttle_rule, {PROXY}) (throttle_adaptive_rate{{{THROTTLE_SEL}}}) / 1000",
         "{{throttle_rule}} {{pod}} {{instance}} learned"),
        (f"{rate_of('released', f'throttle_rule, {PROXY}')} + {rate_of('admitted', f'throttle_rule, {PROXY}')}",
         "{{throttle_rule}} {{pod}} {{instance}} passed"),
        (rate_of("requests", f"throttle_rule, {PROXY}"), "{{throttle_rule}} {{pod}} {{instance}} offered"),
    ], "The rate each Envoy process paces the rule at, learned from the upstream's answers (gauge "
       "adaptive_rate, requests per second x 1000; in observe mode the rate it would pace at), within "
       "the rule's min_rate..max_rate; and what it passed upstream (released + admitted) and was offered.",
        w=12))
    d = d.with_panel(panel("What moved the learned rate /s", "short", [
        (rate_of(f"adaptive_{why}"), f"{{{{throttle_rule}}}} {why}")
        for why in ("shed", "failed", "queue", "drained", "probe", "kept", "retry_after")
    ], "Cuts: shed (429/503 beyond the tolerance), failed (other 5xx, resets), queue (requests in flight "
       "and latency kept growing). Drained: a queue gone, back to the capacity measured. Probe: a short "
       "step above the rate; kept: the upstream delivered it. retry_after: rounds the upstream's "
       "Retry-After held probes back.", w=12))
    return d


def throttle_dashboard() -> db.Dashboard:

    d = (db.Dashboard("Throttle").uid("envoy-throttle").tags(["envoy", "wasm", "throttle"])
         .description("The proxy-wasm throttle: decisions per rule, held requests and wait time. "
                      "Counters are per Envoy process and summed over pods.")
         .refresh("10s").time("now-15m", "now")
         .with_variable(datasource_var())
         .with_variable(query_var("namespace", "Namespace", "label_values(throttle_admitted, namespace)"))
         .with_variable(query_var("rule", "Rule", "label_values(throttle_admitted, throttle_rule)"))
         .with_variable(query_var("class", "Class", "label_values(throttle_class_queued, throttle_class)"))
         .with_variable(textbox_var("configured_rate", "Configured rate (/s)", "2000",
                                    "The rate of the cluster rule shown (its `rate`, per second), drawn as a "
                                    "line in \"Rate of all proxies vs configured\".")))
    decisions = [
        ("admitted", "Admitted at once (fast path)", "Requests within the rate or burst, continued at once."),
        ("queued", "Queued (held)", "Requests held for a later release."),
        ("released", "Released", "Held requests resumed at their turn: the paced stream the upstream sees."),
        ("rejected", "Rejected", "Answered at once with reject_status (429): turn beyond max_queue_delay, "
                                 "full worker queue, or contention."),
        ("cancelled", "Cancelled", "Held requests whose client went away before their turn."),
    ]
    d = d.with_row(db.Row("Decisions per rule"))
    for stat, title, desc in decisions:
        d = d.with_panel(panel(f"{title} /s", "reqps", [(rate_of(stat), "{{throttle_rule}}")], desc, w=8))
    d = d.with_panel(panel("Held now", "short",
                           [(f"sum by (throttle_rule) (throttle_held{{{THROTTLE_SEL}}})", "{{throttle_rule}}")],
                           "Requests held inside Envoy right now, summed over workers and pods.", w=8))
    d = d.with_row(db.Row("Wait time of released requests"))
    quantiles = [
        (f"histogram_quantile({q}, sum by (throttle_rule, le) "
         f"(rate(throttle_wait_ms_bucket{{{THROTTLE_SEL}}}[{RATE}])))", f"{{{{throttle_rule}}}} p{int(q * 100)}")
        for q in (0.5, 0.9, 0.99)
    ]
    d = d.with_panel(panel("Wait time quantiles", "ms", quantiles,
                           "How long released requests were held (histogram throttle_wait_ms).", w=12))
    d = d.with_panel(panel("Mean wait time", "ms", [(
        f"sum by (throttle_rule) (rate(throttle_wait_ms_sum{{{THROTTLE_SEL}}}[{RATE}])) / "
        f"sum by (throttle_rule) (rate(throttle_wait_ms_count{{{THROTTLE_SEL}}}[{RATE}]))", "{{throttle_rule}}")],
        "Mean hold time of released requests.", w=12))
    return adaptive_panels(cluster_scope_panels(class_panels(d)))


MESH_SEL = ('reporter=~"$reporter", destination_workload_namespace=~"$namespace", '
            'destination_workload=~"$workload"')


def mesh_dashboard() -> db.Dashboard:
    d = (db.Dashboard("Mesh comparison").uid("mesh-comparison").tags(["istio", "mesh", "perf"])
         .description("Request rate and latency per workload from Istio's standard metrics. "
                      "Reporter: destination (sidecar), waypoint (ambient with waypoint). "
                      "ztunnel alone reports no HTTP metrics.")
         .refresh("10s").time("now-15m", "now")
         .with_variable(datasource_var())
         .with_variable(custom_var("reporter", "Reporter", ["destination", "waypoint", "source"]))
         .with_variable(query_var("namespace", "Namespace",
                                  "label_values(istio_requests_total, destination_workload_namespace)"))
         .with_variable(query_var("workload", "Workload",
                                  'label_values(istio_requests_total{destination_workload_namespace=~"$namespace"}, '
                                  'destination_workload)')))
    d = d.with_panel(panel("Requests /s per workload", "reqps", [(
        f"sum by (destination_workload) (rate(istio_requests_total{{{MESH_SEL}}}[{RATE}]))",
        "{{destination_workload}}")], w=12))
    d = d.with_panel(panel("Non-2xx /s per workload and code", "reqps", [(
        f'sum by (destination_workload, response_code) (rate(istio_requests_total{{{MESH_SEL}, '
        f'response_code!~"2.."}}[{RATE}]))', "{{destination_workload}} {{response_code}}")],
        "429 here with the throttle on: requests it rejected.", w=12))
    for q in (0.5, 0.9, 0.99):
        d = d.with_panel(panel(f"p{int(q * 100)} latency per workload", "ms", [(
            f"histogram_quantile({q}, sum by (destination_workload, le) "
            f"(rate(istio_request_duration_milliseconds_bucket{{{MESH_SEL}}}[{RATE}])))",
            "{{destination_workload}}")], w=8))
    return d


DASHBOARDS = {"throttle.json": throttle_dashboard, "mesh.json": mesh_dashboard}


def render(builder: db.Dashboard) -> str:
    return json.dumps(builder.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for name, make in DASHBOARDS.items():
        text = render(make())
        path = HERE / name
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(HERE.parent.parent.parent)}")
    if stale:
        print(f"stale dashboards: {', '.join(stale)}: run `make k8s-dashboards`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
