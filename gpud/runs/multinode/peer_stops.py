"""The stops node 0 has asked of the other nodes, until each part has ended (issue 26 §1).

A `run.part.stop` to a node that does not answer (its daemon frozen, a network partition)
times out after a few seconds and is gone: the peer link drops the request with its
socket. Asked only once, a node that answers again goes on running its part as if
nothing happened, and the run stays `stopping` for good — the lost timeout never fires,
because the node does answer. So node 0 keeps what it asked for (the strongest of every
stop it sent for the attempt: `failed` and `force` once set stay set) and asks again,
every `RETRY_S`, each part that node 0's polls do not yet show as over, until it is over
or declared lost. One call per node is in flight at a time.

Pure state, clocked by the gang.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpud.model.run import RunRecord, RunState
from gpud.wire.run_messages import PartStopRequest, PartView

#: How often a node whose part should have stopped is asked again.
RETRY_S = 2.0


@dataclass
class _Wish:
    attempt: int
    request: PartStopRequest
    asked_at: dict[int, float] = field(default_factory=dict)
    in_flight: set[int] = field(default_factory=set)
    missed: set[int] = field(default_factory=set)  # ranks whose last ask did not get through


class PeerStops:
    def __init__(self) -> None:
        self._wishes: dict[str, _Wish] = {}

    def want(self, run: RunRecord, request: PartStopRequest) -> PartStopRequest:
        """Node 0 wants the other parts of the run's current attempt stopped: returns the
        request to send, merged with what was asked before for the attempt."""
        wish = self._wishes.get(run.id)
        if wish is None or wish.attempt != run.attempt:
            wish = self._wishes[run.id] = _Wish(run.attempt, request)
        else:
            before = wish.request
            wish.request = before.model_copy(
                update={
                    "force": before.force or request.force,
                    "failed": before.failed or request.failed,
                    "dump": before.dump or request.dump,
                    # the failure's reason outlives a later user stop's
                    "reason": before.reason if before.failed else request.reason,
                }
            )
        return wish.request

    def sending(self, run_id: str, rank: int, now: float) -> None:
        wish = self._wishes.get(run_id)
        if wish is not None:
            wish.asked_at[rank] = now
            wish.in_flight.add(rank)

    def answered(self, run_id: str, rank: int, reached: bool) -> bool:
        """Record how an ask ended; True when it got through after one that did not."""
        wish = self._wishes.get(run_id)
        if wish is None:
            return False
        wish.in_flight.discard(rank)
        if not reached:
            wish.missed.add(rank)
            return False
        was_missed = rank in wish.missed
        wish.missed.discard(rank)
        return was_missed

    def due(
        self, run: RunRecord, parts: dict[int, PartView], now: float
    ) -> tuple[PartStopRequest, list[int]] | None:
        """The request and the ranks to ask again now; None when nothing is wanted (and
        forget a wish whose run ended or moved to another attempt)."""
        wish = self._wishes.get(run.id)
        if wish is None:
            return None
        if run.state.terminal or wish.attempt != run.attempt or run.state is RunState.PENDING:
            del self._wishes[run.id]
            return None
        ranks = [
            rank
            for rank, part in parts.items()
            if not (part.state is not None and part.state.terminal)
            and rank not in wish.in_flight
            and now - wish.asked_at.get(rank, float("-inf")) >= RETRY_S
        ]
        return (wish.request, ranks) if ranks else None

    def wanted(self, run: RunRecord) -> PartStopRequest | None:
        """What node 0 asked of the other parts of the run's current attempt, if anything."""
        wish = self._wishes.get(run.id)
        return wish.request if wish is not None and wish.attempt == run.attempt else None

    def forget(self, run_id: str) -> None:
        self._wishes.pop(run_id, None)
