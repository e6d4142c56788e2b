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
    assert {o["metadata"]["name"] for o in pods} >= {"fedmask-coordinator", "fedmask-admin", "fedmask-client"}
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
    admin = pod_spec(by(objs, "Deployment", "fedmask-admin"))["containers"][0]
    assert "/var/lib/fedmask/tmp" in {m["mountPath"] for m in admin["volumeMounts"]}
    client = pod_spec(by(objs, "StatefulSet", "fedmask-client"))["containers"][0]
    assert "/var/lib/fedmask/tmp" in {m["mountPath"] for m in coord["volumeMounts"]}
    assert {"/var/lib/fedmask/state", "/var/lib/fedmask/data", "/var/lib/fedmask/tmp"} <= {
        m["mountPath"] for m in client["volumeMounts"]}


def test_coordinator_runs_as_three_replicas_with_grpc_probes(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objs = rendered
    dep = by(objs, "Deployment", "fedmask-coordinator")
    assert dep["spec"]["replicas"] == 3 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    pdb = by(objs, "PodDisruptionBudget", "fedmask-coordinator")
    assert pdb["spec"]["minAvailable"] == 2
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    service = by(objs, "Service", "fedmask-coordinator")
    assert service["spec"]["clusterIP"] == "None"  # clients resolve every replica and find the leader
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


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A NetworkPolicy podSelector (matchLabels only; the manifests use no expressions) selects `labels`."""
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _config(objs: list[dict[str, Any]], prefix: str) -> dict[str, str]:
    (config,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(prefix + "-")
                 and o["metadata"]["name"][len(prefix) + 1:].isalnum()]
    return dict(config["data"])


def test_admin_service_two_stateless_replicas_probed_on_readyz_and_healthz(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objs = rendered
    dep = by(objs, "Deployment", "fedmask-admin")
    assert dep["spec"]["replicas"] == 2
    spec = pod_spec(dep)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "admin"
    assert hardening_problems(dep) == []
    (c,) = spec["containers"]
    assert c["args"] == ["admin"] and c["image"].rsplit("/", 1)[-1].startswith("fedmask-admin:")
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8080} and c["readinessProbe"]["httpGet"]["port"] in ("http", 8080)
    # Stateless: no persistent volume, only Secrets and an emptyDir.
    assert all(set(v) & {"secret", "emptyDir"} for v in spec["volumes"]), spec["volumes"]
    assert "volumeClaimTemplates" not in dep["spec"]
    # Its secrets are Secrets, mounted as files; the coordinator's private key never reaches it.
    secret_items = {(v["secret"]["secretName"], i["key"]) for v in spec["volumes"] if "secret" in v
                    for i in v["secret"]["items"]}
    assert secret_items == {("fedmask-coordinator-tls", "ca.pem"), ("fedmask-admin", "coordinator-token"),
                            ("fedmask-admin", "api-tokens.toml"), ("fedmask-database-reader", "password")}
    assert not any(e.get("value", "").startswith(("postgresql", "sqlite")) and "@" in e.get("value", "")
                   and ":" in e["value"].split("@")[0].split("//")[-1] for e in c.get("env", [])), \
        "a password in a database URL"
    config = _config(objs, "fedmask-admin")
    mounted = {m["mountPath"] for m in c["volumeMounts"]}
    for key in ("FEDMASK_COORDINATOR_TOKEN_FILE", "FEDMASK_ADMIN_CONFIG", "FEDMASK_ADMIN_COORDINATOR__TLS_CA"):
        assert any(config[key].startswith(m + "/") for m in mounted), (key, config[key])
    assert config["FEDMASK_ADMIN_COORDINATOR__ADDRESS"] == "fedmask-coordinator:50053"
    assert config["FEDMASK_ADMIN_DATABASE_URL"].startswith("postgresql+psycopg://fedmask_reader@")
    if overlay == "production":
        assert {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e} == {
            "FEDMASK_ADMIN_DATABASE_URL": "fedmask-database-reader"}
    # Service, Ingress and PodDisruptionBudget select these pods.
    svc = by(objs, "Service", "fedmask-admin")
    assert _matches({"matchLabels": svc["spec"]["selector"]}, labels)
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["http"]
    ingress = by(objs, "Ingress", "fedmask-admin")
    backends = [p["backend"]["service"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]]
    assert backends == [{"name": "fedmask-admin", "port": {"name": "http"}}]
    assert _matches(by(objs, "PodDisruptionBudget", "fedmask-admin")["spec"]["selector"], labels)


def test_only_the_admin_pods_reach_the_coordinators_admin_port(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """The coordinator serves its admin listener on 50053 (its Service too),
    the admin service points there, and of every pod the manifests make only
    the admin Deployment's are admitted to that port by any policy."""
    _, objs = rendered
    coord = by(objs, "Deployment", "fedmask-coordinator")
    coord_labels = coord["spec"]["template"]["metadata"]["labels"]
    assert {"name": "admin", "containerPort": 50053} in pod_spec(coord)["containers"][0]["ports"]
    assert _config(objs, "fedmask-coordinator")["FEDMASK_ADMIN__LISTEN"].endswith(":50053")
    assert {p["port"] for p in by(objs, "Service", "fedmask-coordinator")["spec"]["ports"]} == {50051, 50053}
    pods = {o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"] for o in objs if o["kind"] in POD_KINDS}
    admitted: set[str] = set()
    for np in (o for o in objs if o["kind"] == "NetworkPolicy"):
        if not _matches(np["spec"]["podSelector"], coord_labels):
            continue
        for rule in np["spec"].get("ingress", []):
            if rule.get("ports") and 50053 not in {p["port"] for p in rule["ports"]}:
                continue
            assert rule.get("from"), f"{np['metadata']['name']}: an ingress rule without 'from' admits every pod"
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, f"{np['metadata']['name']}: 50053 open beyond the namespace's pods"
                admitted |= {name for name, labels in pods.items() if _matches(peer["podSelector"], labels)}
    assert admitted == {"fedmask-admin"}, admitted
    # The admin pods themselves take HTTP from the ingress controller's namespace only, on 8080.
    admin_labels = pods["fedmask-admin"]
    rules = [r for o in objs if o["kind"] == "NetworkPolicy" and o["spec"]["podSelector"] != {}
             and _matches(o["spec"]["podSelector"], admin_labels) for r in o["spec"].get("ingress", [])]
    assert rules and all({p["port"] for p in r["ports"]} == {8080} and r["from"]
                         and all(set(peer) == {"namespaceSelector"} for peer in r["from"]) for r in rules), rules


def test_dev_database_creates_the_admin_services_read_only_role() -> None:
    """The dev overlay's PostgreSQL runs the same init script as compose (the
    one file, through deploy/postgres/kustomization.yaml: Kustomize reads no
    file outside a kustomization's folder), with the reader's password from
    its Secret."""
    objs = render("dev")
    overlay_copy = ROOT / "deploy" / "k8s" / "overlays" / "dev" / "10-fedmask-reader.sh"
    canonical = ROOT / "deploy" / "postgres" / "initdb" / "10-fedmask-reader.sh"
    assert not overlay_copy.exists(), f"{overlay_copy}: the overlay takes {canonical}, it keeps no copy"
    (initdb,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("fedmask-postgres-initdb")]
    assert initdb["data"]["10-fedmask-reader.sh"] == canonical.read_text()
    pg = pod_spec(by(objs, "StatefulSet", "fedmask-postgres"))
    (c,) = pg["containers"]
    assert {m["mountPath"]: m["name"] for m in c["volumeMounts"]}["/docker-entrypoint-initdb.d"] == "initdb"
    volumes = {v["name"]: v for v in pg["volumes"]}
    assert volumes["initdb"]["configMap"]["name"] == initdb["metadata"]["name"]
    assert volumes["reader"]["secret"]["secretName"] == "fedmask-database-reader"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FEDMASK_READER_PASSWORD_FILE"].startswith(
        {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["reader"] + "/")


# ------------------------------------------------- the admin service's request limits at the edge (D82)
INGRESS_NGINX = "nginx.ingress.kubernetes.io/"
CONTROLLER_LIMITS = ROOT / "deploy" / "k8s" / "ingress-nginx" / "controller-limits.yaml"


def nginx_size(value: str) -> int:
    """nginx's size syntax: 16k, 1m, 512."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    value = value.strip().lower()
    return int(value[:-1]) * units[value[-1]] if value[-1] in units else int(value)


def edge_limit_problems(objs: list[dict[str, Any]], controller: dict[str, Any]) -> list[str]:
    """Every way the Ingress, the controller's settings and the admin
    service's own settings disagree on the request limits (empty: none)."""
    from admin.settings import AdminSettings, EventStreamSlots, RequestLimits

    config = _config(objs, "fedmask-admin")

    def group(prefix: str) -> dict[str, str]:
        return {k[len(prefix):].lower(): v for k, v in config.items() if k.startswith(prefix)}

    limits = RequestLimits.model_validate(group("FEDMASK_ADMIN_LIMITS__"))
    streams = EventStreamSlots.model_validate(group("FEDMASK_ADMIN_EVENT_STREAMS__"))
    problems = []
    notes = by(objs, "Ingress", "fedmask-admin")["metadata"].get("annotations", {})
    need = {"proxy-body-size", "client-body-buffer-size", "proxy-read-timeout", "proxy-send-timeout",
            "limit-connections"}
    missing = sorted(need - {k.removeprefix(INGRESS_NGINX) for k in notes})
    if missing:
        return [f"the Ingress lacks {missing}"]
    if nginx_size(notes[INGRESS_NGINX + "proxy-body-size"]) != limits.max_body_bytes:
        problems.append("proxy-body-size is not limits.max_body_bytes")
    if nginx_size(notes[INGRESS_NGINX + "client-body-buffer-size"]) > limits.max_body_bytes:
        problems.append("client-body-buffer-size is over limits.max_body_bytes")
    read_timeout = float(notes[INGRESS_NGINX + "proxy-read-timeout"])
    if read_timeout <= max(AdminSettings.model_fields["sse_keepalive_s"].default, limits.request_timeout_s):
        problems.append("proxy-read-timeout would cut a quiet event stream or a request the service still serves")
    if int(notes[INGRESS_NGINX + "limit-connections"]) > limits.max_concurrent_requests:
        problems.append("limit-connections lets one address take more than limits.max_concurrent_requests")
    data = controller["data"]
    count, size = data["large-client-header-buffers"].split()
    if int(count) * nginx_size(size) > limits.max_header_bytes:
        problems.append("large-client-header-buffers admit a head over limits.max_header_bytes")
    if float(data["client-header-timeout"]) > limits.head_timeout_s:
        problems.append("client-header-timeout is over limits.head_timeout_s")
    if float(data["client-body-timeout"]) > limits.request_timeout_s:
        problems.append("client-body-timeout is over limits.request_timeout_s")
    # one WatchEvents watcher per event stream, in every replica
    replicas = by(objs, "Deployment", "fedmask-admin")["spec"]["replicas"]
    watchers = int(_config(objs, "fedmask-coordinator")["FEDMASK_ADMIN__MAX_WATCHERS"])
    if replicas * streams.max_streams > watchers:
        problems.append(f"{replicas} admin replicas x {streams.max_streams} event streams > {watchers} watchers")
    return problems


def test_the_edge_holds_the_admin_services_request_limits(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """The Ingress's ingress-nginx annotations and the controller settings
    of deploy/k8s/ingress-nginx hold the admin service's limits (its
    ConfigMap states them); the coordinator has a watcher for every event
    stream of every admin replica."""
    _, objs = rendered
    controller = yaml.safe_load(CONTROLLER_LIMITS.read_text())
    kubernetes_validate.validate(controller, K8S_VERSION, strict=True)
    assert edge_limit_problems(objs, controller) == []


def test_the_edge_limit_check_catches_each_gap() -> None:
    objs = render("dev")
    controller = yaml.safe_load(CONTROLLER_LIMITS.read_text())

    def broken(change: Callable[[list[dict[str, Any]], dict[str, Any]], object]) -> list[str]:
        o, c = yaml.safe_load(yaml.safe_dump(objs)), yaml.safe_load(yaml.safe_dump(controller))
        change(o, c)
        return edge_limit_problems(o, c)

    def annotations(o: list[dict[str, Any]]) -> dict[str, str]:
        notes: dict[str, str] = by(o, "Ingress", "fedmask-admin")["metadata"]["annotations"]
        return notes

    assert broken(lambda o, c: annotations(o).pop(INGRESS_NGINX + "proxy-body-size"))
    assert broken(lambda o, c: annotations(o).update({INGRESS_NGINX + "proxy-body-size": "200m"}))
    assert broken(lambda o, c: annotations(o).update({INGRESS_NGINX + "proxy-read-timeout": "10"}))
    assert broken(lambda o, c: c["data"].update({"large-client-header-buffers": "4 64m"}))
    assert broken(lambda o, c: c["data"].update({"client-header-timeout": "60"}))
    assert broken(lambda o, c: by(o, "Deployment", "fedmask-admin")["spec"].update({"replicas": 3}))
