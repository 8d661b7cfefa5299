"""The pure parts of the instruction-count benchmark (perf/icount/): reading callgrind's
dumps and the ELF, the time correction, the profile checks, the per-variant Envoy
config and the report's tables. Fast: no process is started."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import yaml

from harness.configs import hcm
from harness.engine import CLUSTER_NAME
from perf.icount import callgrind, config, report, run
from perf.icount.fit import FitError, fit, rel_range_pct

# -- callgrind dumps ---------------------------------------------------------------------

TC = (0x628A380, 0x62EA8E5)
LAYOUT = callgrind.Layout(tcmalloc=(TC,))
ENVOY = "/venv/site-packages/envoy/_bin/envoy"

DUMP = f"""\
# callgrind format
version: 1
creator: callgrind-3.19.0
cmd:  {ENVOY} -c envoy.yaml
part: 1

desc: I1 cache:
desc: Timerange: Basic block 0 - 801285523
desc: Trigger: Client Request: dump phase1

positions: line
events: Ir
summary: 10000

ob=(1) {ENVOY}
fl=(1) ???
fn=(1) 0x0000000002fad8c0
0 3000
cob=(2) ???
cfn=(2) 0x000000000628a400
calls=4 0
0 800
ob=(2)
fn=(3) 0x00007f0000001000
0 500
cob=(1)
cfn=(1)
calls=3 0
0 12000
cob=(1)
cfn=(4) 0x0000000003c8aff0
calls=11 0
0 671
fn=(2)
0 400
ob=(3) /usr/lib/x86_64-linux-gnu/libc.so.6
fn=(5) memcpy
0 200
cob=(2)
cfn=(3)
calls=2 0
0 900
ob=(1)
fn=(6) 0x0000000001000000
0 4000
totals: 8100
"""


def test_a_dump_splits_by_part_and_counts_calls_out_of_the_jit_code():
    d = callgrind.parse(DUMP.splitlines(), LAYOUT)
    assert (d.summary, d.totals) == (10000, 8100)
    assert d.trigger == "Client Request: dump phase1"
    assert d.self_ir == {"envoy": 7000, "tcmalloc": 400, "libc": 200, "jit": 500, "other": 0}
    # JIT -> Envoy: the host-call entry (3 calls, 12,000 Ir) and a helper (11, 671 Ir).
    assert d.out_of_jit[("envoy", "0x0000000002fad8c0")] == callgrind.Calls(3, 12000)
    assert d.out_of_jit[("envoy", "0x0000000003c8aff0")] == callgrind.Calls(11, 671)
    assert d.calls_out == callgrind.Calls(14, 12671)
    # Envoy -> tcmalloc is no call into the JIT code; libc -> JIT is.
    assert d.into_jit == callgrind.Calls(2, 900)
    f = run.dump_figures(d)
    assert (f["host_calls"], f["host_calls_ir"], f["helper_calls"]) == (3, 12000, 11)


def test_a_dump_without_a_summary_or_with_an_unknown_name_is_refused():
    with pytest.raises(callgrind.FormatError, match="no summary"):
        callgrind.parse(["events: Ir", "fn=(1) x", "0 1"], LAYOUT)
    with pytest.raises(callgrind.FormatError, match=r"\(7\) used before"):
        callgrind.parse(["summary: 1", "fn=(7)"], LAYOUT)


def test_parts_by_object_and_address():
    assert LAYOUT.part("???", "0x000000000628a380") == "tcmalloc"
    assert LAYOUT.part("???", "0x00000000062ea8e5") == "jit"  # the end is outside
    assert LAYOUT.part("???", "0x0000000003000000") == "jit"
    assert LAYOUT.part(ENVOY, "0x0000000003000000") == "envoy"
    assert LAYOUT.part("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "_dl_start") == "libc"
    assert LAYOUT.part("/usr/libexec/valgrind/vgpreload_core-amd64-linux.so", "x") == "other"


def elf(sections: list[tuple[str, int, bytes]]) -> bytes:
    """A minimal 64-bit little-endian ELF: a null section, `sections` (name, vaddr, data)
    and the section-name table."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n, _, _ in sections) + b".shstrtab\0"
    body = b"".join(d for _, _, d in sections)
    data_off = 64
    strtab_off = data_off + len(body)
    shoff = strtab_off + len(names)
    headers = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    name_at, off = 1, data_off
    for n, vaddr, d in sections:
        headers.append(struct.pack("<IIQQQQIIQQ", name_at, 1, 0, vaddr, off, len(d), 0, 0, 1, 0))
        name_at += len(n) + 1
        off += len(d)
    headers.append(struct.pack("<IIQQQQIIQQ", name_at, 3, 0, 0, strtab_off, len(names), 0, 0, 1, 0))
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    head = ident + struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64, len(headers),
                               len(headers) - 1)
    return head + body + names + b"".join(headers)


