"""Where a rank sits: its node rank, the node it runs on and how many nodes the job has.

gpud says so itself when it launched the process (`GPUD_NODE_RANK`, `GPUD_NODE`). Where it
did not — a Kubernetes job, a plain torchrun — the same facts come from what the launcher
and the job operators put in the environment (stdlib only: this runs inside every rank):

- **torchrun** gives every worker `GROUP_RANK` and `GROUP_WORLD_SIZE`: the node rank and
  node count it used to number the ranks (`RANK = GROUP_RANK × nproc + LOCAL_RANK`), so
  they win over anything torchrun was told (with a c10d rendezvous the rendezvous, not
  the pod, decides the node rank).
- **Kubeflow's training operator** (PyTorchJob; Trainer v2 too) gives every pod
  `PET_NODE_RANK`, `PET_NNODES`, `PET_NPROC_PER_NODE`, `PET_MASTER_ADDR` and
  `PET_MASTER_PORT`, which torchrun reads as its flags; without torchrun they are all
  there is. (Its plain `RANK`/`WORLD_SIZE` count pods only until torchrun replaces them;
  `RunEnv` reads those as the process's own.) Trainer v2 sets `PET_NODE_RANK` from the
  Job's completion index; the rendezvous address needs nothing from us.
- **JobSet** injects no variables of its own: Kubernetes gives every pod of an Indexed Job
  (JobSet's default) `JOB_COMPLETION_INDEX`, and JobSet's `jobset.sigs.k8s.io/job-index`
  and `…/replicatedjob-replicas` annotations reach the pod through the downward API as
  `JOB_INDEX` and `REPLICATED_JOB_REPLICAS` (the names our manifests use). One Job of N
  pods (JobSet's PyTorch examples): the node rank is the completion index. N Jobs of M
  pods: `JOB_INDEX × M + JOB_COMPLETION_INDEX`, M = node count ÷ replicas.
- **The node** is `NODE_NAME` (the downward API's `spec.nodeName`, as dcgm-exporter's own
  DaemonSet names it), else the host name — in a pod, the pod's.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Source = Literal["gpud", "torchrun", "training-operator", "jobset", "none"]


@dataclass(frozen=True)
class Placement:
    node_rank: int
    node: str
    nnodes: int | None
    #: Which launcher or operator told the node rank ("none": nobody did, so 0).
    source: Source


def _count(env: Mapping[str, str], key: str, minimum: int = 0) -> int | None:
    """A whole number ≥ minimum, else None (unset, empty, elastic "1:4", garbage)."""
    value = env.get(key, "").strip()
    if not value.isdigit():
        return None
    number = int(value)
    return number if number >= minimum else None


def _nnodes(env: Mapping[str, str]) -> int | None:
    return _count(env, "GROUP_WORLD_SIZE", 1) or _count(env, "PET_NNODES", 1)


def _jobset_rank(env: Mapping[str, str], nnodes: int | None) -> int | None:
    completion = _count(env, "JOB_COMPLETION_INDEX")
    job = _count(env, "JOB_INDEX")
    if job is None:
        return completion
    replicas = _count(env, "REPLICATED_JOB_REPLICAS", 1)
    if replicas is None or nnodes is None or nnodes % replicas:
        # Without the pods per Job a rank would be a guess that may clash with another
        # pod's; "none" (0) is at least visibly wrong for every pod but the first.
        return None
    return job * (nnodes // replicas) + (completion or 0)


def placement_from(env: Mapping[str, str], hostname: str | None = None) -> Placement:
    """This process's placement from its environment (first source that says, wins)."""
    node = (
        env.get("GPUD_NODE") or env.get("NODE_NAME") or hostname or socket.gethostname()
    ).strip()
    nnodes = _nnodes(env)
    found: tuple[int | None, Source] = (_count(env, "GPUD_NODE_RANK"), "gpud")
    if found[0] is None:
        found = (_count(env, "GROUP_RANK"), "torchrun")
    if found[0] is None:
        found = (_count(env, "PET_NODE_RANK"), "training-operator")
    if found[0] is None:
        found = (_jobset_rank(env, nnodes), "jobset")
    rank, source = found
    if rank is None:
        return Placement(node_rank=0, node=node, nnodes=nnodes, source="none")
    return Placement(node_rank=rank, node=node, nnodes=nnodes, source=source)
