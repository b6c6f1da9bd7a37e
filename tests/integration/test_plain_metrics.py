"""A plain script's metrics where no daemon reads its output (issue 24 §6): the spec's
patterns applied by node 0's part runner — `gpud attach --metrics` with no daemon on the
box, and a two-node torchrun under a real local Slurm — written to the run dir's
metrics.jsonl and read back by `gpuctl metrics` and `ps`. Rank 1 prints lines the
pattern would match: only rank 0's count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemons import gpuctl
from tests.support.slurm import LocalSlurm
from tests.support.slurm_runs import ps, run_dir, submit, wait_until

pytestmark = pytest.mark.slow

PATTERN = r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)"
#: nanoGPT's shape: rank 0 logs `iter N: loss X`; here rank 1 logs decoys.
PRINTER = """
import os, time
rank = int(os.environ.get("RANK", "0"))
for i in range(20):
    if rank == 0:
        print(f"iter {i}: loss {2.0 - i / 20:.4f}, time 12.00ms", flush=True)
    else:
        print(f"iter {900 + i}: loss 99.0", flush=True)
    time.sleep(0.05)
"""


def test_gpud_attach_without_a_daemon_writes_the_patterns_metrics(tmp_path: Path) -> None:
    (tmp_path / "printer.py").write_text(PRINTER)
    env = {**os.environ, "GPUD_ATTACH": str(tmp_path / "no-daemon-here")}
    for name in ("GPUD_RUN_ID", "GPUD_INGEST", "RANK"):
        env.pop(name, None)
    runs = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-m", "gpud", "attach", "--run-id", "plain-1", "--run-dir",
         str(runs), "--metrics", PATTERN, "--", sys.executable, "printer.py"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "metrics go to metrics.jsonl only" in done.stderr
    rows = [json.loads(line) for line in (runs / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(20))
    assert rows[-1]["values"] == {"loss": 1.05} and {r["attempt"] for r in rows} == {1}
    assert {r["run"] for r in rows} == {"plain-1"}


def test_gpud_attach_refuses_a_pattern_re2_cannot_run_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpud", "attach", "--metrics", r"loss (?P<loss>\d+)(?=ms)",
         "--", "true"],
        cwd=tmp_path, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "--metrics" in line and "not supported by RE2" in line


def test_a_plain_script_on_slurm_has_its_metrics_in_gpuctl(
    cluster: LocalSlurm, tmp_path: Path
) -> None:
    (tmp_path / "printer.py").write_text(PRINTER)
    spec = tmp_path / "plain.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "plain",
                "launcher": "torchrun",
                "nproc_per_node": 1,
                "backend": "gloo",
                "workdir": str(tmp_path),
                "script": "printer.py",
                "metrics": [{"pattern": PATTERN}],
                "slurm": {"nodes": 2, "time": "00:05:00"},
            }
        )
    )
    run_id, _ = submit(spec)
    row = wait_until(run_id, lambda r: r["state"] in {"succeeded", "failed"}, timeout=120)
    assert row["state"] == "succeeded", row
    assert row["last_step"] == 19 and row["last_values"] == {"loss": 1.05}, row
    metrics = gpuctl("--json", "metrics", run_id)
    assert metrics.returncode == 0, metrics.stderr
    rows = json.loads(metrics.stdout)["rows"]
    assert [r["step"] for r in rows] == list(range(20))  # rank 1's decoys are not there
    assert all(r["values"]["loss"] < 3 for r in rows)
    table = gpuctl("metrics", run_id).stdout
    assert "LOSS" in table and "1.05" in table
    assert (run_dir(tmp_path, run_id) / "metrics.jsonl").exists()
    row = ps(run_id)
    assert row["attempt"] == 1 and row["nproc"] == 1  # `ps` said 2x? for the shape
    shape = next(line for line in gpuctl("ps").stdout.splitlines() if run_id in line)
    assert " 2x1 " in shape and "?" not in shape, shape
