"""Uncaught exceptions, recorded the way torch's `@record` records them.

torchrun gives every worker a `TORCHELASTIC_ERROR_FILE`; a single process or DeepSpeed's
launcher does not, so gpud names a directory (`GPUD_ERROR_DIR`) and each rank writes
`rank-<RANK>.json` there. The format is torch's own (`ErrorHandler.record_exception`), so
torchrun's summary and gpud read the same files. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from types import TracebackType


def error_file(env: Mapping[str, str], rank: int) -> str | None:
    """Where this rank records its exception: torch's variable, else gpud's directory."""
    path = env.get("TORCHELASTIC_ERROR_FILE")
    if path:
        return path
    directory = env.get("GPUD_ERROR_DIR")
    return os.path.join(directory, f"rank-{rank}.json") if directory else None


def record(path: str, exc: BaseException, step: int | None = None) -> None:
    """Write `exc` as torch's error file does, plus the last step this rank logged (gpud's
    addition); never raises (we are already failing)."""
    extra: dict[str, object] = {
        "py_callstack": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "timestamp": str(int(time.time())),
    }
    if step is not None:
        extra["gpud_step"] = step
    data = {"message": {"message": f"{type(exc).__name__}: {exc}", "extraInfo": extra}}
    # Whole or not at all: torchrun's agent reads the file and dies on a torn one (a full
    # disk), where it would report the rank's exit code without one.
    tmp = f"{path}.tmp"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def install(path: str, step: Callable[[], int | None] = lambda: None) -> None:
    """Record uncaught exceptions of the main thread in `path`, then report them as usual."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not issubclass(kind, (KeyboardInterrupt, SystemExit)):
            record(path, exc, step())
        previous(kind, exc, tb)

    sys.excepthook = hook
