"""deploy/k8s checked offline: every resource that a kustomization there renders validates, strictly
(unknown fields are errors), against the Kubernetes schemas that the PyPI package kubernetes-validate
carries, for 1.27 (the first with GA gRPC probes) and the newest it knows; KEDA's ScaledObject, a CRD
those schemas do not have, is checked against KEDA's documented fields (its HPA behaviour against the
HPA schema); and the manifests say what the README promises (probes, drain, scaling target).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from tests.docker.conftest import ROOT
from worker.drain import ACK_WAIT_SEC

K8S = ROOT / "deploy" / "k8s"
KUSTOMIZATIONS = ("base", "keda", "hpa", "http-probes", "client-auth", "postgres")
NOT_RESOURCES = {"kustomization.yaml", "prometheus-adapter-values.yaml"}
"""YAML files under deploy/k8s that are not Kubernetes resources."""


# ---- Kubernetes ---------------------------------------------------------------------------------------


def json_patch(doc: dict[str, Any], op: dict[str, Any]) -> None:
    """Apply one RFC 6902 ``add`` or ``replace`` operation (``replace`` needs the path to exist; ``add`` to
    an array's ``-`` appends)."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    assert op["op"] in ("add", "replace"), f"unsupported patch op {op['op']}"
    if isinstance(node, list) and last == "-":  # "-": after the last element of the array
        assert op["op"] == "add", f"{op['path']}: only add appends"
        node.append(copy.deepcopy(op["value"]))
        return
    key: Any = int(last) if isinstance(node, list) else last
    if op["op"] == "replace":
        assert key in node if isinstance(node, dict) else key < len(node), f"no {op['path']} to replace"
    node[key] = copy.deepcopy(op["value"])


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The resources that ``kubectl apply -k DIRECTORY`` sends, rendered for the fields that
    deploy/k8s uses (resources, namespace, labels, images, JSON 6902 patches with a target)."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    known = {"apiVersion", "kind", "namespace", "labels", "resources", "images", "patches"}
    assert set(k) <= known, f"{directory}: kustomization fields this renderer does not know: {set(k) - known}"
    docs: list[dict[str, Any]] = []
    for resource in k["resources"]:
        path = directory / resource
        docs += kustomize(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    for patch in k.get("patches", []):
        target = patch["target"]
        (doc,) = [d for d in docs if (d["kind"], d["metadata"]["name"]) == (target["kind"], target["name"])]
        for op in yaml.safe_load(patch["patch"]):
            json_patch(doc, op)
    for doc in docs:
        if "namespace" in k and doc["kind"] != "Namespace":
            doc["metadata"]["namespace"] = k["namespace"]
        for pairs in k.get("labels", []):
            doc["metadata"].setdefault("labels", {}).update(pairs["pairs"])
        for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            for image in k.get("images", []):
                if container["image"] == image["name"]:
                    container["image"] = f"{image['name']}:{image['newTag']}"
    return docs


def resource(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if (d["kind"], d["metadata"]["name"]) == (kind, name)]
    return doc


def k8s_versions() -> list[str]:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    return ["1.27.0", kubernetes_validate.latest_version()]


@pytest.mark.parametrize("variant", KUSTOMIZATIONS)
def test_kubernetes_manifests_validate_against_the_schemas(variant: str) -> None:
    import kubernetes_validate

    docs = kustomize(K8S / variant)
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: test_scaled_object_has_kedas_documented_shape
        for version in k8s_versions():
            kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked >= 6  # namespace, 2 config maps, PVC, 2 deployments, 2 services (+ HPA)


def test_the_schema_check_catches_broken_manifests() -> None:
    import kubernetes_validate

    worker = resource(kustomize(K8S / "base"), "Deployment", "corral-worker")
    typo = copy.deepcopy(worker)
    typo["spec"]["replica"] = 2
    wrong_type = copy.deepcopy(worker)
    wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45s"
    for broken in (typo, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, "1.27.0", strict=True)


def test_every_manifest_belongs_to_a_kustomization() -> None:
    referenced = set()
    for variant in KUSTOMIZATIONS:
        k = yaml.safe_load((K8S / variant / "kustomization.yaml").read_text())
        referenced |= {(K8S / variant / r).resolve() for r in k["resources"]}
    files = {p.resolve() for p in K8S.rglob("*.yaml") if p.name not in NOT_RESOURCES}
    assert files - referenced == set()


def test_control_plane_probes_use_the_health_service_or_http() -> None:
    container = resource(kustomize(K8S / "base"), "Deployment", "corral-control")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"grpc": 50051, "http": 8080}
    assert container["livenessProbe"]["grpc"] == {"port": 50051, "service": ""}
    assert container["startupProbe"]["grpc"] == {"port": 50051, "service": ""}
    assert container["readinessProbe"]["grpc"] == {"port": 50051, "service": "corral.v1.JobService"}
    assert container["image"] == "corral-control:0.1.0"

    http = resource(kustomize(K8S / "http-probes"), "Deployment", "corral-control")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert http["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert http["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert not any("grpc" in http[p] for p in ("startupProbe", "livenessProbe", "readinessProbe"))


def test_client_auth_mounts_the_token_file_so_that_a_secret_update_reaches_it() -> None:
    pod = resource(kustomize(K8S / "client-auth"), "Deployment", "corral-control")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    path = PurePosixPath(env["CORRAL_AUTH_TOKEN_FILE"]["value"])
    assert "CORRAL_WORKER_TOKEN" in env  # the base's worker token stays: client tokens require one
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "client-tokens"]
    # The Secret's directory, read-only, and no subPath: a subPath mount never sees the Secret change,
    # and the control plane re-reads the file only if the kubelet can swap it.
    assert (mount["mountPath"], mount.get("readOnly"), "subPath" in mount) == (str(path.parent), True, False)
    (volume,) = [v for v in pod["volumes"] if v["name"] == "client-tokens"]
    assert volume["secret"]["secretName"] == "corral-client-tokens" and "items" not in volume["secret"]
    assert path.name == "tokens"  # the Secret's key, which becomes the file's name
    # Readable by the group the pod's files get (fsGroup 10001), not by everyone.
    assert volume["secret"]["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 10001
    # The other containers' mounts are the base's, untouched.
    base = resource(kustomize(K8S / "base"), "Deployment", "corral-control")["spec"]["template"]["spec"]
    assert container["volumeMounts"][:-1] == base["containers"][0]["volumeMounts"]


def test_the_postgres_variant_runs_an_active_control_plane_and_a_standby_without_a_volume() -> None:
    docs = kustomize(K8S / "postgres")
    control = resource(docs, "Deployment", "corral-control")
    pod = control["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # Two replicas, replaced one at a time with a surge: the standby leads while the other restarts
    assert control["spec"]["replicas"] == 2
    assert control["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    # The store is the database named by the Secret, not a ReadWriteOnce volume two pods could not share
    env = {e["name"]: e for e in container["env"]}
    assert env["CORRAL_DB"]["valueFrom"]["secretKeyRef"] == {"name": "corral-postgres", "key": "url"}
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
    assert {m["name"] for m in container["volumeMounts"]} == {v["name"] for v in pod["volumes"]} == {"tmp"}
    # Probes as in the base: the standby is alive and not ready, so clients reach the active one only
    base = resource(kustomize(K8S / "base"), "Deployment", "corral-control")["spec"]["template"]["spec"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe] == base["containers"][0][probe]
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["labelSelector"]["matchLabels"].items() <= control["spec"]["template"]["metadata"]["labels"].items()


def test_workers_reach_a_control_plane_that_is_not_ready_yet() -> None:
    docs = kustomize(K8S / "base")
    config = resource(docs, "ConfigMap", "corral-worker")["data"]
    host, port = config["CORRAL_CONTROL_ADDR"].rsplit(":", 1)
    name, namespace = host.split(".")[:2]
    service = resource(docs, "Service", name)
    assert namespace == service["metadata"]["namespace"] == "corral"
    # readiness needs a connected worker, so the workers' Service must list a pod that is not ready
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert [p["port"] for p in service["spec"]["ports"]] == [int(port)]
    control = resource(docs, "Deployment", "corral-control")
    assert service["spec"]["selector"].items() <= control["spec"]["template"]["metadata"]["labels"].items()
    client_service = resource(docs, "Service", "corral-control")
    assert "publishNotReadyAddresses" not in client_service["spec"]


def test_a_worker_pod_stops_by_draining_within_its_grace_period() -> None:
    docs = kustomize(K8S / "base")
    drain = float(resource(docs, "ConfigMap", "corral-worker")["data"]["CORRAL_DRAIN_TIMEOUT_SEC"])
    pod = resource(docs, "Deployment", "corral-worker")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= drain + ACK_WAIT_SEC + 5
    (container,) = pod["containers"]
    hook = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    assert 'corral drain "$CORRAL_WORKER_ID"' in hook and "kill -TERM 1" in hook
    env = {e["name"]: e.get("valueFrom", e.get("value")) for e in container["env"]}
    assert env["CORRAL_WORKER_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["CORRAL_WORKER_THREADS"]["resourceFieldRef"]["resource"] == "limits.cpu"
    assert env["CORRAL_WORKER_TOKEN"]["secretKeyRef"]["optional"] is True
    assert "livenessProbe" not in container, "a worker must not be killed while its control plane restarts"
    assert container["readinessProbe"]["exec"]["command"] == ["python", "/opt/corral/healthcheck.py", "worker"]


def test_every_container_has_requests_limits_and_runs_as_non_root() -> None:
    for doc in kustomize(K8S / "base"):
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
        for container in pod["containers"]:
            assert set(container["resources"]) == {"requests", "limits"}, doc["metadata"]["name"]
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), doc["metadata"]["name"]
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["readOnlyRootFilesystem"] is True


KEDA_SPEC = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
"""ScaledObject spec fields (keda.sh/v1alpha1, KEDA 2.x documentation)."""
KEDA_PROMETHEUS = {
    "serverAddress",
    "query",
    "threshold",
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "queryParameters",
    "unsafeSsl",
    "timeout",
}
"""Metadata fields of KEDA's prometheus scaler."""


def test_scaled_object_has_kedas_documented_shape() -> None:
    import kubernetes_validate

    docs = kustomize(K8S / "keda")
    scaled = resource(docs, "ScaledObject", "corral-worker")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert set(spec) <= KEDA_SPEC
    assert set(spec["scaleTargetRef"]) <= {"apiVersion", "kind", "name", "envSourceContainerName"}
    target = resource(docs, spec["scaleTargetRef"]["kind"], spec["scaleTargetRef"]["name"])
    assert target["apiVersion"] == spec["scaleTargetRef"]["apiVersion"] == "apps/v1"
    assert target["metadata"]["namespace"] == scaled["metadata"]["namespace"]
    for field in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
        assert isinstance(spec[field], int) and spec[field] >= 0, field
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert set(spec["advanced"]) <= {
        "restoreToOriginalReplicaCount",
        "horizontalPodAutoscalerConfig",
        "scalingModifiers",
    }
    hpa_config = spec["advanced"]["horizontalPodAutoscalerConfig"]
    assert set(hpa_config) <= {"name", "behavior"}
    # the behaviour is an autoscaling/v2 HPA's: validate it inside one
    probe = copy.deepcopy(resource(kustomize(K8S / "hpa"), "HorizontalPodAutoscaler", "corral-worker"))
    probe["spec"]["behavior"] = hpa_config["behavior"]
    kubernetes_validate.validate(probe, "1.27.0", strict=True)

    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    metadata = trigger["metadata"]
    assert set(metadata) <= KEDA_PROMETHEUS and {"serverAddress", "query", "threshold"} <= set(metadata)
    assert all(isinstance(v, str) for v in metadata.values()), "KEDA trigger metadata values are strings"
    assert float(metadata["threshold"]) > 0 and float(metadata["activationThreshold"]) >= 0
    assert re.fullmatch(r"https?://[^/\s]+(:\d+)?/?", metadata["serverAddress"])


def test_hpa_scales_the_workers_on_the_adapters_metric() -> None:
    docs = kustomize(K8S / "hpa")
    hpa = resource(docs, "HorizontalPodAutoscaler", "corral-worker")
    ref = hpa["spec"]["scaleTargetRef"]
    assert resource(docs, ref["kind"], ref["name"])["apiVersion"] == ref["apiVersion"]
    (metric,) = hpa["spec"]["metrics"]
    (rule,) = yaml.safe_load((K8S / "hpa" / "prometheus-adapter-values.yaml").read_text())["rules"]["external"]
    assert metric["type"] == "External" and metric["external"]["metric"]["name"] == rule["name"]["as"]
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
