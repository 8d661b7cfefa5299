"""Every example configuration in the repository is parsed by the filter's own
parser (`throttle-config check`, the same code as the filter's on_configure):
throttle `configuration` values in Envoy YAML (static configs and EnvoyFilter
patches), Istio WasmPlugin `pluginConfig`, and JSON blocks in Markdown."""

import json
import re
import subprocess

import pytest
import yaml

from tests.support.repo import ROOT, files


def repo_files(*suffixes):
    # `broken/`: the k8s checks' deliberately invalid fixtures
    return files(*suffixes, skip=("broken",))


def plugin_configs_in(node, found):
    """Throttle plugin configs anywhere in a parsed YAML document."""
    if isinstance(node, dict):
        pc = node.get("pluginConfig")
        if isinstance(pc, dict) and "rules" in pc:
            found.append(json.dumps(pc))
        cfg = node.get("configuration")
        if isinstance(cfg, dict) and isinstance(cfg.get("value"), str) and '"rules"' in cfg["value"]:
            found.append(cfg["value"])
        for v in node.values():
            plugin_configs_in(v, found)
    elif isinstance(node, list):
        for v in node:
            plugin_configs_in(v, found)


def examples():
    out = []
    for path in repo_files(".yaml", ".yml"):
        try:
            docs = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError:
            continue
        found: list[str] = []
        for d in docs:
            plugin_configs_in(d, found)
        out += [(f"{path.relative_to(ROOT)}#{i}", c) for i, c in enumerate(found)]
    for path in repo_files(".md"):
        for i, block in enumerate(re.findall(r"```json\n(.*?)```", path.read_text(), re.S)):
            if block.lstrip().startswith('{"rules"'):
                out.append((f"{path.relative_to(ROOT)}#json{i}", block))
            elif block.lstrip().startswith('{"name"'):  # one rule
                out.append((f"{path.relative_to(ROOT)}#json{i}", '{"rules": [' + block + "]}"))
    return out


EXAMPLES = examples()


@pytest.fixture(scope="session")
def checker():
    subprocess.run(["cargo", "build", "-q", "-p", "throttle-core", "--bin", "throttle-config"], cwd=ROOT, check=True)
    return ROOT / "target" / "debug" / "throttle-config"


def test_the_examples_are_found():
    names = [n for n, _ in EXAMPLES]
    assert any(n.startswith("envoy/demo.yaml") for n in names), names
    assert any(n.startswith("filters/throttle/README.md") for n in names), names
    assert any(n.startswith("README.md") or n.startswith("filters/") for n in names)


@pytest.mark.parametrize("name,config", EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_example_config_is_valid(name, config, checker):
    r = subprocess.run([str(checker), "check"], input=config, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"{name}:\n{r.stdout}{r.stderr}"
    assert r.stdout.startswith("ok: ")


def test_the_checker_refuses_a_bad_config(checker):
    r = subprocess.run([str(checker), "check"], input='{"rules": [{"name": "x", "rate": "fast"}]}',
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert r.stdout.strip() == 'rules[0].rate: expected "<n>/s", "<n>/m", "<n>/h" or a number per second, got "fast"'

