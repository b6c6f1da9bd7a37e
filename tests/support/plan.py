"""How the suite is spread over pytest-xdist's workers (README, Development).

The tests spend most of their time waiting on real processes (a daemon to start, a rank to
train, a node to be called lost), so several run side by side: `-n 4 --dist loadgroup` in
pyproject's addopts. This module is the plan those workers follow:

- **Longest first.** Work goes out longest first, by `tests/durations.json` (the last
  measured seconds of each slow test; `--store-durations` rewrites it), so the last minutes
  are a trickle of short unit tests, not one long fault test started late.
- **Groups stay together.** Tests marked `xdist_group(NAME)` (a module's tests that share
  one daemon or one trained run) go to one worker, in order, as one piece of work; so do
  the tests that start a local Slurm (two at once would clash).
- **Heavy work in two lanes.** A piece of work guessed at HEAVY_S or more starts real
  ranks, daemons and torch processes, and uses most of a core: at most `--heavy-lanes`
  workers (2) take such pieces; the others take the light ones (unit, TUI, short
  integration tests) and finish when those are done. Three heavy tests at once on two
  cores made timing-sensitive ones (a 5 s hang timeout, a 10 s lost node) fail. A long
  test that was measured to cost under LIGHT_CPU_S of CPU (it waits: an idle client for
  100 s, a receiver that times out) is light: it waits beside the heavy ones.
- **Waiting work in a lane of its own.** A heavy piece measured at under WAITING_RATE of
  a core on average (real ranks, but mostly waiting: a local Slurm's jobs, a daemon
  killed and restarted, a disk that fills) takes a waiting lane (`--waiting-lanes`, 1),
  beside the two heavy lanes, instead of holding one of them for minutes.
- **`alone` runs last, by itself.** A test marked `alone` times something against load or
  needs the whole machine: it runs after every other test has finished, on one worker,
  with the others gone. Without xdist (`-p no:xdist`, `-n 0`) those tests still run last.
- **`quiet` ones two at a time.** An `alone` test also marked `quiet` times the control
  plane against an adversary of its own (a slowloris, a failing webhook receiver) but
  adds little load itself (under 0.2 of a core, measured): once every other test has
  finished, the quiet ones run on two workers side by side, then the other `alone` ones
  on one.

The scheduler keeps xdist's contract (xdist/scheduler/protocol.py): a worker runs a test
only once it holds the next one (or is told to shut down), so each keeps two in hand.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cpu_report import CPU_PROPERTY, CpuReport, bare, cpu_seconds, report_cpu

ALONE = "alone"
QUIET = "quiet"
#: Two local Slurm clusters at once clash (job 1 of each takes port 20001): the tests that
#: start one (tests/conftest.py's `slurm` fixture) run one after another, in one group.
SLURM_FIXTURE = "slurm"
DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
#: What an unmeasured test is guessed to take, by the folder it is in (seconds).
GUESSES = (("tests/faults/", 40.0), ("tests/integration/", 15.0), ("tests/tui/", 3.0))
UNIT_GUESS = 0.2
#: Tests shorter than this are left out of durations.json (the guess is good enough).
STORED_FROM_S = 0.5
#: A piece of work this long (measured or guessed) is heavy: real ranks and daemons...
HEAVY_S = 8.0
#: ... unless it was measured to cost less CPU than this, its processes' included (CPU a
#: test's tree did not reap, as a Slurm job's, is not counted: the bar is low).
LIGHT_CPU_S = 2.0
#: ... and a heavy piece measured at under this many cores on average mostly waits.
WAITING_RATE = 0.5


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help="after the run, write each slow test's seconds to tests/durations.json "
        "(the workers' plan hands out the longest first)",
    )
    parser.addoption(
        "--cpu-report",
        metavar="FILE",
        help="append each test's CPU seconds, its processes' included, to FILE "
        "(python -m tests.support.cpu_report FILE sums it)",
    )
    parser.addoption(
        "--heavy-lanes",
        type=int,
        default=2,
        help="how many xdist workers may run heavy tests (real ranks) at once (default 2)",
    )
    parser.addoption(
        "--waiting-lanes",
        type=int,
        default=1,
        help="how many more workers may run heavy tests that mostly wait (under "
        f"{WAITING_RATE} of a core, measured) beside the heavy lanes (default 1)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{ALONE}: times something against load or needs the whole machine: runs after "
        "every other test, by itself",
    )
    config.addinivalue_line(
        "markers",
        f"{QUIET}: an `{ALONE}` test that adds little load itself: two run side by side, "
        f"before the other `{ALONE}` ones",
    )
    store = config.getoption("store_durations")
    report = config.getoption("cpu_report")
    if store or report:
        config.pluginmanager.register(CpuMeter(), "gpud-cpu-meter")
    if hasattr(config, "workerinput"):
        return  # a worker: the controller gets every report, and writes
    if store:
        config.pluginmanager.register(DurationStore(), "gpud-durations")
    if report:
        config.pluginmanager.register(CpuReport(Path(report).resolve()), "gpud-cpu-report")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`alone` tests last (the `quiet` ones first among them), in groups of their own; the
    tests of a local Slurm one after another (xdist adds `@group` to their ids: this runs
    before xdist's hook does)."""
    alone = [item for item in items if item.get_closest_marker(ALONE)]
    alone.sort(key=lambda item: item.get_closest_marker(QUIET) is None)
    for item in alone:
        item.add_marker(pytest.mark.xdist_group(QUIET if item.get_closest_marker(QUIET) else ALONE))
    for item in items:
        if SLURM_FIXTURE in getattr(item, "fixturenames", ()) and item not in alone:
            item.add_marker(pytest.mark.xdist_group(SLURM_FIXTURE))
    if alone:
        chosen = set(map(id, alone))
        items[:] = [item for item in items if id(item) not in chosen] + alone


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    return Plan(config, log)


