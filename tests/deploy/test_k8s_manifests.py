"""deploy/k8s: every overlay renders (`kubectl kustomize`), every object is
valid against the Kubernetes schemas (kubernetes-validate, strict: unknown
fields are errors), every pod is hardened, and the NetworkPolicies say what
deploy/README.md says they do. No cluster needed."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = sorted(p.name for p in (ROOT / "deploy" / "k8s" / "overlays").iterdir() if p.is_dir())
K8S_VERSION = "1.30.0"  # the oldest minor the manifests promise to work on
POD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod", "ReplicaSet"}

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


def render(overlay: str) -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(ROOT / "deploy" / "k8s" / "overlays" / overlay)],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "Pod":
        return obj["spec"]
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def by(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def test_both_overlays_exist() -> None:
    assert {"dev", "production"} <= set(OVERLAYS)


def test_every_object_validates_against_the_kubernetes_schemas(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objs = rendered
    assert len(objs) >= 10
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{overlay}: {obj['kind']}/{obj['metadata']['name']}: {path}: {exc.message}")


def test_the_validator_rejects_a_broken_object() -> None:
    """The check above can fail: an unknown field and a wrong type are caught."""
    objs = render("dev")
    dep = by(objs, "Deployment", "fedmask-coordinator")
    bad = yaml.safe_load(yaml.safe_dump(dep))
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesytem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    bad = yaml.safe_load(yaml.safe_dump(dep))
    bad["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def hardening_problems(obj: dict[str, Any]) -> list[str]:
    """Every hardening rule a pod spec breaks (empty: none)."""
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    spec = pod_spec(obj)
    problems = []
    psc = spec.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True:
        problems.append(f"{where}: pod securityContext.runAsNonRoot is not true")
    if psc.get("runAsUser", 1) == 0:
        problems.append(f"{where}: runs as uid 0")
    if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problems.append(f"{where}: seccompProfile is not RuntimeDefault")
    if spec.get("automountServiceAccountToken") is not False:
        problems.append(f"{where}: automountServiceAccountToken is not false")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            problems.append(f"{where}: {key}")
    claims = {t["metadata"]["name"] for t in obj.get("spec", {}).get("volumeClaimTemplates", [])}
    volumes = {v["name"] for v in spec.get("volumes", [])} | claims
    for c in spec.get("initContainers", []) + spec["containers"]:
        cw = f"{where} container {c['name']}"
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{cw}: allowPrivilegeEscalation is not false")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{cw}: readOnlyRootFilesystem is not true")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []) or sc.get("capabilities", {}).get("add"):
            problems.append(f"{cw}: capabilities: ALL not dropped, or some added")
        if sc.get("privileged") or sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is False:
            problems.append(f"{cw}: privileged or root")
        image = c.get("image", "")
        last = image.rsplit("/", 1)[-1]
        if "@sha256:" not in image and (":" not in last or last.endswith(":latest")):
            problems.append(f"{cw}: image {image!r} has no tag or the tag latest")
        res = c.get("resources", {})
        for part in ("requests", "limits"):
            if not {"cpu", "memory"} <= set(res.get(part, {})):
                problems.append(f"{cw}: resources.{part} lack cpu or memory")
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                problems.append(f"{cw}: mounts undeclared volume {m['name']}")
    return problems


def test_every_pod_is_hardened(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objs = rendered
    pods = [o for o in objs if o["kind"] in POD_KINDS]
    assert {o["metadata"]["name"] for o in pods} >= {"fedmask-coordinator", "fedmask-client"}
    problems = [p for o in pods for p in hardening_problems(o)]
    assert problems == [], f"{overlay}:\n" + "\n".join(problems)


def test_the_policy_check_catches_each_rule() -> None:
    dep = by(render("dev"), "Deployment", "fedmask-coordinator")
    assert hardening_problems(dep) == []

    def broken(change: Callable[[dict[str, Any], dict[str, Any]], object]) -> list[str]:
        copy = yaml.safe_load(yaml.safe_dump(dep))
        change(pod_spec(copy), pod_spec(copy)["containers"][0])
        return hardening_problems(copy)

    assert broken(lambda p, c: p["securityContext"].pop("runAsNonRoot"))
    assert broken(lambda p, c: p["securityContext"].update(seccompProfile={"type": "Unconfined"}))
    assert broken(lambda p, c: c["securityContext"].update(allowPrivilegeEscalation=True))
    assert broken(lambda p, c: c["securityContext"].update(readOnlyRootFilesystem=False))
    assert broken(lambda p, c: c["securityContext"].update(capabilities={"drop": ["NET_RAW"]}))
    assert broken(lambda p, c: c.update(image="fedmask-coordinator:latest"))
    assert broken(lambda p, c: c.update(image="fedmask-coordinator"))
    assert broken(lambda p, c: c["resources"].pop("limits"))
    assert broken(lambda p, c: p.update(automountServiceAccountToken=True))


def test_writable_paths_are_volumes(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """With a read-only root filesystem, what fedmask writes must be mounted."""
    _, objs = rendered
    coord = pod_spec(by(objs, "Deployment", "fedmask-coordinator"))["containers"][0]
    client = pod_spec(by(objs, "StatefulSet", "fedmask-client"))["containers"][0]
    assert "/var/lib/fedmask/tmp" in {m["mountPath"] for m in coord["volumeMounts"]}
    assert {"/var/lib/fedmask/state", "/var/lib/fedmask/data", "/var/lib/fedmask/tmp"} <= {
        m["mountPath"] for m in client["volumeMounts"]}


def test_coordinator_runs_once_with_grpc_probes(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objs = rendered
    dep = by(objs, "Deployment", "fedmask-coordinator")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    c = pod_spec(dep)["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == 50052, probe
    config = by(objs, "ConfigMap", next(o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap"
                                        and o["metadata"]["name"].startswith("fedmask-coordinator")))
    assert config["data"]["FEDMASK_HEALTH_LISTEN_ADDRESS"].endswith(":50052")
    assert config["data"]["FEDMASK_AUTH__MODE"] == "mtls"


def _selects(peer: dict[str, Any], component: str) -> bool:
    labels = peer.get("podSelector", {}).get("matchLabels")
    return labels is not None and labels.get("app.kubernetes.io/component") == component


def test_network_policies(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objs = rendered
    nps = [o for o in objs if o["kind"] == "NetworkPolicy"]
    deny = by(objs, "NetworkPolicy", "fedmask-default-deny")
    assert deny["spec"]["podSelector"] == {} and deny["spec"]["policyTypes"] == ["Ingress"]
    assert "ingress" not in deny["spec"]

    # Ingress to the coordinator: clients on 50051 only, admin on 50053 only.
    coord_in = [r for o in nps if o["spec"]["podSelector"].get("matchLabels", {}).get(
        "app.kubernetes.io/component") == "coordinator" for r in o["spec"].get("ingress", [])]
    assert coord_in
    for rule in coord_in:
        ports = {p["port"] for p in rule["ports"]}
        assert rule["from"], "an ingress rule without 'from' admits everyone"
        if all(_selects(p, "client") for p in rule["from"]):
            assert ports == {50051}
        else:
            assert all(_selects(p, "admin") for p in rule["from"]) and ports == {50053}

    # Egress of the clients inside the cluster: the coordinator's device port and DNS.
    client_out = [r for o in nps if o["spec"]["podSelector"].get("matchLabels", {}).get(
        "app.kubernetes.io/component") == "client" for r in o["spec"].get("egress", [])]
    assert client_out
    for rule in client_out:
        assert rule.get("to"), "an egress rule without 'to' allows every destination"
        for peer in rule["to"]:
            ports = {(p.get("protocol", "TCP"), p["port"]) for p in rule["ports"]}
            if "ipBlock" in peer:  # the dataset fetch: HTTPS outside the private ranges only
                assert ports == {("TCP", 443)} and peer["ipBlock"]["cidr"] == "0.0.0.0/0"
                assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"} <= set(peer["ipBlock"]["except"])
            elif _selects(peer, "coordinator"):
                assert ports == {("TCP", 50051)}
            else:
                assert peer["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
                assert ports <= {("UDP", 53), ("TCP", 53)}

    # The database (dev overlay): only the coordinator and the admin service.
    if overlay == "dev":
        db = by(objs, "NetworkPolicy", "fedmask-database-ingress")
        (rule,) = db["spec"]["ingress"]
        assert sorted(p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"]) == [
            "admin", "coordinator"]
        assert [p["port"] for p in rule["ports"]] == [5432]
        assert by(objs, "StatefulSet", "fedmask-postgres")


def test_clients_are_a_statefulset_with_own_volumes_and_a_pdb(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objs = rendered
    sts = by(objs, "StatefulSet", "fedmask-client")
    assert {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]} == {"state", "data"}
    pdb = by(objs, "PodDisruptionBudget", "fedmask-client")
    assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    if overlay == "production":
        assert sts["spec"]["replicas"] == 4
        env = pod_spec(by(objs, "Deployment", "fedmask-coordinator"))["containers"][0]["env"]
        assert {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in env} == {
            "PGPASSWORD": "fedmask-database", "FEDMASK_DATABASE_URL": "fedmask-database"}
        assert not [o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "fedmask-postgres"]
    for o in objs:  # no Secret material in the repository's manifests
        assert o["kind"] != "Secret", f"{o['metadata']['name']}: Secrets are created outside Kustomize"
