"""Which checkpoint a new attempt of a run starts from: only ever a whole one the run wrote.

A checkpoint counts for a run when its trainer reported it, or when it matches
`resume.pattern` and was written after the run was created (its mtime). A shared
`out_dir` often holds an earlier run's `ckpt.pt`; resuming from that would jump to the
other run's step and report success with nothing trained. `gpuctl resume --from PATH`
names one explicitly, whoever wrote it. A checkpoint that is not whole (a save a full
disk cut short: `gpud.checkpoints.whole`) is passed over, saying so, for the next older.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpud.checkpoints.whole import broken
from gpud.model.run import RunRecord
from gpud.wire.envelope import ErrorCode, ProtocolError
from launch.spec import RunSpec


@dataclass(frozen=True)
class ResumePoint:
    """Where the next attempt starts: a checkpoint (with its step when known), or scratch."""

    path: str | None
    step: int | None = None
    #: Why there is none, or what was passed over; one line for the events.
    note: str | None = None

    def describe(self) -> str:
        if self.path is None:
            return "from scratch" + (f": {self.note}" if self.note else "")
        step = f" (step {self.step})" if self.step is not None else ""
        return f"from {self.path}{step}" + (f"; {self.note}" if self.note else "")


def _mtime(path: str) -> float | None:
    try:
        return os.path.getmtime(path)
    except OSError:
        return None


#: `resume.pattern` is the user's glob, matched where the daemon runs: a pattern such as
#: `*/*/*/*` over a large shared filesystem must not hold the daemon for minutes.
MAX_MATCHES = 10_000
SEARCH_BUDGET_S = 2.0


def newest_checkpoint(
    pattern: str,
    checkpoint_dir: str,
    created_at: float,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[str | None, str | None]:
    """The newest match of `pattern` (relative to `checkpoint_dir`) written since the run
    was created, and a note on older matches passed over (another run's, most likely).
    It looks at MAX_MATCHES matches for SEARCH_BUDGET_S at most, and says so when cut."""
    if not os.path.isabs(pattern):
        pattern = os.path.join(checkpoint_dir, pattern)
    deadline = clock() + SEARCH_BUDGET_S
    candidates: list[str] = []
    cut = None
    for path in glob.iglob(pattern):
        if len(candidates) >= MAX_MATCHES or clock() > deadline:
            cut = (
                f"looked at the first {len(candidates)} matches of {pattern} only"
                " (resume.pattern matches too much: narrow it)"
            )
            break
        if not os.path.basename(path).startswith("."):
            candidates.append(path)
    dated = [(when, p) for p in candidates if (when := _mtime(p)) is not None]
    ours = sorted(((when, p) for when, p in dated if when >= created_at), reverse=True)
    older = len(dated) - len(ours)
    passed_over = (
        f"passed over {older} older match(es) of {pattern} written before the run was created"
        if older
        else None
    )
    chosen, not_whole = _newest_whole(p for _, p in ours)
    notes = "; ".join(n for n in (*not_whole, passed_over, cut) if n) or None
    return chosen, notes


def _newest_whole(newest_first: Iterable[str]) -> tuple[str | None, list[str]]:
    """The first whole checkpoint, and a note for each one passed over before it."""
    notes: list[str] = []
    for path in newest_first:
        why = broken(path)
        if why is None:
            return path, notes
        notes.append(f"passed over {path}: {why}")
    return None, notes


def unset_dir_warning(spec: RunSpec, checkpoint_dir: str, *, looked: bool = False) -> str | None:
    """The one line that says a spec asks for resumes that cannot find a checkpoint: with
    `resume.args` but no `checkpoint.dir`, gpud looks in its own run dir, where a script
    that saves into its own out_dir (nanoGPT's) never writes. None when that is not so
    (the trainer reports its checkpoints, or `resume.pattern` is absolute)."""
    if not spec.resume.args or spec.checkpoint.dir is not None:
        return None
    if spec.resume.latest == "reported" or os.path.isabs(spec.resume.pattern):
        return None
    return (
        f"resume.args is set but checkpoint.dir is not: gpud {'looked' if looked else 'will look'}"
        f" in {checkpoint_dir}; set checkpoint.dir to where the script writes its checkpoints"
    )


def find_checkpoint(run: RunRecord, spec: RunSpec) -> ResumePoint:
    """The checkpoint a new attempt starts from, as `resume.latest` says to find it
    (`spec`: the run's, as `RunBook.spec` keeps it)."""
    how = spec.resume.latest
    reported = run.last_checkpoint
    not_whole = None
    if how in ("reported", "auto") and reported and os.path.exists(reported.path):
        why = broken(reported.path)
        if why is None:
            return ResumePoint(reported.path, reported.step)
        not_whole = f"passed over {reported.path}: {why}"
    if how == "reported":
        return ResumePoint(None, note=not_whole or "the trainer reported no checkpoint")
    path, passed_over = newest_checkpoint(spec.resume.pattern, run.checkpoint_dir, run.created_at)
    if path is not None:
        step = reported.step if reported and reported.path == path else None
        note = "; ".join(n for n in (not_whole, passed_over) if n) or None
        return ResumePoint(path, step, note)
    notes = [
        "no checkpoint of this run",
        not_whole,
        passed_over,
        unset_dir_warning(spec, run.checkpoint_dir, looked=True),
    ]
    return ResumePoint(None, note="; ".join(n for n in notes if n))


def explicit_checkpoint(path: str) -> ResumePoint:
    """`gpuctl resume --from PATH`: that one, if it is there."""
    if not os.path.isabs(path):
        raise ValueError(f"--from {path}: give an absolute path (it is read on the nodes)")
    if not os.path.exists(path):
        raise ValueError(f"--from {path}: no such file or directory on node 0")
    why = broken(path)
    if why is not None:
        raise ValueError(f"--from {path}: not a whole checkpoint ({why}); name another")
    return ResumePoint(path, note="chosen with --from")


def resume_point(run: RunRecord, spec: RunSpec, fresh: bool) -> ResumePoint:
    if fresh:
        return ResumePoint(None)
    if run.resume_next is not None:
        return ResumePoint(run.resume_next, note="chosen with --from")
    point = find_checkpoint(run, spec)
    if point.path is None and spec.resume.require_checkpoint:
        raise ProtocolError(
            ErrorCode.CONFLICT,
            f"run {run.id} has no checkpoint to resume from ({point.note}) and its spec sets"
            f" resume.require_checkpoint; name one: gpuctl resume {run.id} --from PATH",
        )
    return point
