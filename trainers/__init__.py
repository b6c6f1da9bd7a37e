"""Imported inside training processes: metrics, heartbeats, stop/resume handshake.

Must stay light: pyzmq and the standard library at import time; torch is imported only by
the calls that need it.

    import trainers
    run = trainers.init()
"""

from trainers.env import Hints, RunEnv
from trainers.run import Run, init

__all__ = ["Hints", "Run", "RunEnv", "init"]
