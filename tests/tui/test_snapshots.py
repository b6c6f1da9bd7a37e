"""SVG snapshots of every screen at fixed terminal sizes, from a hand-made model with a
fixed clock (no daemons): they change only when the UI does.

After an intended change: `pytest tests/tui/test_snapshots.py --snapshot-update`, then look
at the SVGs in tests/tui/__snapshots__/ before committing them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.tui import scenes
from tui.app import GpuTop

RUN = "pretrain-7b-3f9a2c"
Compare = Callable[..., bool]


def app(**kwargs: Any) -> GpuTop:
    # A long refresh interval: the screens draw once when shown, the clock never moves.
    return GpuTop(scenes.fleet(), refresh_s=3600, **kwargs)


def test_fleet(snap_compare: Compare) -> None:
    assert snap_compare(app(), terminal_size=(100, 24))


def test_fleet_at_the_minimum_size(snap_compare: Compare) -> None:
    assert snap_compare(app(), terminal_size=(80, 24))


def test_node(snap_compare: Compare) -> None:
    assert snap_compare(app(), press=["down", "enter"], terminal_size=(100, 36))


def test_runs(snap_compare: Compare) -> None:
    assert snap_compare(app(), press=["colon", *"runs", "enter"], terminal_size=(80, 24))


def test_run(snap_compare: Compare) -> None:
    assert snap_compare(app(start_run=RUN), terminal_size=(120, 40))


def test_run_at_the_minimum_size(snap_compare: Compare) -> None:
    assert snap_compare(app(start_run=RUN), terminal_size=(80, 24))


def test_logs(snap_compare: Compare) -> None:
    assert snap_compare(app(start_run=RUN), press=["l"], terminal_size=(100, 24))


def test_stop_confirmation(snap_compare: Compare) -> None:
    assert snap_compare(app(start_run=RUN), press=["s"], terminal_size=(100, 24))


def test_help_read_only(snap_compare: Compare) -> None:
    assert snap_compare(app(start_run=RUN, readonly=True), press=["?"], terminal_size=(100, 30))
