"""What to do about a failure everyone hits: one line of advice for a known signature.

gpud.runs.diagnosis.causes says what failed (the rank, its exception, the class); for a
failure whose signature is known this module says how to get past it, in one line:
`FailureCause.hint`, which `gpuctl status` (a `hint` line), `--json` (`cause.hint`), the
last line of `gpuctl launch --wait` and gputop's Run screen show, and anything that carries
the cause carries along. The table is data, the README's hints table lists the same rows:
each names a signature (a pattern of the causes table, or one of its own for causes found
another way: a signal, the kernel's OOM killer), the class it goes with, and the function
that writes the hint from the match and from what the node knows (`HintFacts`): the
interpreter that ran, MASTER_PORT, the batch `gpuctl hw` recommends. A row applies only to a
cause of its class, so a signature mentioned in passing by another failure never gets its
hint.

Pure: no I/O. A part's cause gets its hint on its own node (`with_hint`, with that node's
facts); node 0 fills in what is missing and rewrites the one hint that names the flight
recorder's findings with every part's findings (`for_run`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from gpud.model.run import CauseKind, FailureCause
from gpud.model.snapshot import NodeSnapshot
from gpud.runs.diagnosis.causes import (
    ADDRESS_IN_USE,
    COLLECTIVE_TIMEOUT,
    CPU_TORCH,
    CUDA_DRIVER,
    CUDA_OOM,
    DEVICE_ASSERT,
    DISK_FULL,
    FILE_MISSING,
    MODULE_MISSING,
    NCCL_ERROR,
    NO_NCCL,
    NO_PERMISSION,
    FailurePattern,
)
from gpud.runs.diagnosis.logparse import split_rank
from launch.autotune import Recommendation, recommend_for_node
from launch.sections import Launcher
from launch.spec import RunSpec


@dataclass(frozen=True)
class HintFacts:
    """What the failed part's node knows that a hint can name; None where not known."""

    python: str | None = None  # the interpreter that ran the script (and its launcher)
    python_is_gpuds: bool = False  # the spec set no `python:`: the daemon's own ran it
    master_port: int | None = None  # the MASTER_PORT gpud leased for the attempt
    workdir: str | None = None  # where a relative path in the script is taken from
    checkpoint_dir: str | None = None  # checkpoint.dir, when the spec sets one
    batch_per_gpu: int | None = None  # training.batch_size_per_gpu, as the spec set it
    recommendation: Recommendation | None = None  # `gpuctl hw`'s for this node's GPUs
    cuda_version: str | None = None  # the newest CUDA this node's driver supports


NO_FACTS = HintFacts()


def facts_for(
    spec: RunSpec, snapshot: NodeSnapshot, *, master_port: int | None, own_python: str
) -> HintFacts:
    """What a node knows about a part of the run: `own_python` is the daemon's interpreter
    (what runs the script when the spec sets no `python:`)."""
    return HintFacts(
        python=spec.python or own_python,
        python_is_gpuds=spec.python is None,
        # A lone process is not told MASTER_PORT unless the spec asks (distributed_env).
        master_port=master_port
        if spec.launcher is not Launcher.PYTHON or spec.distributed_env
        else None,
        workdir=spec.workdir,
        checkpoint_dir=spec.checkpoint.dir,
        batch_per_gpu=spec.training.batch_size_per_gpu,
        # What `gpuctl hw` prints for the node (a node without GPUs has no GPU batch).
        recommendation=recommend_for_node(snapshot) if snapshot.gpus else None,
        cuda_version=snapshot.cuda_driver_version,
    )


@dataclass(frozen=True)
class Found:
    """A signature found in a cause: what its hint is written from."""

    match: re.Match[str]
    cause: FailureCause
    facts: HintFacts

    def group(self, pattern: str) -> str | None:
        """The first group of `pattern` in the matched text, None if it is not there."""
        found = re.search(pattern, self.match.string)
        return found[1] if found else None

    @property
    def python(self) -> str:
        return self.facts.python or "the interpreter that ran it"


