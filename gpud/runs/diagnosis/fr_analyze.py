"""Run torch's own flight-recorder analyzer over one attempt's dumps; print one JSON line.

    python -m gpud.runs.diagnosis.fr_analyze ATTEMPT_DIR [PREFIX]

Started by the daemon in a subprocess (torch is imported here, never in the daemon). The
dumps are the ones this node's ranks wrote (torch on a collective timeout, the trainers
library when gpud saw a hang); they are pickles, read only from the attempt's own dir.
Prints {"findings": [...]} — e.g. "collective #812 (all_reduce) never entered by rank 3"
— or {"error": "..."}.

gloo in the pinned torch names the default group "" in a dump's pg_config but "0" in its
entries, which the analyzer cannot match; the group is renamed before the analysis.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
from typing import Any

PREFIX = "nccl_trace_rank_"


def _fix_gloo_groups(details: dict[str, dict[str, Any]]) -> None:
    for dump in details.values():
        config = dump.get("pg_config") or {}
        names = {entry["process_group"][0] for entry in dump.get("entries", [])}
        if "" in config and len(names) == 1:
            config[names.pop()] = config.pop("")


def _frame(frames: list[dict[str, Any]]) -> str:
    """The innermost frame outside torch: where the user's code called the collective."""
    for frame in reversed(frames or []):
        if "/torch/" not in frame.get("filename", ""):
            return f" at {frame.get('filename')}:{frame.get('line')}"
    return ""


def findings(trace_dir: str, prefix: str = PREFIX) -> list[str]:
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    args = JobConfig().parse_args([trace_dir, "-p", prefix, "--allow-incomplete-ranks"])
    details, version = read_dir(args)
    _fix_gloo_groups(details)
    logging.disable(logging.CRITICAL)  # the analyzer reports by printing and logging
    with contextlib.redirect_stdout(io.StringIO()):
        db = build_db(details, args, version)
    out = []
    for c in db.collectives:
        name = c.collective_name.split(":")[-1]
        where = _frame(c.collective_frames)
        if c.missing_ranks:
            ranks = ", ".join(map(str, sorted(c.missing_ranks)))
            out.append(
                f"collective #{c.collective_seq_id} ({name}) never entered by rank {ranks}{where}"
            )
        elif c.type_of_mismatch is not None:
            out.append(f"collective #{c.collective_seq_id} ({name}): {c.type_of_mismatch}{where}")
    return out


def main() -> int:
    if len(sys.argv) < 2:
        print(json.dumps({"error": "usage: fr_analyze ATTEMPT_DIR [PREFIX]"}))
        return 2
    try:
        found = findings(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else PREFIX)
    except Exception as exc:  # the analyzer's own failure is a finding of its own
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}))
        return 1
    print(json.dumps({"findings": found}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
