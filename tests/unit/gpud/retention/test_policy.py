"""Which finished runs retention removes, and how its settings are read."""

from __future__ import annotations

import pytest

from gpud.retention.policy import (
    DAY_S,
    FinishedRun,
    RetentionSettings,
    choose,
    parse_bytes,
)
from gpud.settings import SettingsError, build_settings, group_flags

NOW = 1_000 * DAY_S


def runs(*ages_days: float, size: int = 100) -> list[FinishedRun]:
    return [FinishedRun(f"r{i}", NOW - age * DAY_S, size) for i, age in enumerate(ages_days)]


def test_max_runs_removes_the_longest_ended_first() -> None:
    settings = RetentionSettings(max_runs=3, max_age_days=0, max_bytes=0)
    removals, _ = choose(runs(1, 5, 2, 4, 3), settings, NOW)
    assert [r.run_id for r in removals] == ["r1", "r3"]
    assert removals[0].why == "over max_runs 3 (5 finished)"


def test_max_age_counts_from_the_end_and_takes_fractions() -> None:
    settings = RetentionSettings(max_runs=0, max_age_days=0.5, max_bytes=0)
    removals, _ = choose(runs(0.25, 0.75, 3), settings, NOW)
    assert sorted(r.run_id for r in removals) == ["r1", "r2"]
    assert "max_age_days 0.5" in removals[0].why


def test_max_bytes_removes_until_what_is_kept_fits() -> None:
    settings = RetentionSettings(max_runs=0, max_age_days=0, max_bytes=250)
    removals, kept = choose(runs(4, 3, 2, 1), settings, NOW)
    assert [r.run_id for r in removals] == ["r0", "r1"]
    assert kept == 200
    assert "over max_bytes 250 B" in removals[0].why


def test_bounds_add_up_and_zero_turns_one_off() -> None:
    everything = RetentionSettings(max_runs=0, max_age_days=0, max_bytes=0)
    assert choose(runs(500, 400), everything, NOW) == ([], 200)
    both = RetentionSettings(max_runs=2, max_age_days=10, max_bytes=0)
    removals, _ = choose(runs(20, 5, 4, 3), both, NOW)
    assert [r.run_id for r in removals] == ["r0", "r1"]  # r0 by age, then r1 by count


@pytest.mark.parametrize(
    ("text", "value"),
    [("10GiB", 10 * 2**30), ("500M", 500 * 2**20), ("1.5 kb", 1500), ("2048", 2048), (7, 7)],
)
def test_sizes_read_with_units(text: object, value: int) -> None:
    assert parse_bytes(text) == value


def test_defaults_are_documented_values() -> None:
    s = RetentionSettings()
    assert (s.max_runs, s.max_age_days, s.max_bytes, s.node_events, s.full_steps) == (
        1000, 90.0, 10 * 2**30, 100_000, 10_000,
    )  # fmt: skip


def test_flags_go_over_the_config_file_and_typos_are_named() -> None:
    values = group_flags(
        {"retention": {"max_runs": 5, "max_bytes": "1GiB"}, "retention_max_runs": 7,
         "retention_max_age_days": None},
        "retention",
    )  # fmt: skip
    settings = build_settings(values)
    assert settings.retention.max_runs == 7 and settings.retention.max_bytes == 2**30
    with pytest.raises(SettingsError, match=r"retention\.max_run"):
        build_settings({"retention": {"max_run": 5}})
    with pytest.raises(SettingsError, match=r"retention\.max_bytes.*10GiB"):
        build_settings(group_flags({"retention_max_bytes": "ten gigs"}, "retention"))