def group_of(nodeid: str) -> str | None:
    at = nodeid.rfind("@")
    return nodeid[at + 1 :] if at > nodeid.rfind("]") else None


@dataclass(frozen=True)
class Cost:
    """What a test took when last measured: seconds, and CPU seconds (None: not measured)."""

    seconds: float
    cpu: float | None = None

    def to_json(self) -> float | list[float]:
        return self.seconds if self.cpu is None else [self.seconds, self.cpu]


def _cost(value: object) -> Cost | None:
    match value:
        case int() | float():
            return Cost(float(value))
        case [int() | float() as seconds, int() | float() as cpu]:
            return Cost(float(seconds), float(cpu))
    return None


def measured() -> dict[str, Cost]:
    """tests/durations.json: `"test id": seconds` or `"test id": [seconds, cpu seconds]`."""
    try:
        found = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): c for k, v in found.items() if (c := _cost(v)) is not None}


def guess(nodeid: str, known: dict[str, Cost]) -> Cost:
    if (cost := known.get(bare(nodeid))) is not None:
        return cost
    return Cost(next((s for prefix, s in GUESSES if nodeid.startswith(prefix)), UNIT_GUESS))


def heavy(costs: Sequence[Cost]) -> bool:
    """Whether a piece of work (its tests' costs) takes a heavy lane."""
    if sum(c.seconds for c in costs) < HEAVY_S:
        return False
    cpus = [c.cpu for c in costs]
    return any(cpu is None for cpu in cpus) or sum(c for c in cpus if c) >= LIGHT_CPU_S


def waiting(costs: Sequence[Cost]) -> bool:
    """Whether a heavy piece mostly waits (measured under WAITING_RATE cores on average):
    it may take a waiting lane."""
    if any(c.cpu is None for c in costs):
        return False
    seconds = sum(c.seconds for c in costs)
    return sum(c.cpu or 0.0 for c in costs) < WAITING_RATE * seconds


