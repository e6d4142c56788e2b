"""deploy/k8s/simulate (D93): a multi-node `fedmask simulate` as an Indexed
Job with a headless Service. Rendered offline (`kubectl kustomize`), every
object valid against the Kubernetes schemas (kubernetes-validate, strict),
the pod hardened as the other manifests are, and the pieces agreeing: N
nodes in the Job and in torchrun, the pods found through the Service by the
name torchrun is given, torchrun's and `fedmask simulate`'s arguments
accepted by their own parsers. No cluster needed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.30.0"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


@pytest.fixture(scope="module")
def objs() -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(ROOT / "deploy" / "k8s" / "simulate")], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def flags(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def test_every_object_validates_strictly(objs: list[dict[str, Any]]) -> None:
    assert {o["kind"] for o in objs} == {"Namespace", "Service", "PersistentVolumeClaim", "Job"}
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    bad = yaml.safe_load(yaml.safe_dump(one(objs, "Job")))
    bad["spec"]["completionMode"] = ["Indexed"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_the_job_the_service_and_torchrun_agree(objs: list[dict[str, Any]]) -> None:
    job, svc = one(objs, "Job"), one(objs, "Service")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    assert pod["subdomain"] == svc["metadata"]["name"]
    (c,) = pod["containers"]
    f = flags(c["args"])
    assert int(f["nnodes"]) == spec["completions"]
    assert f["master-addr"] == f"{job['metadata']['name']}-0.{svc['metadata']['name']}"  # pod 0's DNS name
    assert int(f["master-port"]) == svc["spec"]["ports"][0]["port"]
    assert f["node-rank"] == "$(NODE_RANK)"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']")
    claim = one(objs, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # every rank writes its checkpoint shard
    work = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["work"]
    for key in ("out", "checkpoint-dir", "dataset"):
        assert f[key].startswith(work + "/"), key


def test_torchrun_and_fedmask_simulate_accept_the_arguments(objs: list[dict[str, Any]]) -> None:
    import typer
    from torch.distributed.run import get_args_parser

    from fedmask.cli import app

    (c,) = one(objs, "Job")["spec"]["template"]["spec"]["containers"]
    assert c["command"][-2:] == ["-m", "torch.distributed.run"]
    args = [a.replace("$(NODE_RANK)", "1") for a in c["args"]]
    parsed = get_args_parser().parse_args(args)
    assert parsed.module and parsed.training_script == "fedmask" and parsed.training_script_args[0] == "simulate"
    cli = typer.main.get_command(app)
    assert isinstance(cli, typer.core.TyperGroup)
    ctx = cli.make_context("fedmask", list(parsed.training_script_args))
    sub = cli.get_command(ctx, "simulate")
    assert sub is not None
    sub_ctx = sub.make_context("simulate", list(parsed.training_script_args[1:]))
    assert sub_ctx.params["checkpoint_every"] >= 1 and sub_ctx.params["nproc"] is None  # torchrun makes the ranks


def test_the_pod_is_hardened(objs: list[dict[str, Any]]) -> None:
    pod = one(objs, "Job")["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0 and psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert ":" in c["image"].rsplit("/", 1)[-1] and not c["image"].endswith(":latest")
    for part in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][part])
    declared = {v["name"] for v in pod["volumes"]}
    assert {m["name"] for m in c["volumeMounts"]} <= declared
