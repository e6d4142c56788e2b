"""The NetworkPolicies keep devices off the coordinator's admin listener:
validated offline, on what `kubectl kustomize` renders for every overlay,
with the evaluator of tests/deploy/netpol_reach.py (no cluster, no CNI).

The coordinator's admin listener (port 50053, the Service's `admin` port)
takes operator actions and relays top-k requests; only the admin service's
pods may reach it. The devices (the edge-client pods) reach the device port
(50051) and nothing else of the coordinator, nor the admin service. The
checks run over every pod the manifests make, plus pods they do not make
(a stranger in the namespace, a pod of another namespace, the ingress
controller), and through the Service's named target ports. A second test
shows that the check fails when a policy lets a device pod in.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from netpol_reach import Pod, ingress_allows, reaches, selects, workload_pods

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = sorted(p.name for p in (ROOT / "deploy" / "k8s" / "overlays").iterdir() if p.is_dir())
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")
DEVICE_PORT, HEALTH_PORT, ADMIN_PORT, ADMIN_HTTP = 50051, 50052, 50053, 8080

needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")

Objs = list[dict[str, Any]]


def render(overlay: str) -> Objs:
    out = subprocess.run(["kubectl", "kustomize", str(ROOT / "deploy" / "k8s" / "overlays" / overlay)],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, Objs]:
    return request.param, render(request.param)


def _pod(pods: list[Pod], name: str) -> Pod:
    (pod,) = [p for p in pods if p.name == name]
    return pod


def _service_target(objs: Objs, service: str, port_name: str, dst: Pod) -> int:
    """The container port a Service port reaches (NetworkPolicies see the pod's port, after the Service)."""
    (svc,) = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == service]
    (entry,) = [p for p in svc["spec"]["ports"] if p["name"] == port_name]
    assert selects({"matchLabels": svc["spec"]["selector"]}, dst.labels), f"Service {service} misses {dst.name}"
    target = entry.get("targetPort", entry["port"])
    return dst.named_ports[target] if isinstance(target, str) else int(target)


def admin_listener_problems(objs: Objs) -> list[str]:
    """Every way the rendered policies let a pod other than the admin
    service's reach the coordinator's admin listener, or fail the admin
    service's and the devices' own paths (empty: none)."""
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    pods = workload_pods(objs, WORKLOADS)
    coord, admin, client = (_pod(pods, n) for n in ("fedmask-coordinator", "fedmask-admin", "fedmask-client"))
    ns = coord.namespace
    strangers = [
        Pod("a stranger pod in the namespace", ns, {"app": "debug"}),
        Pod("a pod labelled as a device, no name label", ns, {"app.kubernetes.io/component": "client"}),
        Pod("a pod of another namespace", "elsewhere", {}),
        Pod("a pod of another namespace labelled as the admin service", "elsewhere", dict(admin.labels)),
        Pod("the ingress controller", "ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}),
    ]
    admin_port = _service_target(objs, "fedmask-coordinator", "admin", coord)
    device_port = _service_target(objs, "fedmask-coordinator", "device", coord)
    problems = []
    if admin_port != ADMIN_PORT:
        problems.append(f"the coordinator Service's admin port reaches {admin_port}, not {ADMIN_PORT}")
    for src in [*pods, *strangers]:
        if src.name == admin.name:
            continue
        # ingress alone: the coordinator's own policies must refuse, whatever the source's egress says
        for port in (admin_port, HEALTH_PORT):
            if ingress_allows(policies, src, coord, port):
                problems.append(f"{src.name} reaches the coordinator on {port}")
        if src.name != client.name and ingress_allows(policies, src, coord, device_port):
            problems.append(f"{src.name} reaches the coordinator's device port")
    for port in (admin_port, HEALTH_PORT, ADMIN_HTTP):
        dst = admin if port == ADMIN_HTTP else coord
        if ingress_allows(policies, client, dst, port) or reaches(policies, client, dst, port):
            problems.append(f"a device pod reaches {dst.name} on {port}")
    if not reaches(policies, admin, coord, admin_port):
        problems.append("the admin service cannot reach the admin listener")
    if not reaches(policies, client, coord, device_port):
        problems.append("the devices cannot reach the device port")
    return problems


@needs_kubectl
def test_only_the_admin_service_reaches_the_admin_listener(rendered: tuple[str, Objs]) -> None:
    overlay, objs = rendered
    assert admin_listener_problems(objs) == [], overlay


def _coordinator_selector(objs: Objs) -> dict[str, Any]:
    (dep,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "fedmask-coordinator"]
    return {"matchLabels": dict(dep["spec"]["template"]["metadata"]["labels"])}


def _with_policy(objs: Objs, ingress: list[dict[str, Any]]) -> Objs:
    ns = objs[0]["metadata"].get("namespace") or next(o["metadata"]["name"] for o in objs if o["kind"] == "Namespace")
    extra = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
             "metadata": {"name": "too-permissive", "namespace": ns},
             "spec": {"podSelector": _coordinator_selector(objs), "policyTypes": ["Ingress"], "ingress": ingress}}
    return [*copy.deepcopy(objs), extra]