class Plan:
    """An xdist scheduler: pieces of work (a test, or a group) longest first; the `alone`
    group held back until every other worker has finished, then run on the last one."""

    def __init__(
        self, config: pytest.Config, log: Any = None, known: dict[str, Cost] | None = None
    ) -> None:
        from xdist.remote import Producer
        from xdist.workermanage import parse_tx_spec_config

        self.numnodes = len(parse_tx_spec_config(config))
        self.config = config
        self.log = log.plan if log is not None else Producer("plan")
        self.node2collection: dict[Any, list[str]] = {}
        self.node2pending: dict[Any, list[int]] = {}
        self.collection: list[str] | None = None
        self.work: list[list[int]] = []  # pieces not yet handed out, longest first
        self.heavy: set[int] = set()  # the first index of each heavy piece
        self.waiting: set[int] = set()  # ... of those that mostly wait
        self.lanes: set[Any] = set()  # the workers that take heavy pieces
        self.waiting_lanes: set[Any] = set()  # ... and those that take the waiting ones
        self.max_lanes = max(1, int(config.getoption("heavy_lanes") or 1))
        self.max_waiting_lanes = max(0, int(config.getoption("waiting_lanes") or 0))
        self.alone: list[int] = []
        self.quiet: list[int] = []
        self.closers: list[Any] = []  # the (up to two) workers that run the `alone` tests
        self.known = known  # what each test cost (None: tests/durations.json)

    # -- what DSession asks ------------------------------------------------------------
    @property
    def nodes(self) -> list[Any]:
        return list(self.node2pending)

    @property
    def collection_is_completed(self) -> bool:
        return len(self.node2collection) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        if not self.collection_is_completed or self.work or self.alone or self.quiet:
            return False
        return all(len(pending) < 2 for pending in self.node2pending.values())

    @property
    def has_pending(self) -> bool:
        return bool(self.work or self.alone or self.quiet or any(self.node2pending.values()))

    def add_node(self, node: Any) -> None:
        assert node not in self.node2pending
        self.node2pending[node] = []

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        assert node in self.node2pending
        if self.collection is not None and list(collection) != self.collection:
            self.log(f"worker {node.gateway.id} collected other tests; it gets none")
            return
        self.node2collection[node] = list(collection)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        self.node2pending[node].remove(item_index)
        self._hand_out(node)

    def mark_test_pending(self, item: str) -> None:
        assert self.collection is not None
        self.work.insert(0, [self.collection.index(item)])
        for node in self.nodes:
            self._hand_out(node)

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        raise NotImplementedError("the plan never steals work back")

    def remove_node(self, node: Any) -> str | None:
        """A worker finished, or died: what it held goes back (the test it was running is
        the crash xdist reports)."""
        pending = self.node2pending.pop(node)
        self.lanes.discard(node)
        self.waiting_lanes.discard(node)
        if node in self.closers:
            self.closers.remove(node)
        crashed = None
        if pending:
            assert self.collection is not None
            crashed = self.collection[pending.pop(0)]
            by_group: dict[str | None, list[int]] = {}
            for i in pending:
                by_group.setdefault(group_of(self.collection[i]), []).append(i)
            self.quiet = by_group.pop(QUIET, []) + self.quiet
            self.alone = by_group.pop(ALONE, []) + self.alone
            back = sorted(i for indices in by_group.values() for i in indices)
            if back:
                self.work.insert(0, back)
        for other in self.nodes:
            self._hand_out(other)
        return crashed

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is None:
            collections = list(self.node2collection.values())
            if any(c != collections[0] for c in collections[1:]):
                self.log("the workers collected different tests; nothing is run")
                return
            self.collection = collections[0]
            self._plan(self.collection)
        for node in self.nodes:
            self._hand_out(node)

    # -- the plan ----------------------------------------------------------------------
    def _plan(self, collection: list[str]) -> None:
        pieces: dict[str, list[int]] = {}
        for index, nodeid in enumerate(collection):
            pieces.setdefault(group_of(nodeid) or nodeid, []).append(index)
        self.alone = pieces.pop(ALONE, [])
        self.quiet = pieces.pop(QUIET, [])
        known = self._known()
        costs = {k: [guess(collection[i], known) for i in v] for k, v in pieces.items()}
        seconds = {k: sum(c.seconds for c in v) for k, v in costs.items()}
        # Longest first; among equals, in the order collected (sorted() is stable).
        self.work = [pieces[k] for k in sorted(pieces, key=lambda k: -seconds[k])]
        self.heavy = {pieces[k][0] for k in pieces if heavy(costs[k])}
        self.waiting = {pieces[k][0] for k in pieces if heavy(costs[k]) and waiting(costs[k])}

    def _hand_out(self, node: Any) -> None:
        if node.shutting_down or node not in self.node2collection:
            return
        pending = self.node2pending[node]
        while len(pending) < 2 and (piece := self._next_piece(node)) is not None:
            self._send(node, piece)
        if len(pending) >= 2:
            return
        if self.work:  # only heavy pieces are left, and the lanes are taken: it is done
            node.shutdown()
            return
        # Nothing left but the `alone` tests: the first two workers to run dry wait for
        # the others to finish and leave; then each runs half of the quiet ones, side by
        # side, and the first, once the second has left, the rest (by itself).
        if not (self.alone or self.quiet):
            node.shutdown()
            return
        if node not in self.closers:
            if self.closers and (len(self.closers) == 2 or not self.quiet):
                node.shutdown()
                return
            self.closers.append(node)
        if len(self.node2pending) > len(self.closers):
            return  # others still running
        if self.quiet:
            if len(self.closers) == 2:
                share, self.quiet = self._halves(self.quiet)
                second = self.closers[1]
                self._send(second, share)
                self.closers.remove(second)
                second.shutdown()
            self._send(self.closers[0], self.quiet)
            self.quiet = []
        if len(self.node2pending) == 1:
            if self.alone:
                self._send(self.closers[0], self.alone)
                self.alone = []
            self.closers[0].shutdown()

    def _halves(self, indices: list[int]) -> tuple[list[int], list[int]]:
        """Two shares of about equal measured seconds: longest first, each to the
        share that has less so far."""
        assert self.collection is not None
        known = self._known()
        seconds = {i: guess(self.collection[i], known).seconds for i in indices}
        shares: tuple[list[int], list[int]] = ([], [])
        for i in sorted(indices, key=lambda i: -seconds[i]):
            min(shares, key=lambda share: sum(seconds[j] for j in share)).append(i)
        return shares

    def _known(self) -> dict[str, Cost]:
        return self.known if self.known is not None else measured()

    def _lane_free(self) -> bool:
        return len(self.lanes) < self.max_lanes

    def _waiting_lane_free(self) -> bool:
        return len(self.waiting_lanes) < self.max_waiting_lanes

    def _next_piece(self, node: Any) -> list[int] | None:
        """The longest piece this worker may take: a heavy lane any, a waiting lane a
        waiting or a light one, another a light one (or it becomes a lane, if one is free)."""
        for at, piece in enumerate(self.work):
            if piece[0] not in self.heavy:
                return self.work.pop(at)
            may_wait = node in self.waiting_lanes or self._waiting_lane_free()
            if piece[0] in self.waiting and node not in self.lanes and may_wait:
                self.waiting_lanes.add(node)
                return self.work.pop(at)
            if node in self.lanes or (node not in self.waiting_lanes and self._lane_free()):
                self.lanes.add(node)
                return self.work.pop(at)
        return None

    def _send(self, node: Any, indices: list[int]) -> None:
        self.node2pending[node].extend(indices)
        node.send_runtest_some(indices)


