"""k8s/engine (envoyproxy/ratelimit + Redis for cluster scope) agrees with what the tests run.

Pure (no tier marker: `make check` runs it): the files only, no tool. The rendered
manifests go through kustomize, kubeconform and istioctl in test_k8s_manifests.py, and
test_k8s_cluster_scope.py checks the rendered ConfigMap and the clusters Istio builds.
- the service's configuration is engine/config/throttle.yaml, byte for byte (kustomize
  cannot read a file outside k8s/engine, so the directory holds a copy);
- the service's environment is the one harness/engine.py runs it with, on every setting
  the design relies on (engine/README.md);
- the image is the commit tools/setup-engine.sh installs, and its digest comes from
  k8s/engine/image.env only, set by tools/engine_image.py, which refuses placeholders.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from harness import tools
from harness.engine import CONFIG_FILE, RateLimitService
from tests.support.repo import files as repo_files
from tools import engine_image

ROOT = Path(__file__).resolve().parent.parent.parent
ENGINE = ROOT / "k8s" / "engine"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def deployment(name: str) -> dict:
    (d,) = [d for f in ENGINE.glob("*.yaml") for d in docs(f) if d.get("kind") == "Deployment"
            and d["metadata"]["name"] == name]
    return d


def container(name: str) -> dict:
    (c,) = deployment(name)["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


def kustomization() -> dict:
    k: dict = yaml.safe_load((ENGINE / "kustomization.yaml").read_text())
    return k


def test_the_configmap_is_made_from_the_engine_configuration():
    (gen,) = [g for g in kustomization()["configMapGenerator"] if g["name"] == "ratelimit-config"]
    (entry,) = gen["files"]
    key, _, source = entry.partition("=")
    assert key == CONFIG_FILE.name, "the service must find the file under the name the harness gives it"
    copy = ENGINE / source
    assert copy.read_bytes() == CONFIG_FILE.read_bytes(), \
        f"{copy.relative_to(ROOT)} differs from {CONFIG_FILE.relative_to(ROOT)}: " \
        f"cp {CONFIG_FILE.relative_to(ROOT)} {copy.relative_to(ROOT)}"


def test_the_service_runs_with_the_harness_environment(tmp_path):
    """Every setting of harness/engine.py's RateLimitService that is about behaviour (not
    addresses, ports or paths of the loopback run) has the same value in the Deployment."""
    harness = RateLimitService(redis_port=6379, workdir=tmp_path).env()
    local_only = {"PATH", "HOME", "TMPDIR", "LANG", "HOST", "PORT", "GRPC_HOST", "GRPC_PORT", "DEBUG_HOST",
                  "DEBUG_PORT", "RUNTIME_ROOT", "REDIS_URL", "LOG_LEVEL", "LOG_FORMAT"}
    k8s = env_of(container("ratelimit"))
    for key, value in harness.items():
        if key not in local_only:
            assert k8s.get(key) == value, f"ratelimit Deployment: {key}={k8s.get(key)!r}, harness runs {value!r}"
    # The local cache must stay off (engine/README.md fact 10): unset or 0.
    assert k8s.get("LOCAL_CACHE_SIZE_IN_BYTES", "0") == "0"
    for key in ("SHADOW_MODE", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "REDIS_PERSECOND", "CACHE_KEY_PREFIX"):
        assert key not in k8s, f"{key}: engine/README.md relies on its default"
    # Redis: the Service of redis.yaml, in the engine's namespace.
    (redis_svc,) = [d for d in docs(ENGINE / "redis.yaml") if d["kind"] == "Service"]
    ns = kustomization()["namespace"]
    assert k8s["REDIS_URL"] == f"{redis_svc['metadata']['name']}.{ns}.svc.cluster.local:{redis_svc['spec']['ports'][0]['port']}"


def test_the_configuration_is_mounted_where_the_service_reads_it():
    c = container("ratelimit")
    env = env_of(c)
    (mount,) = c["volumeMounts"]
    assert mount["mountPath"] == f"{env['RUNTIME_ROOT']}/{env['RUNTIME_SUBDIRECTORY']}/config"
    (vol,) = deployment("ratelimit")["spec"]["template"]["spec"]["volumes"]
    assert vol["name"] == mount["name"] and vol["configMap"]["name"] == "ratelimit-config"
    # A ConfigMap volume holds ..data links: the service must skip dot files and watch in place.
    assert (env["RUNTIME_IGNOREDOTFILES"], env["RUNTIME_WATCH_ROOT"]) == ("true", "false")


def test_the_service_port_is_http_for_istio():
    """Istio decides a port's protocol by its name (or appProtocol): `http-` makes the sidecar's and
    waypoint's cluster for it HTTP/1.1, which the service's /json listener speaks (no h2c)."""
    (svc,) = [d for d in docs(ENGINE / "ratelimit.yaml") if d["kind"] == "Service"]
    (port,) = svc["spec"]["ports"]
    assert port["port"] == 8080 and re.fullmatch(r"http(-.*)?", port["name"]), port
    assert "appProtocol" not in port


def test_redis_is_never_two():
    """Two Redis behind the Service (a rolling update) would split the counters."""
    d = deployment("redis")
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"]["type"] == "Recreate"
    args = container("redis")["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction", "evicting a counter grants its slots again"


def test_the_image_is_the_commit_the_tests_run():
    commit = tools.version("ratelimit").rsplit("-", 1)[1]  # the pseudo-version's commit (12 hex digits)
    repo, _, tag = engine_image.image_tag().rpartition(":")
    assert repo == "docker.io/envoyproxy/ratelimit"
    # Upstream tags every main commit with its first 8 hex digits.
    assert tag == commit[:8], f"image tag {tag}, tests run {commit}"


def test_the_shipped_image_env_has_no_digest():
    assert engine_image.read_digest() is None, "k8s/engine/image.env must ship without ratelimit_digest="


@pytest.mark.parametrize("digest", [
    "sha256:" + "0" * 64, "sha256:" + "a" * 64,      # placeholders
    "sha256:<digest>", "<digest>", "",                 # the docs' placeholder, nothing
    "sha256:" + "A" * 63 + "b",                       # upper case
    "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",  # no algorithm
])
def test_set_digest_refuses_placeholders_and_malformed_digests(digest, tmp_path):
    env = tmp_path / "image.env"
    env.write_text(engine_image.IMAGE_ENV.read_text())
    with pytest.raises(ValueError, match=r"^ratelimit_digest: "):
        engine_image.set_digest(digest, env=env)
    assert env.read_text() == engine_image.IMAGE_ENV.read_text()


def test_set_digest_writes_the_one_place(tmp_path):
    env = tmp_path / "image.env"
    env.write_text(engine_image.IMAGE_ENV.read_text())
    first, second = ("sha256:" + h * 32 for h in ("1a", "2b"))
    engine_image.set_digest(first, env=env)
    engine_image.set_digest(second, env=env)
    assert engine_image.read_digest(env) == second
    assert env.read_text().count("ratelimit_digest=") == 1


def test_every_digest_example_in_the_docs_is_refused():
    examples = [(md.relative_to(ROOT), m.group(1).strip("`"))
                for md in repo_files(".md") for m in re.finditer(r"set-digest (\S+)", md.read_text())]
    examples += [(engine_image.IMAGE_ENV.relative_to(ROOT), m.group(1).strip("`"))
                 for m in re.finditer(r"set-digest (\S+)", engine_image.IMAGE_ENV.read_text())]
    assert examples, "no set-digest example in the docs"
    for where, digest in examples:
        with pytest.raises(ValueError):
            engine_image.check_digest(digest)
            raise AssertionError(f"{where}: example {digest!r} is accepted as a real digest")


def test_only_image_env_pins_the_engine():
    for f in sorted(ENGINE.glob("*.yaml")):
        images = re.findall(r"^\s*(?:- )?image: (\S+)", f.read_text(), re.M)
        assert not [i for i in images if "@" in i], f"{f.relative_to(ROOT)} pins an image: the digest belongs in image.env"
    assert engine_image.image_tag()
