"""A node's own look at node 0, for the runs it has a live part of (issue 26 §1).

Node 0 asks a node that missed its stop again until the part has ended (`PeerStops`), but
that wish lives in node 0's memory: a node 0 that restarted meanwhile would leave the part
running, and so would anything else that keeps node 0's ask from getting through. So each
node with a live part of a run it does not coordinate asks node 0 where the run stands
(`run.gang.status`): every `WATCH_S`, and at once when its own loop was frozen (a tick more
than `GAP_S` late: a SIGSTOP, a paused VM, a swap storm). When node 0 has the run stopping
or ended, or has moved on to a later attempt, the node stops its part itself, as node 0
asked if node 0 still knows what it asked. A node 0 that does not answer changes nothing
here: the part goes on (node 0 may be restarting; a lost node 0 is a failure its ranks
see).

Pure state and one pure decision, clocked and carried out by the gang.
"""

from __future__ import annotations

from gpud.model.run import RunState
from gpud.wire.run_messages import GangStatus, PartStopRequest

#: How often a node with a live part asks node 0 where the run stands.
WATCH_S = 5.0
#: A tick this much later than the last means this daemon was frozen: ask at once.
GAP_S = 3.0


def went_on_without(run_id: str, attempt: int, rank: int, now_at: int) -> str:
    """Why node `rank`'s part of `attempt` is stopped when an elastic run left the node out
    of a later attempt and trains on elsewhere (not "ended": it has not)."""
    return (
        f"this part of attempt {attempt} is stale: run {run_id} went on without node {rank}"
        f" (attempt {now_at}, on its other nodes)"
    )


def stop_for(status: GangStatus, attempt: int, rank: int) -> PartStopRequest | None:
    """The stop node `rank`'s part of `attempt` should carry out, by node 0's answer; None:
    it goes on."""
    if status.stop is not None and status.attempt == attempt:
        return status.stop
    ending = status.state is RunState.STOPPING or status.state.terminal
    if status.attempt > attempt:
        if not ending and status.members is not None and rank not in status.members:
            why = went_on_without(status.run_id, attempt, rank, status.attempt)
        else:
            why = f"node 0 has moved on to attempt {status.attempt}"
        return PartStopRequest(run_id=status.run_id, reason=why, failed=True)
    if ending:
        why = f"node 0 has the run {status.state.value}"
        if status.reason:
            why += f": {status.reason}"
        failed = status.state is RunState.FAILED
        return PartStopRequest(run_id=status.run_id, reason=why[:500], failed=failed)
    return None


class CoordinatorWatch:
    def __init__(self) -> None:
        self._asked: dict[str, float] = {}
        self._in_flight: set[str] = set()
        self._last_tick: float | None = None

    def tick(self, now: float) -> bool:
        """Note a tick of the loop; True when it came late enough to mean a freeze."""
        late = self._last_tick is not None and now - self._last_tick > GAP_S
        self._last_tick = now
        return late

    def due(self, run_id: str, now: float, woke: bool) -> bool:
        if run_id in self._in_flight:
            return False
        return woke or now - self._asked.get(run_id, float("-inf")) >= WATCH_S

    def sending(self, run_id: str, now: float) -> None:
        self._asked[run_id] = now
        self._in_flight.add(run_id)

    def answered(self, run_id: str) -> None:
        self._in_flight.discard(run_id)

    def forget(self, run_id: str) -> None:
        self._asked.pop(run_id, None)
        self._in_flight.discard(run_id)

    def keep(self, run_ids: set[str]) -> None:
        """Forget every run but these (the runs the tick still looks at)."""
        for run_id in [r for r in self._asked if r not in run_ids]:
            self.forget(run_id)
