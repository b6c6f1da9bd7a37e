"""Run a launcher module as `python -m` would, then leave without the interpreter's teardown.

    python gpud_launch.py torch.distributed.run --nnodes=2 ... train.py --lr 3e-4

gpud starts torchrun, DeepSpeed's runner and `accelerate launch` through this file (the
daemon writes its source into the attempt directory as `gpud_launch.py`, since the run's
Python need not have gpud installed): once the launcher is done, its ranks gone and its
error summary printed, a plain `python -m` still spends a second of CPU freeing torch
before it exits, and every failure, stop and restart of a run waited for that second on
each node. Here the launcher's exit status is kept, its output flushed, and the process
ends at once. Only the launcher's own process leaves this way; the ranks are the user's
processes and end as their script says.

Standard library only: it runs in the run's interpreter.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import traceback
from functools import cache
from pathlib import Path

#: The name the daemon writes this file under, in the attempt directory.
FILE_NAME = "gpud_launch.py"


@cache
def source() -> str:
    """This file's text, as the daemon writes it into an attempt directory."""
    return Path(__file__).read_text()


def _status(code: object) -> int:
    """The exit status `python` gives a `SystemExit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _flush() -> None:
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()  # what atexit would have done: flush and close its handlers
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def main() -> None:
    if len(sys.argv) < 2:
        print(f"usage: python {FILE_NAME} MODULE [ARGS...]", file=sys.stderr)
        os._exit(2)
    module = sys.argv.pop(1)
    sys.path[0] = os.getcwd()  # as `python -m` has it (not this file's directory)
    status = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        status = _status(stop.code)
    except KeyboardInterrupt:  # as Python does: the traceback, then die by SIGINT
        traceback.print_exc()
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        status = 130
    except BaseException:  # as Python does: the traceback, then status 1
        traceback.print_exc()
        status = 1
    _flush()
    os._exit(status)


if __name__ == "__main__":
    main()
