"""The pure parts of the side-by-side benchmark (perf/cpu/): statistics,
hand-off pairing, access-log parsing, the profile checks and the one-Envoy
config. Fast: no process is started."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest
import yaml

from harness.windows import window_rates
from perf.cpu import builds, handoff
from perf.cpu import report as cpu_report
from perf.cpu.config import (
    EnvoyListener,
    SpecError,
    envoy_config,
    load_profile,
    parse_profile,
    parse_wasm_overrides,
    throttle_rule,
)
from perf.cpu.stats import (
    Handoff,
    block_order,
    handoff_summary,
    pair_handoffs,
    quantile,
    rotated,
    spread,
    stdev,
    us_per_request,
)

# -- statistics -------------------------------------------------------------------

def test_rotated_rounds_run_every_listener_once_and_each_first_once():
    names = ["a", "b", "c", "d", "e"]
    rounds = [rotated(names, r) for r in range(5)]
    assert all(sorted(r) == names for r in rounds)
    assert [r[0] for r in rounds] == names
    assert rotated(names, 7) == rotated(names, 2)
    assert rotated([], 3) == []


def test_quantile_interpolates_like_numpy():
    assert quantile([1, 2, 3, 4], 0.5) == 2.5
    assert quantile([4, 1, 3, 2], 0.25) == 1.75
    assert quantile([7], 0.9) == 7
    with pytest.raises(ValueError, match="no values"):
        quantile([], 0.5)
    with pytest.raises(ValueError, match=r"q must be in \[0, 1\]"):
        quantile([1], 2)


def test_spread_gives_median_range_and_iqr():
    s = spread([104.0, 110.0, 100.0, 106.0, 130.0])
    assert (s.n, s.median, s.lo, s.hi) == (5, 106.0, 100.0, 130.0)
    assert (s.q1, s.q3) == (104.0, 110.0)
    assert s.iqr_pct == pytest.approx(100 * 6 / 106)
    assert s.range_pct == pytest.approx(100 * 30 / 106)


def test_us_per_request():
    assert us_per_request(1.2, 10000) == pytest.approx(120.0)
    with pytest.raises(ValueError, match="requests must be > 0"):
        us_per_request(1.0, 0)


def test_stdev_is_the_population_one():
    assert stdev([500.0] * 10) == 0
    assert stdev([490.0, 510.0]) == pytest.approx(10.0)
    assert math.isnan(stdev([]))


def test_window_rates_drop_the_partial_last_window():
    stamps = [i * 0.002 for i in range(501)]  # 500/s for 1.0 s
    assert window_rates(stamps, 0.1) == pytest.approx([500.0] * 10)
    assert window_rates([1.0], 0.1) == []


def test_whole_millisecond_timestamps_count_every_window_exactly():
    """nginx's $msec truncates to whole ms; windows that start on a whole ms
    and last whole ms put every truncated stamp where the exact one belongs."""
    rng = random.Random(13)
    for _ in range(50):
        exact = sorted(1000.0 + rng.uniform(0, 5) for _ in range(2500))
        trunc = [math.floor(t * 1000) / 1000 for t in exact]
        start = trunc[0]
        w = 0.1
        # the exact stamps counted into the same windows (from the same start)
        n = int((trunc[-1] - start) / w + 1e-9)
        want = [0] * n
        for t in exact:
            k = int((t - start) / w + 1e-9)
            if 0 <= k < n:
                want[k] += 1
        assert window_rates(trunc, w) == pytest.approx([c / w for c in want])


# -- hand-off ---------------------------------------------------------------------

def test_pair_handoffs_pairs_frees_with_the_next_releases_in_order():
    frees = [(1.000, 0), (1.001, 0), (2.000, 1)]
    waits = [(0.5, 0),               # a free slot: no hand-off
             (1.0004, 1), (1.003, 1), (2.002, 0)]
    pairs = pair_handoffs(frees, waits)
    assert [(h.freed_at, h.released_at) for h in pairs] == [(1.000, 1.0004), (1.001, 1.003), (2.000, 2.002)]
    assert [h.gap_ms for h in pairs] == pytest.approx([0.4, 2.0, 2.0])
    s = handoff_summary(pairs)
    assert s["handoffs"] == 3 and s["cross_pct"] == pytest.approx(100.0)
    assert s["gap_p50_ms"] == pytest.approx(2.0) and s["gap_max_ms"] == pytest.approx(2.0)
    assert s["cross_gap_p50_ms"] == pytest.approx(2.0) and s["same_gap_p50_ms"] is None


def test_pair_handoffs_same_worker_and_simultaneous_events():
    # a free and a release at the same instant: the free comes first
    pairs = pair_handoffs([(1.0, 0), (1.0, 0)], [(1.0, 0), (1.5, 1)])
    assert [(h.from_worker, h.to_worker, h.gap_ms) for h in pairs] == [(0, 0, 0.0), (0, 1, 500.0)]
    s = handoff_summary(pairs)
    assert s["cross_pct"] == 50.0
    assert (s["cross_gap_p50_ms"], s["same_gap_p50_ms"]) == (500.0, 0.0)
    assert handoff_summary([])["handoffs"] == 0 and handoff_summary([])["gap_p50_ms"] is None


def test_block_order_alternates_blocks_so_each_freed_slot_goes_to_the_other_worker():
    by_worker = {0: [f"a{i}" for i in range(10)], 1: [f"b{i}" for i in range(10)]}
    order = block_order(by_worker, 4, 16)
    assert order == ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3", "a4", "a5", "a6", "a7", "b4", "b5", "b6", "b7"]
    worker = {x: x[0] for x in order}
    # closed loop: the request `slots` places behind takes the freed slot
    assert all(worker[order[i]] != worker[order[(i + 4) % 16]] for i in range(16))
    with pytest.raises(ValueError, match="not a multiple"):
        block_order(by_worker, 4, 12)
    with pytest.raises(ValueError, match="worker 1 has 2 items, need 8"):
        block_order({0: list(range(8)), 1: [1, 2]}, 4, 16)


def test_handoff_log_lines_parse_with_missing_time_points():
    text = ("1795469331.456030 39138 120 20450 200\n"
            "1795469331.500000 39140 - - 503\n"
            "garbage\n")
    a, b = handoff.parse_log(text)
    assert a.port == 39138 and a.status == 200
    assert a.released == pytest.approx(1795469331.456150) and a.freed == pytest.approx(1795469331.47648)
    assert (b.released, b.freed, b.status) == (None, None, 503)


def test_handoff_dataclass_gap():
    assert Handoff(1.0, 1.0025, 0, 1).gap_ms == pytest.approx(2.5)


# -- profiles -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["full", "quick"])
def test_shipped_profiles_parse(name):
    p = load_profile(name)
    assert p.listeners and p.shapes
    kinds = {x.kind for x in p.listeners}
    assert {"plain", "noop", "throttle", "local_ratelimit"} <= kinds


def test_full_profile_compares_before_and_after_everywhere():
    p = load_profile("full")
    assert p.builds["before"].ref == "main" and p.builds["after"].path is not None
    assert p.rounds >= 5
    assert {s.qps > 0 for s in p.shapes} == {True, False}  # a fixed offered load and saturation
    assert p.handoff is not None and set(p.handoff.builds) == {"before", "after"}
    assert set(p.handoff.placements) == {"same", "cross"} and (p.handoff.slots, p.handoff.connections) == (4, 40)
    assert p.smoothness is not None and set(p.smoothness.builds) == {"before", "after"} and p.smoothness.nginx
    assert {x.runtime for x in p.listeners if x.wasm} == {"v8", "wamr", "wasmtime"}


GOOD = {"builds": {"after": {"path": "x.wasm"}},
        "cpu": {"listeners": [{"name": "plain"}], "shapes": [{"name": "s", "connections": 2, "requests": 10}]}}


def _with(path: str, value) -> dict:
    d = yaml.safe_load(yaml.safe_dump(GOOD))
    *keys, last = path.split(".")
    node = d
    for k in keys:
        node = node[int(k)] if isinstance(node, list) else node[k]
    if value is KeyError:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return d


@pytest.mark.parametrize("path, value, error", [
    # the shape (perf/cpu/profile.schema.yaml)
    ("speed", 3, "p: Additional properties are not allowed ('speed' was unexpected)"),
    ("builds", KeyError, "p: 'builds' is a required property"),
    ("builds.after", {"path": "x.wasm", "ref": "main"}, "p: builds.after: {'path': 'x.wasm', 'ref': 'main'} has too many"),
    ("builds.after", {"path": "x.so"}, "p: builds.after.path: 'x.so' does not match"),
    ("builds.noop", {"path": "y.wasm"}, "p: builds: 'noop' should not be valid under"),
    ("cpu.listeners.0", {"name": "t", "wasm": "after", "runtime": "wavm"},
     "p: cpu.listeners[0].runtime: 'wavm' is not one of ['v8', 'wamr', 'wasmtime']"),
    ("cpu.listeners.0", {"name": "Plain"}, "p: cpu.listeners[0].name: 'Plain' does not match"),
    ("cpu.shapes.0", {"name": "s", "connections": 2, "requests": 10, "qps": -1},
     "p: cpu.shapes[0].qps: -1 is less than the minimum of 0"),
    ("cpu.rounds", 0, "p: cpu.rounds: 0 is less than the minimum of 1"),
    ("cpu.idle", "soon", "p: cpu.idle: 'soon' does not match"),
    ("handoff", {"builds": ["after"], "placements": ["far"]}, "p: handoff.placements[0]: 'far' is not one of"),
    ("smoothness", {"builds": ["after", "after"]}, "p: smoothness.builds: ['after', 'after'] has non-unique elements"),
    # the rules between fields (perf/cpu/config.py)
    ("cpu.listeners.0", {"name": "t", "wasm": "later"}, "p: cpu.listeners[0].wasm: expected noop or a build name"),
    ("cpu.listeners.0", {"name": "t", "runtime": "v8"}, "p: cpu.listeners[0].runtime: only with wasm"),
    ("cpu.listeners.0", {"name": "t", "wasm": "noop", "local_ratelimit": True},
     "p: cpu.listeners[0]: one filter per listener"),
    ("cpu.shapes.0", {"name": "s", "connections": 16, "requests": 10},
     "p: cpu.shapes[0].requests: expected at least connections (16)"),
    ("cpu.idle", "0s", "p: cpu.idle: expected a duration > 0"),
    ("handoff", {"builds": ["after"], "connections": 30}, "p: handoff.connections: cross needs a multiple of 2 x slots (8)"),
    ("handoff", {"builds": ["after"], "connections": 4}, "p: handoff.connections: expected more than slots (4)"),
    ("handoff", {"builds": ["later"]}, "p: handoff.builds: unknown builds ['later']"),
    ("smoothness", {"builds": ["after"], "window": "2.5ms"}, "p: smoothness.window: expected whole milliseconds"),
])
def test_bad_profiles_are_refused_naming_the_field(path, value, error):
    with pytest.raises(SpecError) as e:
        parse_profile("p", _with(path, value), "f")
    assert f"f: {error}" in str(e.value)


def test_duplicate_listener_names_are_refused():
    d = _with("cpu.listeners", [{"name": "a"}, {"name": "a"}])
    with pytest.raises(SpecError, match=r"names listed more than once: \['a'\]"):
        parse_profile("p", d)


def test_cross_placement_needs_two_workers():
    d = _with("handoff", {"builds": ["after"]})
    d["concurrency"] = 1
    with pytest.raises(SpecError, match="cross needs concurrency 2"):
        parse_profile("p", d)
    d["handoff"]["placements"] = ["same"]
    handoff_spec = parse_profile("p", d).handoff
    assert handoff_spec is not None and handoff_spec.placements == ("same",)


def test_wasm_overrides():
    o = parse_wasm_overrides(["before=git:8f14453", "after=c.wasm"])
    assert (o["before"].ref, o["before"].path) == ("8f14453", None)
    assert (o["after"].ref, o["after"].path) == (None, Path("c.wasm"))
    for bad in ("before", "before=x.so", "Before=x.wasm", "before=git:"):
        with pytest.raises(SpecError, match=re.escape("--wasm: expected NAME=PATH.wasm or NAME=git:REF")):
            parse_wasm_overrides([bad])


def test_a_bad_git_ref_is_named():
    with pytest.raises(ValueError, match="git ref 'no-such-ref-13'"):
        builds.resolve("no-such-ref-13")
    assert len(builds.resolve("HEAD")) == 40


# -- the one Envoy ---------------------------------------------------------------

def _listeners(tmp_path: Path) -> list[EnvoyListener]:
    w = tmp_path / "t.wasm"
    return [EnvoyListener("plain", 10001),
            EnvoyListener("noop", 10002, wasm_path=tmp_path / "noop.wasm"),
            EnvoyListener("throttle-before", 10003, wasm_path=w,
                          rule=throttle_rule("throttle-before", rate="1000000/s", burst=0)),
            EnvoyListener("throttle-wamr", 10004, wasm_path=w, runtime="wamr",
                          rule=throttle_rule("throttle-wamr", rate="1000000/s")),
            EnvoyListener("local-ratelimit", 10005, local_ratelimit=True),
            EnvoyListener("handoff-after", 10006, wasm_path=w, cluster="echo", exact_balance=True,
                          access_log=tmp_path / "h.log", rule=throttle_rule("handoff-after", concurrency=4))]


def _hcm(listener: dict) -> dict:
    return listener["filter_chains"][0]["filters"][0]["typed_config"]


def test_every_listener_has_the_same_connection_manager_but_its_filter(tmp_path):
    cfg = envoy_config(_listeners(tmp_path), admin_port=9000, clusters={"nginx": 8080, "echo": 8081})
    ls = cfg["static_resources"]["listeners"]
    assert [x["address"]["socket_address"]["port_value"] for x in ls] == list(range(10001, 10007))

    def common(x: dict) -> dict:
        h = dict(_hcm(x))
        for k in ("stat_prefix", "http_filters", "route_config", "access_log"):
            h.pop(k, None)
        return h
    assert all(common(x) == common(ls[0]) for x in ls)
    assert _hcm(ls[0])["http_protocol_options"]["accept_http_10"] is True
    names = [[f["name"] for f in _hcm(x)["http_filters"]] for x in ls]
    assert names[0] == ["envoy.filters.http.router"]
    assert names[4] == ["envoy.filters.http.local_ratelimit", "envoy.filters.http.router"]
    assert all(n[-1] == "envoy.filters.http.router" and len(n) == 2 for n in names[1:])
    lrl = _hcm(ls[4])["http_filters"][0]["typed_config"]["token_bucket"]
    assert lrl["tokens_per_fill"] == 1000000


def test_each_wasm_listener_has_its_own_vm_rule_and_runtime(tmp_path):
    cfg = envoy_config(_listeners(tmp_path), admin_port=9000, clusters={"nginx": 8080, "echo": 8081})
    ls = cfg["static_resources"]["listeners"]
    wasm = [_hcm(x)["http_filters"][0]["typed_config"]["config"] for x in ls[1:4] + ls[5:]]
    assert len({c["vm_config"]["vm_id"] for c in wasm}) == 4
    assert [c["vm_config"]["runtime"] for c in wasm] == ["envoy.wasm.runtime.v8"] * 2 + [
        "envoy.wasm.runtime.wamr", "envoy.wasm.runtime.v8"]
    assert wasm[0]["vm_config"]["code"]["local"]["filename"] == str(tmp_path / "noop.wasm")
    import json
    rule = json.loads(wasm[1]["configuration"]["value"])["rules"]
    assert rule == [{"name": "throttle-before", "rate": "1000000/s", "burst": 0, "match": {"path_prefix": "/"}}]
    gate = json.loads(wasm[3]["configuration"]["value"])["rules"][0]
    assert gate["concurrency"] == 4


def test_handoff_listener_balances_connections_and_logs_time_points(tmp_path):
    cfg = envoy_config(_listeners(tmp_path), admin_port=9000, clusters={"nginx": 8080, "echo": 8081})
    ho = cfg["static_resources"]["listeners"][5]
    assert ho["connection_balance_config"] == {"exact_balance": {}} and ho["enable_reuse_port"] is False
    assert _hcm(ho)["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] == "echo"
    fmt = _hcm(ho)["access_log"][0]["typed_config"]["log_format"]["text_format_source"]["inline_string"]
    assert "%DOWNSTREAM_REMOTE_PORT%" in fmt and "US_TX_BEG" in fmt and "US_RX_END" in fmt
    assert {c["name"]: c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"]["port_value"] for c in cfg["static_resources"]["clusters"]} == {"nginx": 8080,
                                                                                                "echo": 8081}


def test_bad_listener_sets_are_refused(tmp_path):
    ls = _listeners(tmp_path)
    with pytest.raises(SpecError, match="names must be unique"):
        envoy_config([*ls, EnvoyListener("plain", 1)], admin_port=1, clusters={"nginx": 1, "echo": 2})
    with pytest.raises(SpecError, match="ports must be unique"):
        envoy_config([*ls, EnvoyListener("other", 10001)], admin_port=1, clusters={"nginx": 1, "echo": 2})
    with pytest.raises(SpecError, match="handoff-after: no cluster 'echo'"):
        envoy_config(ls, admin_port=1, clusters={"nginx": 1})
    with pytest.raises(SpecError, match=re.escape("a throttle rule needs a .wasm")):
        envoy_config([EnvoyListener("x", 1, rule={"name": "x"})], admin_port=1, clusters={"nginx": 1})


# -- the summary -------------------------------------------------------------------

def _row(r, shape, listener, kind, us, runtime="v8"):
    return {"round": r, "shape": shape, "listener": listener, "kind": kind, "runtime": runtime if kind in
            ("noop", "throttle") else "", "envoy_us_per_req": us, "envoy_workers_us_per_req": us - 1,
            "achieved_qps": 2000.0, "client_us_per_req": 50.0, "nginx_us_per_req": 30.0, "loadavg_1m": 1.0}


def test_cpu_table_gives_median_spread_and_the_throttles_own_work():
    rows = []
    for r, bump in enumerate((0.0, 2.0, -1.0, 1.0, 10.0)):
        rows += [_row(r, "s", "plain", "plain", 100 + bump), _row(r, "s", "noop", "noop", 110 + bump),
                 _row(r, "s", "throttle-after", "throttle", 113 + bump),
                 _row(r, "s", "local-ratelimit", "local_ratelimit", 105 + bump)]
    headers, table = cpu_report.cpu_table(rows, "s", ["plain", "noop", "throttle-after", "local-ratelimit"])
    by = {t[0]: dict(zip(headers, t, strict=False)) for t in table}
    assert by["plain"]["Envoy µs/req (median)"] == "**101.0**" and by["plain"]["min–max"] == "99.0–110.0"
    assert by["throttle-after"]["vs no-op floor, per round"] == "+3.0 (+3.0 to +3.0)"
    assert by["throttle-after"]["vs plain, per round"] == "+13.0 (+13.0 to +13.0)"
    assert by["noop"]["vs no-op floor, per round"] == "-" and by["plain"]["vs plain, per round"] == "-"
    assert by["local-ratelimit"]["vs plain, per round"] == "+5.0 (+5.0 to +5.0)"
    assert by["plain"]["IQR"] == f"{100 * 2 / 101:.1f}%" and by["plain"]["rounds"] == "5"


def test_runtime_table_names_a_missing_runtime_with_envoys_line():
    rows = [_row(1, "s", "noop", "noop", 110), _row(1, "s", "throttle-after", "throttle", 114)]
    runtimes = {"v8": {"loads": True, "log": None},
                "wamr": {"loads": False, "log": "Envoy was compiled without support for it"}}
    _, table = cpu_report.runtime_table(rows, runtimes, "s")
    assert table[0][:5] == ["v8", "loads", "110.0", "throttle-after: 114.0", "+4.0 (+4.0 to +4.0)"]
    assert table[1][1] == "not in this Envoy" and "compiled without support" in table[1][5]


def test_handoff_and_smoothness_tables():
    ho = [{"build": "after", "placement": "cross", "service_ms": 20.5, "envoy_upstream_ms": 20.7,
           "ideal_qps": 195.1, "achieved_qps": 190.0 + i, "achieved_pct": 97.0 + i, "cross_pct": 100.0,
           "cross_gap_p50_ms": 0.4 + i, "cross_gap_p99_ms": 1.0, "same_gap_p50_ms": None, "same_gap_p99_ms": None,
           "errors": 0} for i in range(3)]
    _, t = cpu_report.handoff_table(ho)
    assert t[0][6] == "**98.0%** (97.0–99.0)" and t[0][7] == "100%" and t[0][-1] == "3"
    assert t[0][8] == "1.40 / 1.00" and t[0][9] == "-"
    sm = [{"variant": v, "upstream_qps": 500.0, "sd_qps": sd, "min_window_qps": 480.0, "max_window_qps": 520.0,
           "windows": 199, "off_10pct": k, "sd_1s_qps": 1.5} for k, (v, sd) in enumerate((("pace-after", 8.0), ("nginx-limit_req", 7.5),
                                                                       ("pace-after", 9.0)))]
    _, t = cpu_report.smooth_table(sm)
    assert [r[0] for r in t] == ["pace-after", "nginx-limit_req"]
    assert t[0][2] == "**8.50**" and t[0][3] == "8.00, 9.00" and t[0][6] == "0, 2" and t[1][6] == "1"
    assert t[0][7] == "1.50, 1.50" and t[1][8] == "199"


def test_summary_has_every_section_and_names_left_out_listeners_and_failures():
    p = parse_profile("p", {**GOOD, "handoff": {"builds": ["after"]}, "smoothness": {"builds": ["after"]},
                            "cpu": {"listeners": [{"name": "plain"}, {"name": "noop-wamr", "wasm": "noop",
                                                                       "runtime": "wamr"}],
                                    "shapes": [{"name": "s", "connections": 2, "requests": 10, "qps": 2000}]}})
    result = {"cpu": [_row(1, "s", "plain", "plain", 100.0)], "left_out": ["noop-wamr"],
              "runtimes": {"wamr": {"loads": False, "log": "compiled without support"}},
              "handoff": [{"build": "after", "placement": "same", "service_ms": 20.5, "envoy_upstream_ms": 20.7,
                           "ideal_qps": 195.1, "achieved_qps": 190.0, "achieved_pct": 97.4, "cross_pct": 0.0,
                           "gap_p50_ms": 0.4, "gap_p99_ms": 1.0, "errors": 0}],
              "smoothness": [{"variant": "pace-after", "upstream_qps": 500.0, "sd_qps": 8.0, "min_window_qps": 480.0,
                              "max_window_qps": 520.0, "windows": 199}],
              "idle_start": {"us_per_s": 900.0}, "idle_end": {"us_per_s": 1100.0},
              "failures": [{"round": 1, "listener": "x", "error": "boom", "trace": "long"}]}
    info = {"run_id": "r", "uptime_start": "load average: 1.00", "uptime_end": "load average: 1.50",
            "builds": {"after": {"path": "a.wasm", "bytes": 1, "sha256": "ab" * 32, "ref": None}}}
    md = cpu_report.markdown(result, info, p)
    for heading in ("## Envoy CPU µs per request", "### s:", "### Wasm runtimes", "## Concurrency hand-off",
                    "## Pacing smoothness", "## Failures"):
        assert heading in md
    assert "load average: 1.00" in md and "load average: 1.50" in md
    assert "Left out (runtime not in this Envoy): noop-wamr." in md
    assert "boom" in md and "long" not in md
    assert "0.55 µs per request" in md  # 1100 µs/s idle at 2,000 req/s


def test_builds_are_compared_round_by_round():
    """A drift that hits both builds alike cancels in the per-round difference,
    not in the difference of the medians."""
    rows = []
    for r, drift in enumerate((0.0, 40.0, -30.0, 80.0, 10.0)):
        rows += [_row(r, "s", "throttle-before", "throttle", 120 + drift),
                 _row(r, "s", "throttle-after", "throttle", 115 + drift + (3 if r == 4 else 0))]
    _, t = cpu_report.builds_table(rows, ["s"])
    assert t == [["s", "v8", "throttle-after − throttle-before", "**-5.0**", "-5.0 to -2.0", "5 of 5"]]
    d = cpu_report.paired(rows, "throttle-after", "throttle-before")
    assert d is not None and (d.median, d.n) == (-5.0, 5)
    assert cpu_report.paired(rows, "throttle-after", "nothing") is None
