"""What a run's script says of itself, read where it lives: gpuctl's machine for the launch's
note, node 0 for an elastic attempt's batch, a Slurm node for `metrics: auto`.

A script that cannot be read here (another machine's path, no permission) says nothing:
each caller treats that as "not known to use the library".
"""

from __future__ import annotations

import re
from pathlib import Path

from launch.spec import RunSpec

#: The trainers library, imported: heartbeats, its own metrics, GPUD_GRAD_ACCUM honoured.
USES_LIBRARY = re.compile(r"^\s*(?:from|import)\s+trainers\b", re.M)
#: The most of a script read (a training script is far shorter).
READ_MAX = 1 << 20


def script_text(spec: RunSpec) -> str | None:
    """The first READ_MAX characters of the spec's script (relative to its workdir, else
    the cwd); None for a module run, or a script this machine cannot read."""
    if spec.script is None:
        return None
    try:
        with (Path(spec.workdir or ".") / spec.script).open(errors="replace") as f:
            return f.read(READ_MAX)
    except OSError:
        return None


def uses_library(spec: RunSpec) -> bool:
    """The script imports the trainers library (False where it cannot be read)."""
    text = script_text(spec)
    return text is not None and USES_LIBRARY.search(text) is not None


__all__ = ["READ_MAX", "USES_LIBRARY", "script_text", "uses_library"]