@dataclass(frozen=True)
class Hint:
    name: str  # how the README and the tests call it
    signature: FailurePattern  # its class, and the pattern a cause's words must match
    write: Callable[[Found], str]
    #: It names the flight recorder's findings: node 0 writes it again with every part's.
    findings: bool = False


# --------------------------------------------------------------------------- the writers


def _gloo() -> str:
    return 'use gloo (`backend: gloo` in the spec, or init_process_group("gloo") in the script)'


def _no_nccl(f: Found) -> str:
    if "only supported with GPUs" in f.match.group(0):
        return f"NCCL needs GPUs and this part has none: give the run GPUs (`gpus:`), or {_gloo()}"
    return (
        f"the torch in {f.python} is built without NCCL (a CPU build): {_gloo()}, or install"
        " a CUDA build of torch there to run on GPUs"
    )


def _cpu_torch(f: Found) -> str:
    cuda = f.facts.cuda_version
    if cuda:
        fix = f"install a CUDA build of torch there (for CUDA {cuda} or older: this node's driver)"
    elif f.facts.recommendation is not None:  # the node has GPUs
        fix = "install a CUDA build of torch there"
    else:
        fix = "run it on a GPU node with a CUDA build of torch"
    return (
        f"the torch in {f.python} is a CPU build and the script uses CUDA: {fix}, or run the"
        ' script on CPU (device "cpu", backend gloo)'
    )


def _cuda_driver(f: Found) -> str:
    if "Found no NVIDIA driver" in f.match.group(0):
        return "torch finds no NVIDIA driver on this node: install the driver, or run on CPU"
    cuda = f.facts.cuda_version
    driver = f"this node's driver supports CUDA {cuda} at most" if cuda else "the driver is older"
    return (
        f"the torch in {f.python} is built for a newer CUDA than the driver runs ({driver}):"
        " install a torch built for that CUDA or older, or update the driver"
    )


def _cuda_oom(f: Found) -> str:
    rec = f.facts.recommendation
    known = [f"this run asks for {f.facts.batch_per_gpu}"] if f.facts.batch_per_gpu else []
    if rec is not None and rec.gpus:
        known.append(
            f"`gpuctl hw` recommends {rec.batch_size_per_gpu} for this node's"
            f" {rec.memory_class} GPUs"
        )
    else:
        known.append("`gpuctl hw` recommends one for the node's GPUs")
    return (
        f"a rank ran out of GPU memory: lower the batch per GPU ({'; '.join(known)}) and keep"
        " the effective batch with gradient accumulation, or turn on gradient checkpointing"
        " (`training.gradient_checkpointing: true`, or the script's own flag)"
    )


def _host_oom(f: Found) -> str:
    rec = f.facts.recommendation
    workers = (
        f" (`gpuctl hw` recommends {rec.dataloader_workers_per_gpu} per GPU)"
        if rec is not None
        else ""
    )
    return (
        f"host memory ran out, not GPU memory: use fewer dataloader workers{workers} or a"
        " smaller batch, or give the job more memory (its container's or Slurm's limit)"
    )


def _nccl_timeout(f: Found) -> str:
    findings = f.cause.flight_recorder
    found = (
        f"; the flight recorder found: {findings[0]}"
        if findings
        else "; the flight recorder found nothing (keep `nccl.flight_recorder` on)"
    )
    return (
        f"a collective waited past its timeout, so a rank was stuck or gone{found}; to see"
        " where NCCL waited, rerun with `nccl.debug: INFO` (NCCL_DEBUG=INFO)"
    )


def _nccl_error(f: Found) -> str:
    return (
        "NCCL failed: rerun with `nccl.debug: INFO` (NCCL_DEBUG=INFO) to see where; a system"
        " or remote error is most often the network (`nccl.socket_ifname`) or a peer that"
        " died first (look at the other ranks)"
    )