def test_the_tcmalloc_sections_and_the_build_id_come_from_the_elf(tmp_path: Path):
    note = struct.pack("<III", 4, 4, 3) + b"GNU\0" + bytes.fromhex("9e558093")
    path = tmp_path / "envoy"
    path.write_bytes(elf([(".text", 0x1000, b"\x90" * 16), ("google_malloc", 0x6182380, b"\0" * 32),
                          ("malloc_hook", 0x61823A0, b"\0" * 8), (".note.gnu.build-id", 0x400, note)]))
    assert [s[0] for s in callgrind.elf_sections(path.read_bytes())][1:] == [
        ".text", "google_malloc", "malloc_hook", ".note.gnu.build-id", ".shstrtab"]
    lay = callgrind.layout_of(path, 0x108000)
    assert lay.tcmalloc == ((0x628A380, 0x628A3A0), (0x628A3A0, 0x628A3A8))
    assert callgrind.build_id(path) == "9e558093"
    with pytest.raises(callgrind.FormatError, match="not a 64-bit"):
        list(callgrind.elf_sections(b"#!/bin/sh\n"))


def test_the_load_base_is_the_first_mapping_of_the_binary():
    maps = (f"00108000-02185000 r--p 00000000 fe:00 6038325  {ENVOY}\n"
            f"02186000-062ec000 r-xp 0207d000 fe:00 6038325  {ENVOY}\n"
            "07143000-07144000 r--p 00000000 fe:00 325835  /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2\n")
    assert callgrind.load_base(maps, Path(ENVOY)) == 0x108000
    with pytest.raises(callgrind.FormatError, match="not mapped"):
        callgrind.load_base(maps, Path("/other/envoy"))


# -- the time correction -------------------------------------------------------------------

def test_the_fit_recovers_work_per_request_and_per_second():
    n = [2000, 2000, 2000, 200, 200]
    t = [7.1, 6.4, 9.0, 10.2, 10.1]
    f = fit(n, t, [178_000 * a + 210_000 * b for a, b in zip(n, t, strict=True)])
    assert f.per_request == pytest.approx(178_000)
    assert f.per_second == pytest.approx(210_000)
    assert f.rms_pct == pytest.approx(0, abs=1e-6)
    noisy = fit(n, t, [178_000 * a + 210_000 * b + (5000 if i % 2 else -5000) for i, (a, b) in enumerate(zip(n, t, strict=True))])
    assert 0 < noisy.rms_pct < 0.1


def test_the_fit_refuses_what_cannot_separate_requests_from_seconds():
    with pytest.raises(FitError, match="alike"):
        fit([100, 200], [1.0, 2.0], [5.0, 10.0])
    with pytest.raises(FitError, match="at least 2"):
        fit([100], [1.0], [5.0])


def test_the_spread_is_the_range_over_the_median():
    assert rel_range_pct([100, 101, 99]) == pytest.approx(2.0)
    assert rel_range_pct([-10, -12]) == pytest.approx(2 / 11 * 100)


# -- the profile and the configs -----------------------------------------------------------

def profile(**over: object) -> dict:
    d: dict[str, object] = {"builds": {"after": {"path": "x.wasm"}},
         "phases": [{"requests": 100}, {"requests": 10, "qps": 10}],
         "variants": [{"name": "plain"}, {"name": "noop", "wasm": "noop"},
                      {"name": "t", "wasm": "after", "rule": "unkeyed"}]}
    d.update(over)
    return d


def test_the_shipped_profiles_parse():
    shipped = yaml.safe_load(config.SPEC.read_text())
    for name in shipped:
        p = config.load_profile(name)
        assert p.variants and p.phases
    full = config.load_profile("full")
    assert {v.rule for v in full.variants} == {None, *config.RULE_KINDS}
    assert {v.kind for v in full.variants} == {"plain", "noop", "throttle", "local_ratelimit"}


