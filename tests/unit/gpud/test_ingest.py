"""The ingest socket and a trainers library of another release (real zmq, ipc).

A rank whose library is a release ahead sends fields and kinds this daemon does not know:
its known messages are still taken (unknown fields ignored), a message of an unknown kind
is skipped and counted, and garbage is still refused.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import zmq
import zmq.asyncio

from gpud.model.trainer_messages import HeartbeatMessage, TrainerMessage
from gpud.wire.ingest import Ingest

BEAT = {
    "run": "r-1", "attempt": 1, "time": 1.0, "rank": 0, "local_rank": 0, "world_size": 2,
    "step": 4, "phase_since": 1.0, "host": "h", "pid": 1,
}  # fmt: skip


def test_a_newer_librarys_messages_are_taken_and_its_new_kinds_skipped_and_counted(
    tmp_path: Path,
) -> None:
    got: list[tuple[str, TrainerMessage]] = []

    async def scenario() -> Ingest:
        ctx = zmq.asyncio.Context()
        ingest = Ingest(
            ctx,
            f"ipc://{tmp_path}/ingest",
            f"ipc://{tmp_path}/control",
            lambda kind, message: got.append((kind, message)),
        )
        serving = asyncio.create_task(ingest.serve())
        push: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
        push.linger = 0
        push.connect(f"ipc://{tmp_path}/ingest")
        later = {**BEAT, "gpu_temp_c": 71, "phase": "compute"}
        for frames in (
            [b"heartbeat", json.dumps(later).encode()],
            [b"energy", json.dumps({"run": "r-1", "attempt": 1, "time": 1.0}).encode()],
            [b"energy", b"{}"],
            [b"heartbeat", json.dumps({**BEAT, "step": "four"}).encode()],
            [b"heartbeat", json.dumps({**BEAT, "step": 5}).encode()],
        ):
            push.send_multipart(frames)
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        push.close()
        serving.cancel()
        ingest.close()
        ctx.term()
        return ingest

    ingest = asyncio.run(scenario())
    assert [(kind, m.step) for kind, m in got if isinstance(m, HeartbeatMessage)] == [
        ("heartbeat", 4),
        ("heartbeat", 5),
    ]
    assert ingest.skipped == {"energy": 2}
    assert ingest.rejected == 1  # "four" is not a step: still refused
    assert ingest.received == 2
