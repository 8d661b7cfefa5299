"""The test vocabulary is written once and used the same way everywhere: the markers of
pyproject.toml, the tiers the conftest guard knows, the `PURE` expression of the Makefile
(what `make check` runs), and the marker expressions of the make targets. And each tool is
installed in one place (tools/tools.tsv, tools/install.sh) and found only where it put it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from harness import tools
from tests.support.tiers import TIERS

ROOT = Path(__file__).resolve().parent.parent.parent


def declared_markers() -> set[str]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {m.split(":")[0] for m in cfg["tool"]["pytest"]["ini_options"]["markers"]}


def makefiles() -> str:
    return "\n".join(p.read_text() for p in [ROOT / "Makefile", *sorted((ROOT / "mk").glob("*.mk"))])


def test_the_guard_knows_every_tier_marker():
    assert set(TIERS) | {"slow"} == declared_markers()


def test_pure_excludes_exactly_the_tiers():
    (pure,) = re.findall(r"^PURE := (.+)$", makefiles(), re.M)
    assert set(re.findall(r"[a-z][a-z0-9]*", pure)) - {"not", "or", "and"} == set(TIERS), pure


def test_make_targets_select_by_declared_markers_only():
    exprs = re.findall(r"\$\(PYTEST\)[^\n]*?-m (\"[^\"]+\"|\S+)", makefiles())
    assert len(exprs) >= 6, exprs
    for e in exprs:
        words = set(re.findall(r"[a-z][a-z0-9]*", e)) - {"not", "or", "and"}
        assert words <= declared_markers(), e
    # and never by path or environment, the ways the tests used to be chosen
    assert not re.search(r"pytest[^\n]*\btests/(k8s|reliability|meshlab)\b|K8S_CHECK|THROTTLE_RELIABILITY", makefiles())


# ---------------------------------------------------------------- the tools (tools/tools.tsv)

def tool_rows() -> dict[str, list[str]]:
    return tools.rows()


def scripts() -> dict[Path, str]:
    """Every shell script and make file of the repository but the one installer."""
    found = [*ROOT.glob("tools/*.sh"), *ROOT.glob("perf/*/*.sh"), *ROOT.glob("bazel/*.sh"),
             ROOT / "Makefile", *ROOT.glob("mk/*.mk"), ROOT / ".ci" / "run"]
    return {p: p.read_text() for p in found if p.name != "install.sh"}


def test_each_tool_is_installed_in_one_place():
    """Only tools/install.sh installs a row of the table: no other script names its module or
    runs apt for its package."""
    for name, (how, source, _version, _bins, _service) in tool_rows().items():
        for path, text in scripts().items():
            if how == "go":
                assert f"{source.rsplit('/v', 1)[0]}@" not in text, f"{path}: installs {name}; use tools/install.sh"
            else:
                for pkg in source.split(","):
                    installs = re.findall(r"apt-get[^\n]*install[^\n]*|missing\+=\([^)]*\)", text)
                    assert not any(re.search(rf"(?<![\w-]){re.escape(pkg)}(?![\w-])", line) for line in installs), \
                        f"{path}: installs {pkg} ({name}); use tools/install.sh {name}"


def test_every_tool_target_names_a_row():
    used = set(re.findall(r"\btool-([a-z][a-z0-9-]*)", makefiles()))
    assert used and used <= set(tool_rows()), used - set(tool_rows())
    installed = set()
    for text in scripts().values():
        for line in re.findall(r"^\s*(?:if !\s*)?bash tools/install\.sh ([a-z0-9 -]+)$", text, re.M):
            installed |= set(line.split())
    assert installed <= set(tool_rows()), installed - set(tool_rows())


def test_the_harness_finds_a_tool_only_through_the_table():
    """No lookup of a row's binary in ~/go/bin, GOPATH or PATH: each would find what a warm
    machine happens to have."""
    binaries = {b.split("=")[-1] for row in tool_rows().values() for b in row[3].split(",")}
    for p in [*ROOT.glob("harness/*.py"), *ROOT.glob("perf/**/*.py"), *ROOT.glob("tests/**/*.py"),
              *ROOT.glob("tools/*.py")]:
        if p.resolve() == Path(__file__).resolve():
            continue
        code = "\n".join(line for line in p.read_text().splitlines() if not line.lstrip().startswith("#"))
        code = re.sub(r'"""[\s\S]*?"""', "", code)  # docstrings may say where tools are not looked up
        assert "go_bin(" not in code and '"GOPATH"' not in code and "go/bin" not in code, p
        text = code
        for b in re.findall(r"shutil\.which\(\s*\"([^\"]+)\"", text):
            assert b not in binaries, f"{p}: shutil.which({b!r}); use harness.tools.path"


def test_make_test_gives_each_tier_an_empty_tool_directory():
    out = subprocess.run(["make", "-n", "--no-print-directory", "test"], cwd=ROOT, capture_output=True,
                         text=True, check=True, env={**os.environ, "MAKEFLAGS": ""}).stdout
    (tiers,) = re.findall(r"for t in ([a-z0-9 -]+); do", out)
    assert tiers.split()[:2] == ["check", "integration"] and "perf-priority-quick" in tiers.split()
    assert "rm -rf build/tiers/$t" in out and "THROTTLE_TOOLS_BIN=" + str(ROOT) + "/build/tiers/$t/bin" in out


PURE_PROBE = '''
import pytest
from harness import tools

def test_looks_up_vegeta():
    tools.path("vegeta")

@pytest.mark.perf
def test_a_perf_test_may():
    with pytest.raises(FileNotFoundError, match="tool-vegeta"):
        tools.path("vegeta")
'''


def test_a_pure_test_that_looks_up_a_tool_fails_make_check(tmp_path: Path):
    """What `make check` does with a pure test that looks a tool up: it fails, on any machine
    (the tool directory here has Vegeta in it); a tier's test may look it up."""
    probe_dir = ROOT / "build" / f"pure-probe-{os.getpid()}"
    probe_dir.mkdir(parents=True, exist_ok=True)
    (tmp_path / "vegeta").write_text("#!/bin/sh\n")
    try:
        (probe_dir / "test_probe.py").write_text(PURE_PROBE)
        (pure,) = re.findall(r"^PURE := (.+)$", makefiles(), re.M)
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", pure,
                              str(probe_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "THROTTLE_TOOLS_BIN": str(tmp_path)})
        assert run.returncode == 1, run.stdout[-3000:]
        assert "PureTestLookup" in run.stdout and "looked up the tool 'vegeta'" in run.stdout, run.stdout[-3000:]
        assert "1 failed, 1 deselected" in run.stdout, run.stdout[-3000:]
        (tmp_path / "vegeta").unlink()
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "perf",
                              str(probe_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "THROTTLE_TOOLS_BIN": str(tmp_path)})
        assert run.returncode == 0 and "1 passed, 1 deselected" in run.stdout, run.stdout[-3000:]
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