def _address_in_use(f: Found) -> str:
    found = f.group(r"port:? (\d+)")
    port = int(found) if found else None
    ours = f.facts.master_port
    if port is not None and ours is not None and port != ours:
        return (
            f"port {port} is held by another process, and the script binds it instead of the"
            f" MASTER_PORT gpud leased for this attempt ({ours}): let the script take"
            " MASTER_PORT from its environment rather than set its own"
        )
    if port is not None and port == ours:
        return (
            f"another process took MASTER_PORT {port} between gpud's lease and the bind: a"
            " restart leases another one (network is in the default restart.on)"
        )
    which = (
        f"port {port}, which the script binds," if port is not None else "a port the script binds"
    )
    names = f"`ss -ltnp | grep :{port}`" if port is not None else "`ss -ltnp`"
    return (
        f"{which} is held by another process ({names} names it): bind another, or for"
        " the rendezvous take MASTER_PORT from the environment (torchrun and gpud set it)"
    )


def _module_missing(f: Found) -> str:
    own = (
        " (the spec sets no `python:`, so gpud ran the script with its own interpreter)"
        if f.facts.python_is_gpuds
        else ""
    )
    venv = "set the spec's `python:` to the interpreter of the venv that has it"
    missing = f.group(r"No module named '([^']+)'")
    if missing is not None:
        top = missing.split(".")[0]
        return f"{f.python} has no module '{top}'{own}: install it into that environment, or {venv}"
    name = re.search(r"cannot import name '([^']+)' from '([^']+)'", f.match.string)
    if name is not None:
        return (
            f"{f.python} has a version of {name[2]} without '{name[1]}'{own}: install the"
            f" version the script was written for, or {venv}"
        )
    return f"{f.python} could not import a module the script needs{own}: {venv}"


def _path(f: Found, raw: str) -> str:
    workdir = f.facts.workdir
    if workdir and not os.path.isabs(raw):
        return f"{raw} (in the workdir {workdir})"
    return raw


def _disk_full(f: Found) -> str:
    """The state dir (gpud's own: run output, records, and checkpoints where checkpoint.dir
    is unset) and the checkpoint dir call for different cures; a disk named by neither
    message is taken for the checkpoint dir's, when the spec sets one."""
    state = f.group(r"the state dir (\S+) is full")
    if state is not None:
        return (
            f"the disk of the state dir {state} is full: free space there (`df -h {state}`;"
            f" each run's output, and its checkpoints where checkpoint.dir is unset, are under"
            f" {state}/runs); then `gpuctl resume RUN` (a restart alone would fill it again)"
        )
    saved = f.group(r"no space left on (\S+?) \(checkpoint step")  # CheckpointSpaceError
    where = saved or f.facts.checkpoint_dir
    disk = "the disk it wrote to"
    if where:
        disk = f"the disk of the checkpoint dir {where}" if saved else f"the disk of {where}"
    return (
        f"{disk} is full: free space there (`df -h {where or '.'}`; old checkpoints:"
        " checkpoint.keep_last), or point checkpoint.dir at a disk with room; then"
        " `gpuctl resume RUN` (a restart alone would fill it again)"
    )


def _file_missing(f: Found) -> str:
    parent = f.group(r"Parent directory (.+?) does not exist")
    if parent is not None:
        return (
            f"torch.save's directory {parent} does not exist: have the script create it"
            " (os.makedirs(..., exist_ok=True)) or save elsewhere; a restart will not make it"
        )
    path = f.group(r"No such file or directory: '([^']+)'") or f.group(r"can't open file '([^']+)'")
    what = _path(f, path) if path else "a file the script opens"
    return (
        f"{what} does not exist: check the path, and that whatever writes it ran first (a"
        " resume can name its checkpoint: `gpuctl resume RUN --from PATH`); a restart will not"
        " make it"
    )


def _no_permission(f: Found) -> str:
    path = f.group(r"(?:Permission denied|Operation not permitted): '([^']+)'")
    if path is not None:
        what = _path(f, path)
    elif f.facts.checkpoint_dir:
        what = (
            "where it saves (torch.save names no path; the checkpoint dir is"
            f" {f.facts.checkpoint_dir})"
        )
    else:
        what = "where it saves (torch.save names no path: look at its out dir)"
    return (
        f"the script may not write {what}: make the dir writable for the user gpud runs it"
        " as (a read-only mount or an immutable file stops root too), or save elsewhere"
    )


