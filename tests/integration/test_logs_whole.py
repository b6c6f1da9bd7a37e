"""`gpuctl logs` prints every line the daemon kept, in order, to the last (issue 33 §2): a
log of many 256 kB chunks, read whole, from its last N lines, one rank's, and followed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import force_stop, launch, wait_for

pytestmark = pytest.mark.slow

#: Lines per rank: about 2.2 MB of log for two ranks, nine of the daemon's 256 kB chunks.
LINES = 30_000
#: Each rank prints its lines once the file `go` exists, then its last line, and ends.
PRINTER = """
import os, sys, time
rank = os.environ.get("RANK", "0")
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
out = sys.stdout
for k in range(int(sys.argv[2])):
    out.write(f"rank {rank} line {k:06d} of the run\\n")
out.write(f"rank {rank} the last line\\n")
out.flush()
"""


def expected(rank: int) -> list[str]:
    return [f"rank {rank} line {k:06d} of the run" for k in range(LINES)] + [
        f"rank {rank} the last line"
    ]


def of_rank(lines: list[str], rank: int) -> list[str]:
    """Rank `rank`'s lines without torchrun's prefix, in the order shown."""
    prefix = f"[default{rank}]:"
    return [line[len(prefix) :] for line in lines if line.startswith(prefix)]


def test_logs_prints_a_log_of_many_chunks_whole_from_the_tail_by_rank_and_followed(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    (tmp_path / "printer.py").write_text(PRINTER)
    spec = tmp_path / "printer.yaml"
    spec.write_text(
        f"name: printer\nlauncher: torchrun\nnproc_per_node: 2\nbackend: gloo\n"
        f"workdir: {tmp_path}\nscript: printer.py\nargs: [{str(go)!r}, '{LINES}']\n"
    )
    run_id = launch(daemon, config=spec)
    try:
        wait_for(daemon, run_id, {"running"}, timeout=60)
        follower = subprocess.Popen(
            [sys.executable, "-m", "launch.gpuctl", "--node", daemon.address, "logs", "-f",
             run_id],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert follower.stdout is not None
        assert follower.stdout.readline()  # the follower reads; now the ranks print
        go.touch()
        done = wait_for(daemon, run_id, {"succeeded", "failed"}, timeout=120)
        assert done.run.state.value == "succeeded", done.run.reason
        followed, errors = follower.communicate(timeout=60)
        assert follower.returncode == 0, errors

        whole = gpuctl("--node", daemon.address, "logs", run_id)
        assert whole.returncode == 0, whole.stderr
        shown = whole.stdout.splitlines()
        assert len(whole.stdout) > 8 * 256 * 1024
        for rank in (0, 1):
            assert of_rank(shown, rank) == expected(rank)
            assert of_rank(followed.splitlines(), rank) == expected(rank)

        last = gpuctl("--node", daemon.address, "logs", run_id, "--tail", "300").stdout
        assert last.splitlines() == shown[-300:]
        far = gpuctl("--node", daemon.address, "logs", run_id, "--tail", "20000").stdout
        assert far.splitlines() == shown[-20_000:]  # 20,000 lines: about 3 chunks

        one = gpuctl("--node", daemon.address, "logs", run_id, "--rank", "1").stdout
        assert one.splitlines() == [f"[default1]:{line}" for line in expected(1)]
        its_last = gpuctl("--node", daemon.address, "logs", run_id, "--rank", "1",
                          "--tail", "12000").stdout  # fmt: skip
        assert its_last.splitlines() == [f"[default1]:{line}" for line in expected(1)[-12_000:]]
    finally:
        force_stop(daemon, run_id)
