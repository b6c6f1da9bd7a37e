"""How long a hung run takes to train again: from the start of the stall to the first step
of the new attempt, with `restart.hang_timeout_s` (issue 10).

Starts a real `gpud serve` and a 2-rank gloo run of the DDP example whose rank 1 stops
making progress after step 30 (the trainers' test hook, first attempt only). gpud's
health calls it stalled, the hang timeout runs out, gpud asks every rank for a
flight-recorder dump, stops the gang and restarts it from step 29's checkpoint. The times
come from the run's own records: the last metric of attempt 1 (the stall starts right
after it), the `hang` event, the new attempt's start, and its first metric.

Each timeout is measured in turn, side by side; the overhead column is what gpud adds on
top of the timeout the user chose (health's stall threshold, the dump, the stop, the
restart backoff and the new attempt's start-up).

    .venv/bin/python bench/hang_recovery.py [--timeouts 5 10] [--backoff 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpud.wire.client import Client, NodeTarget  # noqa: E402
from gpud.wire.protocol import RUN_METRICS, RUN_STATUS  # noqa: E402
from gpud.wire.run_messages import MetricsRequest, RunRef, RunStatus  # noqa: E402
from tests.support.daemons import gpuctl, start_daemon  # noqa: E402

HANG_AT = 30


def _status(target: NodeTarget, run_id: str) -> RunStatus:
    with Client(target, timeout_s=10) as client:
        reply = client.call(RUN_STATUS, RunRef(run=run_id))
    assert isinstance(reply, RunStatus)
    return reply


def one(timeout_s: float, backoff_s: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="gpud-hang-") as tmp:
        daemon = start_daemon(Path(tmp))
        try:
            args = ["--node", daemon.address, "--json", "launch"]
            args += [str(ROOT / "config/examples/cpu-ddp.yaml")]
            for setting in (
                "args=[--width, '128', --depth, '2', --log-every, '5']",
                "training.max_steps=100000",
                "checkpoint.every_steps=10",
                f"env={{GPUD_TEST_HANG_RANK: '1', GPUD_TEST_HANG_AT_STEP: '{HANG_AT}',"
                " GPUD_TEST_ONLY_ATTEMPTS: '1'}",
                "restart.max_attempts=1",
                f"restart.backoff_s={backoff_s}",
                f"restart.hang_timeout_s={timeout_s}",
            ):
                args += ["--set", setting]
            launched = gpuctl(*args)
            assert launched.returncode == 0, launched.stderr
            run_id = json.loads(launched.stdout)["run"]["id"]
            deadline = time.monotonic() + 300
            while True:
                with Client(daemon.target(), timeout_s=10) as client:
                    rows = client.call(
                        RUN_METRICS, MetricsRequest(run=run_id, name="loss", attempt=2)
                    ).rows
                if rows:
                    break
                assert time.monotonic() < deadline, "the run never trained again"
                time.sleep(0.2)
            with Client(daemon.target(), timeout_s=10) as client:
                first_rows = client.call(
                    RUN_METRICS, MetricsRequest(run=run_id, name="loss", attempt=1)
                ).rows
            status = _status(daemon.target(), run_id)
            stalled_at = max(r.time for r in first_rows)
            hang = next(e.time for e in status.events if e.kind == "hang")
            started = next(
                e.time for e in status.events if e.kind == "attempt" and "attempt 2" in e.message
            )
            trained = min(r.time for r in rows)
            gpuctl("--node", daemon.address, "stop", run_id, "--force")
            return {
                "detect": hang - stalled_at,
                "stop+backoff": started - hang,
                "start-up": trained - started,
                "total": trained - stalled_at,
            }
        finally:
            daemon.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeouts", type=float, nargs="+", default=[5.0, 10.0])
    parser.add_argument("--backoff", type=float, default=0.5)
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(f"2 gloo ranks on CPU; rank 1 hangs after step {HANG_AT}; backoff {args.backoff:g}s")
    print()
    header = f"{'hang_timeout_s':>14} {'detect':>8} {'stop+backoff':>13} {'start-up':>9}"
    print(header + f" {'total':>8} {'overhead':>9} {'total/timeout':>14}")
    for timeout in args.timeouts:
        t = one(timeout, args.backoff)
        print(
            f"{timeout:>14g} {t['detect']:>7.1f}s {t['stop+backoff']:>12.1f}s"
            f" {t['start-up']:>8.1f}s {t['total']:>7.1f}s {t['total'] - timeout:>8.1f}s"
            f" {t['total'] / timeout:>14.2f}"
        )


if __name__ == "__main__":
    main()
