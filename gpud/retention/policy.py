"""The `retention:` settings and the choice of which finished runs to remove. Pure.

A finished run goes when it is older than `max_age_days` (since it ended), when more than
`max_runs` finished runs are kept (the longest ended go first), or while the kept runs'
bytes (their run dirs, checkpoints left out, and their share of the database) are over
`max_bytes` (again the longest ended first). What the caller marks protected (an active,
queued or attached run, one with leases, one node 0 still watches) never goes and counts
towards none of the bounds. 0 turns a bound off.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

DAY_S = 86_400.0
GIB = 2**30
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6,
          "mib": 2**20, "g": GIB, "gb": 10**9, "gib": GIB, "t": 2**40, "tb": 10**12,
          "tib": 2**40}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: object) -> int:
    """`10GiB`, `500M`, `1.5TB`, `2048`: a size in bytes (K, M, G, T are powers of 1024)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 10GiB or 500M")
    if isinstance(value, int | float):
        return int(value)
    found = _SIZE.match(str(value))
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _UNITS:
        raise ValueError(f"{value!r}: expected a size such as 10GiB, 500M or 2048")
    return int(float(found.group(1)) * _UNITS[unit])


def show_bytes(n: float) -> str:
    """1536 → '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class RetentionSettings(BaseModel):
    """`retention:` in gpud.yaml, `--retention-*` flags, `GPUD_RETENTION_*` variables."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_runs: int = Field(
        1000, ge=0, description="finished runs kept (records, events, metrics, run dirs);"
        " the longest ended go first; 0: no bound",
    )  # fmt: skip
    max_age_days: float = Field(
        90.0, ge=0.0, description="finished runs older than this (since they ended) go;"
        " fractions allowed; 0: no bound",
    )  # fmt: skip
    max_bytes: int = Field(
        10 * GIB, ge=0, description="bytes of finished runs kept: their run dirs (checkpoints"
        " not counted, never removed) and their share of the database; e.g. 10GiB; 0: no bound",
    )  # fmt: skip
    node_events: int = Field(
        100_000, ge=0, description="node events kept (XIDs, throttling, holds); the oldest go"
        " first; 0: no bound",
    )  # fmt: skip
    full_steps: int = Field(
        10_000, ge=100, description="a finished run's metrics keep every point of its last"
        " this many steps; older points are thinned to each bucket's first, last, min and max",
    )  # fmt: skip
    interval_minutes: float = Field(
        60.0, ge=0.0, description="how often the daemon applies retention on its own (also"
        " 1 minute after it starts); 0: only `gpuctl gc`",
    )  # fmt: skip

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _size(cls, value: object) -> int:
        return parse_bytes(value)

    def describe(self) -> str:
        """The bounds in one line, as `gpuctl gc` and the log show them."""

        def off(value: float, text: str) -> str:
            return text if value else "off"

        return (
            f"max_runs {off(self.max_runs, str(self.max_runs))}, "
            f"max_age_days {off(self.max_age_days, f'{self.max_age_days:g}')}, "
            f"max_bytes {off(self.max_bytes, show_bytes(self.max_bytes))}, "
            f"node_events {off(self.node_events, str(self.node_events))}"
        )


@dataclass(frozen=True)
class FinishedRun:
    """What the choice needs of one finished run."""

    id: str
    ended_at: float
    bytes: int  # its run dir (checkpoints left out) and its share of the database


@dataclass(frozen=True)
class Removal:
    run_id: str
    why: str


def choose(
    runs: list[FinishedRun], settings: RetentionSettings, now: float
) -> tuple[list[Removal], int]:
    """The finished runs to remove (the longest ended first) and the bytes kept after.

    `runs` holds only runs that may go: the caller leaves out what is protected."""
    order = sorted(runs, key=lambda r: (r.ended_at, r.id))
    removals: list[Removal] = []
    kept: list[FinishedRun] = []
    if settings.max_age_days:
        cutoff = now - settings.max_age_days * DAY_S
        for run in order:
            if run.ended_at < cutoff:
                age = (now - run.ended_at) / DAY_S
                removals.append(Removal(run.id, f"ended {age:.1f} days ago"
                                        f" (max_age_days {settings.max_age_days:g})"))  # fmt: skip
            else:
                kept.append(run)
    else:
        kept = list(order)
    if settings.max_runs and len(kept) > settings.max_runs:
        over = len(kept) - settings.max_runs
        removals += [
            Removal(r.id, f"over max_runs {settings.max_runs} ({len(kept)} finished)")
            for r in kept[:over]
        ]
        kept = kept[over:]
    total = sum(r.bytes for r in kept)
    if settings.max_bytes and total > settings.max_bytes:
        before = total
        while kept and total > settings.max_bytes:
            run = kept.pop(0)
            total -= run.bytes
            removals.append(
                Removal(run.id, f"over max_bytes {show_bytes(settings.max_bytes)}"
                        f" ({show_bytes(before)} kept)")
            )  # fmt: skip
    return removals, total
