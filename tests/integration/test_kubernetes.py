"""The Kubernetes manifests in config/kubernetes/ (issue 12) against the Kubernetes
schemas (kubernetes-validate, strict: unknown fields are errors). No cluster here: what
the schemas cannot say about the PyTorchJob (a CRD, not vendored) is checked by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpud.kube.podresources import DEFAULT_SOCKET

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (the dev extra has it)"
)

MANIFESTS = Path(__file__).parents[2] / "config" / "kubernetes"
K8S = "1.31.0"  # a release current clusters run; the schemas ship with kubernetes-validate


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def validate(resource: dict[str, Any]) -> None:
    kubernetes_validate.validate(resource, K8S, strict=True)


def test_the_daemonset_and_its_neighbours_validate() -> None:
    docs = documents("gpud-daemonset.yaml")
    assert [d["kind"] for d in docs] == ["Namespace", "ServiceAccount", "DaemonSet", "Service"]
    for doc in docs:
        validate(doc)
    daemonset = docs[2]["spec"]["template"]["spec"]
    assert daemonset["hostPID"] is True and daemonset["runtimeClassName"] == "nvidia"
    (container,) = daemonset["containers"]
    assert container["args"][0] == "serve" and "--metrics=0.0.0.0:9400" in container["args"]
    # A non-loopback /metrics needs TLS with client certificates (or --metrics-insecure).
    assert any(a.startswith("--metrics-client-ca=") for a in container["args"])
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert "/var/lib/gpud" in mounts
    # The kubelet's pod-resources socket where gpud looks for it by default, read-only.
    kubelet = mounts[str(DEFAULT_SOCKET.parent)]
    assert kubelet["readOnly"] is True
    volumes = {v["name"]: v for v in daemonset["volumes"]}
    assert volumes[kubelet["name"]]["hostPath"]["path"] == str(DEFAULT_SOCKET.parent)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUD_STATE_DIR"] == "/var/lib/gpud" and env["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_the_pytorchjob_runs_the_cpu_ddp_example_in_valid_pods() -> None:
    (job,) = documents("train-cpu-ddp-pytorchjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    assert job["spec"]["nprocPerNode"] == "2"
    for role, spec in replicas.items():
        assert spec["replicas"] >= 1 and spec["restartPolicy"] in {"OnFailure", "Never"}, role
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role.lower()},
               "template": spec["template"]}  # fmt: skip
        validate(pod)
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"  # the operator injects its env into this one
        assert container["command"] == ["gpud", "attach", "--", "torchrun"]
        assert container["args"][0] == "trainers/examples/ddp.py"
        assert (MANIFESTS.parents[1] / container["args"][0]).exists()
        assert downward(container)["NODE_NAME"] == "spec.nodeName"
        assert downward(container)["POD_UID"] == "metadata.uid"
        assert reports_to_the_daemon(spec["template"]["spec"], container)


def reports_to_the_daemon(pod: dict[str, Any], container: dict[str, Any]) -> bool:
    """The pod mounts, from the host, the directory the DaemonSet's gpud attaches in."""
    daemonset = documents("gpud-daemonset.yaml")[2]
    (gpud,) = daemonset["spec"]["template"]["spec"]["containers"]
    (attach,) = [a.split("=", 1)[1] for a in gpud["args"] if a.startswith("--attach=")]
    hosts = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    served = {v["hostPath"]["path"] for v in daemonset["spec"]["template"]["spec"]["volumes"]
              if "hostPath" in v}  # fmt: skip
    return any(hosts.get(n) == attach and path == attach for n, path in mounts.items()) and (
        attach in served
    )


def downward(container: dict[str, Any]) -> dict[str, str]:
    """The container's variables that come from the downward API: name → field path."""
    return {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container["env"]
        if "fieldRef" in e.get("valueFrom", {})
    }


def test_the_jobset_runs_the_cpu_ddp_example_with_its_indices_in_the_environment() -> None:
    (jobset,) = documents("train-cpu-ddp-jobset.yaml")
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert set(jobset["spec"]) == {"network", "replicatedJobs"}
    (workers,) = jobset["spec"]["replicatedJobs"]
    assert set(workers) == {"name", "replicas", "template"} and workers["replicas"] >= 1
    # The Job template is a batch/v1 Job's spec: the schemas check all of it.
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "workers"},
           "spec": workers["template"]["spec"]}  # fmt: skip
    validate(job)
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"]
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PET_NNODES"] == str(workers["replicas"] * spec["parallelism"])
    # Pod names follow <jobset>-<replicated job>-<job index>-<pod index>.<subdomain>.
    name = jobset["metadata"]["name"]
    assert env["PET_MASTER_ADDR"] == f"{name}-{workers['name']}-0-0.{name}"
    assert downward(container) == {
        "PET_NODE_RANK": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
        "JOB_INDEX": "metadata.annotations['jobset.sigs.k8s.io/job-index']",
        "REPLICATED_JOB_REPLICAS": (
            "metadata.annotations['jobset.sigs.k8s.io/replicatedjob-replicas']"
        ),
        "NODE_NAME": "spec.nodeName",
        "POD_UID": "metadata.uid",
    }
    assert container["command"] == ["gpud", "attach", "--", "torchrun"]
    assert reports_to_the_daemon(spec["template"]["spec"], container)
    assert (MANIFESTS.parents[1] / container["args"][0]).exists()


def test_a_broken_manifest_is_caught() -> None:
    """The validation is real: a typo'd field and a wrong type both fail."""
    daemonset = documents("gpud-daemonset.yaml")[2]
    daemonset["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(daemonset)
    service = documents("gpud-daemonset.yaml")[3]
    service["spec"]["ports"][0]["port"] = "nine thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(service)
