"""The priority benchmark's summary (summary.md): per scenario, each arm's figures per class;
the total rate at the upstream; the scenarios skipped and why; and the key figures the issue
asks for, from this one run."""

from __future__ import annotations

from typing import Any

from harness.tables import markdown, num


def _find(rows: list[dict[str, Any]], scenario: str, arm: str, cls: str) -> dict[str, Any] | None:
    return next((r for r in rows if (r["scenario"], r["arm"], r["class"]) == (scenario, arm, cls)), None)


def key_figures(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's closing figures, where this run has them."""
    out = []
    alone, mixed = _find(rows, "alone", "throttle", "critical"), _find(rows, "mixed-2x", "throttle", "critical")
    for label, r in (("without batch load (alone)", alone), ("with batch load (mixed-2x)", mixed)):
        if r:
            out.append(f"- critical {label}: {r['rejected']} rejected of {r['sent']}, p99 "
                       f"{num(r['p99_ms'])} ms (successes, 5 ms of service included), filter's wait p99 "
                       f"{num(r['wait_p99_ms'], missing='-')} ms")
    starved = _find(rows, "starvation", "throttle", "batch")
    if starved:
        out.append(f"- floor (batch, min_share 0.1) with critical alone above the rate: batch got "
                   f"{num(100 * starved['share'] if starved['share'] is not None else None)}% of the releases "
                   f"({num(starved['upstream_per_s'])}/s)")
    if mixed:
        out.append(f"- total rate at the upstream (mixed-2x, throttle): {num(mixed['total_per_s'], '.2f')}/s, "
                   f"{num(mixed['total_error_pct'], '+.2f')}% from the rate")
    displaced = [r["displaced"] for r in rows if r["arm"].startswith("throttle") and r["displaced"] is not None]
    if displaced:
        out.append(f"- displaced (all throttle arms, all classes): {sum(displaced)}")
    return out


def summary(env: dict[str, Any], rows: list[dict[str, Any]], skipped: list[dict[str, str]]) -> str:
    lines = [f"# Priority classes: run {env['run_id']}", "",
             f"{env['host']} ({env['cpus']} cores, load {num(env['loadavg_start'][0])} at the start), "
             f"Envoy {env['envoy']}, Vegeta {env['vegeta']}, git {env['git']}. Rule rate "
             f"{num(env['rate'])}/s; upstream service {num(env['service_ms'])} ms; "
             f"{num(env['duration_s'])} s per scenario and arm; open-loop load, one Vegeta attack per class.", ""]
    figures = key_figures(rows)
    if figures:
        lines += ["## Key figures", "", *figures, ""]
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        lines += [f"## {scenario}", ""]
        table = [[r["arm"], r["class"], num(r["offered_per_s"]), num(r["ok_pct"]), r["rejected"],
                  num(r["displaced"], missing="-"), num(r["p50_ms"]), num(r["p99_ms"]),
                  num(r["wait_p99_ms"], missing="-"), num(r["upstream_per_s"]),
                  num(100 * r["share"] if r["share"] is not None else None)]
                 for r in rows if r["scenario"] == scenario]
        lines += [markdown(["arm", "class", "offered /s", "ok %", "rejected", "displaced", "p50 ms", "p99 ms",
                            "wait p99 ms", "upstream /s", "share %"], table), ""]
        totals = {r["arm"]: r for r in rows if r["scenario"] == scenario}
        lines += [markdown(["arm", "total at the upstream /s", "vs the rate (HAProxy: its capacity) %"],
                           [[a, num(r["total_per_s"], ".2f"), num(r["total_error_pct"], "+.2f")]
                            for a, r in totals.items()]), ""]
    if skipped:
        lines += ["## Skipped", "", markdown(["scenario", "arm", "why"],
                                             [[s["scenario"], s["arm"], s["why"]] for s in skipped]), ""]
    return "\n".join(lines)