@needs_kubectl
def test_the_check_fails_a_policy_that_lets_devices_in() -> None:
    """Validated offline: each permissive variant below is caught by the check above."""
    objs = render("dev")
    assert admin_listener_problems(objs) == []
    devices = {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "client"}}}
    variants: dict[str, Objs] = {
        "allow everything": _with_policy(objs, [{}]),
        "every pod of the namespace on 50053": _with_policy(objs, [{"from": [{"podSelector": {}}],
                                                                    "ports": [{"port": ADMIN_PORT}]}]),
        "devices by the port's name": _with_policy(objs, [{"from": [devices], "ports": [{"port": "admin"}]}]),
        "devices on a port range": _with_policy(objs, [{"from": [devices],
                                                        "ports": [{"port": 50000, "endPort": 50100}]}]),
        "every namespace": _with_policy(objs, [{"from": [{"namespaceSelector": {}}]}]),
        "an address block": _with_policy(objs, [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]),
        "not the admin service": _with_policy(objs, [{"from": [{"podSelector": {"matchExpressions": [
            {"key": "app.kubernetes.io/component", "operator": "NotIn", "values": ["admin"]}]}}]}]),
    }
    no_ports = copy.deepcopy(objs)
    for o in no_ports:
        if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "fedmask-coordinator-ingress":
            for rule in o["spec"]["ingress"]:
                rule.pop("ports")
    variants["the devices' rule without ports"] = no_ports
    variants["no policy on the coordinator"] = [
        o for o in objs if not (o["kind"] == "NetworkPolicy" and o["metadata"]["name"] in (
            "fedmask-default-deny", "fedmask-coordinator-ingress"))]
    for what, variant in variants.items():
        problems = admin_listener_problems(variant)
        assert any("reaches the coordinator on 50053" in p or "device pod reaches" in p for p in problems), what


def test_the_evaluator_follows_the_api_semantics() -> None:
    ns = {"metadata": {"namespace": "n"}}
    web = Pod("web", "n", {"app": "web"}, named_ports={"http": 80})
    cli = Pod("cli", "n", {"app": "cli"})
    far = Pod("far", "m", {"app": "cli"}, {"team": "x"})
    deny = {**ns, "spec": {"podSelector": {}}}
    assert reaches([], cli, web, 80)  # nothing isolates: open
    assert not reaches([deny], cli, web, 80)
    allow = {**ns, "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}],
                                         "ports": [{"port": "http"}]}]}}
    assert reaches([deny, allow], cli, web, 80) and not reaches([deny, allow], cli, web, 81)
    assert not reaches([deny, allow], far, web, 80)  # a podSelector alone: the policy's namespace only
    by_ns = {**ns, "spec": {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
        "team": "x"}}, "podSelector": {"matchLabels": {"app": "cli"}}}]}]}}
    assert reaches([by_ns], far, web, 80) and not reaches([by_ns], cli, web, 80)
    egress_only = {**ns, "spec": {"podSelector": {"matchLabels": {"app": "cli"}}, "egress": []}}
    assert not reaches([egress_only], cli, web, 80)  # policyTypes default to Egress with an egress section
    assert ingress_allows([egress_only], cli, web, 80)
    udp = {**ns, "spec": {"podSelector": {}, "ingress": [{"ports": [{"protocol": "UDP", "port": 53}]}]}}
    assert reaches([udp], cli, web, 53, "UDP") and not reaches([udp], cli, web, 53)