@pytest.mark.parametrize(("over", "msg"), [
    ({"variants": [{"name": "t", "wasm": "before", "rule": "unkeyed"}]}, r"variants\[0\]\.wasm: expected noop or a build"),
    ({"variants": [{"name": "t", "wasm": "after"}]}, r"variants\[0\]\.rule: a throttle build needs a rule"),
    ({"variants": [{"name": "t", "wasm": "noop", "rule": "keyed"}]}, r"variants\[0\]\.rule: only with a throttle build"),
    ({"variants": [{"name": "t", "rule": "keyed"}]}, r"variants\[0\]\.rule: only with a throttle build"),
    ({"variants": [{"name": "t", "wasm": "noop", "local_ratelimit": True}]}, "one filter per variant"),
    ({"variants": [{"name": "a"}, {"name": "a"}]}, r"listed more than once: \['a'\]"),
    ({"variants": [{"name": "t", "wasm": "after", "rule": "fancy"}]}, r"variants\[0\]\.rule: 'fancy' is not one of"),
    ({"phases": [{"requests": 100}, {"requests": 100}]}, "at least one paced phase"),
    ({"phases": [{"requests": 100, "qps": 1}, {"requests": 10000, "qps": 1}]}, "at least one paced phase"),
    ({"phases": [{"requests": 100}, {"requests": 100000, "qps": 10}]}, r"phases\[1\]: .* more than 10 minutes"),
    ({"jobs": 9}, "jobs: 9 is greater than the maximum of 4"),
])
def test_a_bad_profile_names_the_field(over, msg):
    with pytest.raises(config.SpecError, match=msg):
        config.parse_profile("p", profile(**over))


def test_only_keeps_the_named_variants_and_their_builds():
    p = config.parse_profile("p", profile(builds={"after": {"path": "x.wasm"}, "before": {"ref": "main"}}))
    config.select(p, ["plain", "t"])
    assert [v.name for v in p.variants] == ["plain", "t"]
    assert list(p.builds) == ["after"]
    with pytest.raises(config.SpecError, match=r"--only: no variants \['zz'\]"):
        config.select(p, ["zz"])


def plugin_of(cfg: dict, name: str) -> dict:
    hf = next(f for f in hcm(cfg)["http_filters"] if f["name"] == f"throttle-{name}")
    return json.loads(hf["typed_config"]["config"]["configuration"]["value"])


def test_each_rule_kind_has_its_own_plugin_configuration():
    cfgs = {k: config.envoy_config(config.Variant(f"r-{k}", "after", k), wasm=Path("/x.wasm"), port=1,
                                   admin_port=2, upstream_port=3, engine_port=4) for k in config.RULE_KINDS}
    rules = {k: plugin_of(c, f"r-{k}")["rules"][0] for k, c in cfgs.items()}
    assert all(r["rate"] == "1000000/s" for r in rules.values())
    assert rules["unkeyed"]["match"] == {"path_prefix": "/"} and "key" not in rules["unkeyed"]
    assert rules["keyed"]["key"] == {"header": config.KEY_HEADER}
    assert any(h.startswith(config.KEY_HEADER + ":") for h in config.REQUEST_HEADERS)
    # The path rule matches every request, but only by reading its path.
    prefix = rules["path"]["match"]["path_prefix"]
    assert prefix != "/" and config.REQUEST_PATH.startswith(prefix)
    assert rules["cluster"]["scope"] == "cluster"
    assert plugin_of(cfgs["cluster"], "r-cluster")["engine"]["cluster"] == CLUSTER_NAME
    clusters = {c["name"] for c in cfgs["cluster"]["static_resources"]["clusters"]}
    assert clusters == {"nginx", CLUSTER_NAME}
    assert {c["name"] for c in cfgs["unkeyed"]["static_resources"]["clusters"]} == {"nginx"}


def test_plain_noop_and_native_configs():
    plain = config.envoy_config(config.Variant("plain"), wasm=None, port=1, admin_port=2, upstream_port=3)
    assert [f["name"] for f in hcm(plain)["http_filters"]] == ["envoy.filters.http.router"]
    lrl = config.envoy_config(config.Variant("lrl", local_ratelimit=True), wasm=None, port=1, admin_port=2,
                              upstream_port=3)
    assert next(f["name"] for f in hcm(lrl)["http_filters"]) == "envoy.filters.http.local_ratelimit"
    with pytest.raises(config.SpecError, match=r"a \.wasm exactly when"):
        config.envoy_config(config.Variant("noop", "noop"), wasm=None, port=1, admin_port=2, upstream_port=3)
    with pytest.raises(config.SpecError, match="needs the engine"):
        config.envoy_config(config.Variant("c", "after", "cluster"), wasm=Path("/x.wasm"), port=1, admin_port=2,
                            upstream_port=3)