class CpuMeter:
    """Each test report carries the CPU seconds of its phase (`cpu_s` in its
    user_properties): the worker's own and that of every process the test started and
    reaped (a daemon reaps its shims, a shim its launcher, torchrun its ranks)."""

    def __init__(self) -> None:
        self._mark = cpu_seconds()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        now = cpu_seconds()
        report.user_properties.append((CPU_PROPERTY, round(now - self._mark, 3)))
        self._mark = now
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self) -> None:
        self._mark = cpu_seconds()


class DurationStore:
    """`--store-durations`: each test's setup, call and teardown seconds, and CPU seconds,
    summed, merged into tests/durations.json (tests that did not run keep their figure)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = bare(report.nodeid)
        self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + report.duration
        if any(name == CPU_PROPERTY for name, _ in report.user_properties):
            self.cpu[nodeid] = self.cpu.get(nodeid, 0.0) + report_cpu(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        kept = measured()
        for nodeid, seconds in self.seconds.items():
            cpu = self.cpu.get(nodeid)
            kept[nodeid] = Cost(round(seconds, 1), None if cpu is None else round(cpu, 1))
        slow = {k: c.to_json() for k, c in sorted(kept.items()) if c.seconds >= STORED_FROM_S}
        lines = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in slow.items()]  # one a line
        DURATIONS.write_text("{\n" + ",\n".join(lines) + "\n}\n")