def _segfault(f: Found) -> str:
    return (
        f"a rank crashed in native code (SIGSEGV), most often a C extension built against"
        f" another torch, CUDA or numpy than {f.python} has: reinstall it there without the"
        " pip cache; `env: {PYTHONFAULTHANDLER: '1'}` in the spec prints the Python line"
    )


def _device_assert(f: Found) -> str:
    return (
        "a CUDA kernel's assert failed, most often an index out of range (a label ≥ the"
        " number of classes, a token id ≥ the vocabulary); CUDA reports it late, so rerun with"
        " `env: {CUDA_LAUNCH_BLOCKING: '1'}` for the right line, or on CPU for an IndexError"
    )


# --------------------------------------------------------------------------- the table

#: Causes found another way than by a log line: a signal, the kernel's OOM killer.
HOST_OOM = FailurePattern(CauseKind.OOM, re.compile(r"OOM killer"), "host memory ran out")
SEGFAULT = FailurePattern(
    CauseKind.SIGNAL, re.compile(r"\bSIGSEGV\b|Segmentation fault"), "a crash in native code"
)
NCCL_TIMEOUT = FailurePattern(CauseKind.NCCL, COLLECTIVE_TIMEOUT, "a collective timed out")

#: The first row of the cause's class whose pattern its summary (else one of its lines)
#: matches writes the hint. The README's hints table lists the same rows.
HINTS: tuple[Hint, ...] = (
    Hint("disk-full", DISK_FULL, _disk_full),
    Hint("no-nccl", NO_NCCL, _no_nccl),
    Hint("cpu-torch", CPU_TORCH, _cpu_torch),
    Hint("cuda-driver", CUDA_DRIVER, _cuda_driver),
    Hint("cuda-oom", CUDA_OOM, _cuda_oom),
    Hint("host-oom", HOST_OOM, _host_oom),
    Hint("nccl-timeout", NCCL_TIMEOUT, _nccl_timeout, findings=True),
    Hint("nccl-error", NCCL_ERROR, _nccl_error),
    Hint("address-in-use", ADDRESS_IN_USE, _address_in_use),
    Hint("module-missing", MODULE_MISSING, _module_missing),
    Hint("device-assert", DEVICE_ASSERT, _device_assert),
    Hint("file-missing", FILE_MISSING, _file_missing),
    Hint("no-permission", NO_PERMISSION, _no_permission),
    Hint("segfault", SEGFAULT, _segfault),
)


def matching(cause: FailureCause) -> tuple[Hint, re.Match[str]] | None:
    """The row that applies to the cause, and where its pattern matched."""
    texts = [cause.summary, *reversed(cause.lines)]
    for hint in HINTS:
        if hint.signature.kind is not cause.kind:
            continue
        for text in texts:
            match = hint.signature.pattern.search(split_rank(text)[1])
            if match is not None:
                return hint, match
    return None


def hint_for(cause: FailureCause, facts: HintFacts = NO_FACTS) -> str | None:
    """What to do about the cause, in one line; None for a failure with no known signature."""
    found = matching(cause)
    if found is None:
        return None
    hint, match = found
    return hint.write(Found(match, cause, facts))


def with_hint(cause: FailureCause, facts: HintFacts = NO_FACTS) -> FailureCause:
    """The cause with its hint, written from what its node knows."""
    return cause.model_copy(update={"hint": hint_for(cause, facts)})


def for_run(cause: FailureCause) -> FailureCause:
    """The run's cause as node 0 settles it: a hint its node did not write (an older peer,
    the gang's own causes), and a hint that names the flight recorder's findings written
    again with every part's."""
    found = matching(cause)
    if found is None or (cause.hint is not None and not found[0].findings):
        return cause
    hint, match = found
    return cause.model_copy(update={"hint": hint.write(Found(match, cause, NO_FACTS))})
