"""Reading a failed attempt's flight-recorder dumps with torch's own analyzer.

The analyzer needs torch, which the daemon never imports: it runs in a subprocess
(`gpud.runs.diagnosis.fr_analyze`) under the daemon's interpreter, off the event loop, and its one
JSON line becomes findings such as "collective #812 (all_reduce) never entered by rank 3".
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: Where the ranks' dumps are (torch's TORCH_FR_DUMP_TEMP_FILE prefix, set by gpud).
PREFIX = "nccl_trace_rank_"
#: The analyzer imports torch: seconds on a cold start.
TIMEOUT_S = 120.0


def dumps(attempt_dir: Path) -> list[Path]:
    return sorted(p for p in attempt_dir.glob(PREFIX + "*") if p.name[len(PREFIX) :].isdigit())


def analyze(attempt_dir: Path, timeout_s: float = TIMEOUT_S) -> list[str]:
    """What torch's analyzer finds in the attempt's dumps ([] without dumps); a failure of
    the analyzer itself is one finding that says so."""
    if not dumps(attempt_dir):
        return []
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpud.runs.diagnosis.fr_analyze", str(attempt_dir), PREFIX],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"the flight-recorder analysis did not finish: {exc}"]
    for line in reversed(done.stdout.splitlines()):
        try:
            reply = json.loads(line)
        except ValueError:
            continue
        if isinstance(reply, dict) and isinstance(reply.get("findings"), list):
            return [str(f) for f in reply["findings"]][:20]
        if isinstance(reply, dict) and "error" in reply:
            return [f"the flight-recorder analysis failed: {reply['error']}"]
    return [f"the flight-recorder analysis said nothing (exit {done.returncode})"]