def test_the_fast_path_check_names_what_was_not():
    v = config.Variant("c", "after", "cluster")
    before = {"requests": 100, "admitted": 100, "slots_taken": 100, "fallback_ms": 0}
    good = {"requests": 400, "admitted": 400, "slots_taken": 400, "fallback_ms": 0}
    assert run.check_fast_path(v, before, good, 300).startswith("fast path")
    waited = dict(good, admitted=390, queued=10, released=10)
    with pytest.raises(RuntimeError, match=r"admitted 290 \(expected 300\), queued 10 \(expected 0\)"):
        run.check_fast_path(v, before, waited, 300)
    with pytest.raises(RuntimeError, match=r"fallback_ms 7 \(expected 0\)"):
        run.check_fast_path(v, before, dict(good, fallback_ms=7), 300)


# -- the report --------------------------------------------------------------------------------

def row(variant: str, kind: str, rnd: int, c: float, build: str = "", rule: str = "", **kw: float) -> dict:
    r = {"variant": variant, "kind": kind, "build": build, "rule": rule, "round": rnd, "c": c, "r": 1e5,
         "raw_per_req": c + 300, "host_calls_c": 0.0, "host_calls_ir_c": 0.0, "jit_c": 0.0, "tcmalloc_c": 0.0}
    r.update(kw)
    return r


ORDER = ["plain", "noop", "unkeyed-before", "unkeyed-after", "keyed-after", "local-ratelimit"]


def rows() -> list[dict]:
    out = []
    for rnd, d in ((1, 0), (2, 30), (3, -30)):
        out += [row("plain", "plain", rnd, 147_000 + d), row("noop", "noop", rnd, 162_000 + d),
                row("unkeyed-before", "throttle", rnd, 178_000 + d, "before", "unkeyed", host_calls_c=3.1),
                row("unkeyed-after", "throttle", rnd, 165_000 + 2 * d, "after", "unkeyed", host_calls_c=1.1),
                row("keyed-after", "throttle", rnd, 166_000 + d, "after", "keyed", host_calls_c=2.1),
                row("local-ratelimit", "local_ratelimit", rnd, 150_600 + d)]
    return out


def test_the_differences_worth_reading():
    assert [label for label, _, _ in report.pairs(rows(), ORDER)] == [
        "noop − plain", "local-ratelimit − plain", "unkeyed-before − noop", "unkeyed-after − noop",
        "keyed-after − noop", "keyed-after − unkeyed-after", "unkeyed-after − unkeyed-before"]


def test_differences_are_taken_per_round():
    assert report.paired(rows(), "unkeyed-after", "noop", "c") == [3000, 3030, 2970]
    _, body = report.diff_table(rows(), ORDER)
    by = {r[0]: r for r in body}
    assert by["unkeyed-after − noop"][1] == "**+3,000**"
    assert by["unkeyed-after − noop"][2] == "+2,970 to +3,030"
    assert by["unkeyed-after − unkeyed-before"][4] == "-2.00"


def test_the_variant_table_and_the_markdown():
    _, body = report.variant_table(rows(), ORDER)
    assert [r[0] for r in body] == ORDER
    assert body[0][1] == "**147,000**" and body[0][2] == "0.04%"
    info = {"set": "icount:quick", "run_id": "x", "phases": [{"requests": 100, "qps": 0}, {"requests": 10, "qps": 2}],
            "builds": {"after": {"path": "a.wasm", "bytes": 1, "sha256": "ab" * 32, "ref": None}}}
    callees = [{"variant": "unkeyed-after", "round": 1, "callee_part": "envoy", "callee": "0x2fad8c0",
                "calls_per_req": 1.1, "ir_per_call": 4500.0},
               {"variant": "unkeyed-after", "round": 1, "callee_part": "envoy", "callee": "0x3c8aff0",
                "calls_per_req": 11.0, "ir_per_call": 61.0}]
    md = report.markdown(rows(), callees, info, ORDER, [{"variant": "keyed-after", "round": 4, "error": "boom"}])
    assert "100 as fast as possible, 10 at 2/s" in md
    lines = [[c.strip() for c in ln.strip("|").split("|")] for ln in md.splitlines() if "0x" in ln]
    assert ["unkeyed-after", "envoy 0x2fad8c0", "1.10", "4,500", "host call"] in lines
    assert ["unkeyed-after", "envoy 0x3c8aff0", "11.00", "61", "V8 helper"] in lines
    assert "- keyed-after 4: boom" in md
