"""Node 0's all-or-none round across an attempt's nodes, before any part starts.

`Reservations.reserve` asks every node of the attempt for its GPUs (this one through
`LocalParts`), gives back what it got when one refuses, and leaves out of an elastic
attempt the nodes that cannot take part while enough are left; `preflight` runs the
collective check on the reserved GPUs (`trainers.preflight` on every node at once) and
leaves out, or names, a node that fails it; `give_back` and `release` let go of a
reservation.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from gpud.heal import preflight
from gpud.heal.collective import CHECK_TIMEOUT_S
from gpud.model.run import RunRecord
from gpud.runs.multinode import elastic
from gpud.runs.multinode.local import LocalParts
from gpud.runs.multinode.peers import PeerLink, PeerLinks, each
from gpud.runs.placement.ports import NoFreePort
from gpud.runs.state.book import RunBook
from gpud.wire.client import ClientError, RequestFailed
from gpud.wire.envelope import ErrorCode, ProtocolError
from gpud.wire.protocol import PART_PREFLIGHT, PART_RELEASE, PART_RESERVE
from gpud.wire.run_messages import (
    PartPreflight,
    PartPreflightRequest,
    PartReleaseRequest,
    PartReserveRequest,
)
from launch.spec import RunSpec

log = logging.getLogger("gpud.runs")


@dataclass(frozen=True)
class Reservation:
    """What `Reservations.reserve` got for an attempt: its nodes (and those in words), or
    why not."""

    members: list[int]
    words: str
    refusal: str | None = None
    #: Refused because fewer than `elastic.min_nodes` nodes could take part (not because
    #: this node's GPUs are busy): an automatic restart waits for them only if the spec
    #: says `queue: true`.
    too_few: bool = False
    #: Nodes an elastic attempt goes on without, and why (silent, or refused).
    left_out: dict[int, str] = field(default_factory=dict)


class Reservations:
    def __init__(self, book: RunBook, local: LocalParts, links: PeerLinks) -> None:
        self.book = book
        self.local = local
        self.links = links

    async def reserve(
        self,
        run: RunRecord,
        spec: RunSpec,
        attempt: int,
        key: tuple[float, str],
        queue: bool,
        left_out: set[int] | frozenset[int] = frozenset(),
    ) -> Reservation:
        """Lease the attempt's GPUs: the attempt's nodes (and in words), or why not.

        A run that is not elastic takes every node or none; a request no node could ever
        serve (a GPU it does not have) raises at once. An elastic one takes the nodes that
        can give their GPUs, if there are enough (`elastic.choose_members`), and gives back
        what it does not use."""
        try:
            self.local.reserve_gpus(run, spec, attempt, key)
        except ProtocolError as exc:
            if exc.code is not ErrorCode.UNAVAILABLE:
                raise
            return Reservation([], "", refusal=exc.message)
        if len(run.nodes) < 2:
            return Reservation([0], "1 node")
        everyone = elastic.primary(run, spec) if spec.elastic is None else range(len(run.nodes))
        asked = [r for r in everyone if r != 0 and r not in left_out]
        request = PartReserveRequest(run_id=run.id, attempt=attempt, queued_at=key[0], queue=queue)
        replies = await self.links.call(run, asked, PART_RESERVE, each(request))
        refused = {r: reply for r, reply in replies.items() if isinstance(reply, ClientError)}
        granted = [r for r in asked if r not in refused]
        members, words = elastic.choose_members(run, spec, {0, *granted})
        if spec.elastic is None and refused:
            for rank, reply in refused.items():
                if isinstance(reply, RequestFailed) and reply.code == ErrorCode.INVALID_BODY.value:
                    await self.give_back(run, attempt, granted, local=True)
                    raise ProtocolError(ErrorCode.INVALID_BODY, f"node {rank}: {reply.message}")
        if members is None:
            await self.give_back(run, attempt, granted, local=True)
            why = "; ".join(
                f"node {rank}: {reply.message if isinstance(reply, RequestFailed) else reply}"
                for rank, reply in sorted(refused.items())
            )
            if spec.elastic is not None:
                gone = sorted(set(left_out))
                why = "; ".join(
                    [words]
                    + ([f"node(s) {', '.join(map(str, gone))} do not answer"] if gone else [])
                    + ([why] if why else [])
                )
            return Reservation([], "", refusal=why, too_few=spec.elastic is not None)
        await self.give_back(run, attempt, [r for r in granted if r not in members])
        out = {rank: "it did not answer (lost)" for rank in left_out}
        for rank, reply in sorted(refused.items()):  # an elastic attempt goes on without it
            why = reply.message if isinstance(reply, RequestFailed) else str(reply)
            out[rank] = why
            self.book.event(
                run, "attempt", f"node {rank} left out of attempt {attempt}: {why}", "warning"
            )
        return Reservation(members, words, left_out=out)

    async def preflight(
        self,
        run: RunRecord,
        spec: RunSpec,
        attempt: int,
        members: list[int],
        words: str,
        master_addr: str,
    ) -> tuple[list[int], str, dict[int, str]]:
        """The attempt's collective check on its nodes (`trainers.preflight`): a node far
        below its peers, or with a GPU that failed its check, is left out of an elastic
        attempt if enough are left; otherwise it is named and the attempt starts as it is."""
        try:
            master = f"{master_addr}:{self.local.free_master_port()}"
        except NoFreePort:
            return members, words, {}

        def ask(rank: int) -> PartPreflightRequest:
            return PartPreflightRequest(
                run_id=run.id, attempt=attempt, master=master, world=len(members),
                rank=members.index(rank),
            )  # fmt: skip

        # Each node's call waits for its check (seconds): on links and threads of its own,
        # one per node at once (they meet in one rendezvous), so neither the peer links
        # that polls use nor the loop's default executor wait behind them.
        pool = ThreadPoolExecutor(
            max_workers=max(1, len(members) - 1), thread_name_prefix="preflight"
        )

        async def remote(rank: int) -> PartPreflight | None:
            link = PeerLink(run.nodes[rank], self.links.keys)  # its own: see above
            call = partial(link.call, PART_PREFLIGHT, ask(rank), CHECK_TIMEOUT_S + 5.0)
            try:
                reply = await asyncio.get_running_loop().run_in_executor(pool, call)
                return reply if isinstance(reply, PartPreflight) else None
            except ClientError as exc:
                log.info("run %s: node %d's preflight: %s", run.id, rank, exc)
                return None
            finally:
                link.close()

        try:
            own, *others = await asyncio.gather(
                self.local.run_preflight(run, spec, attempt, master, len(members), 0),
                *(remote(rank) for rank in members[1:]),
            )
        finally:
            pool.shutdown(wait=False)
        results: dict[int, PartPreflight] = {0: own} if own is not None else {}
        for rank, found in zip(members[1:], others, strict=True):
            if found is not None:
                results[rank] = found
        failing, line = preflight.judge_collective(members, results)
        self.book.event(run, "preflight", line, "warning" if failing else "info")
        pairs = preflight.node_pairs(members, results)
        for node, why in preflight.below_baseline(pairs, run.bandwidth).items():
            if node not in failing:  # named; it stays in (a busy host can halve a figure)
                self.book.event(run, "preflight", f"node {node}: {why}", "warning")
        if pairs:
            run = self.book.update(run.id, bandwidth=preflight.with_figures(run.bandwidth, pairs))
        if not failing:
            return members, words, {}
        chosen, chosen_words = None, words
        if spec.elastic is not None and 0 not in failing:
            kept = {m for m in members if m not in failing}
            chosen, chosen_words = elastic.choose_members(run, spec, kept)
        bad_gpus = {n: failing[n] for n, r in results.items() if r.gpu_failures}
        if chosen is None and bad_gpus:  # never started on a GPU that failed its check
            await self.release(run, attempt)
            what = "; ".join(f"node {n}: {why}" for n, why in sorted(bad_gpus.items()))
            raise ProtocolError(
                ErrorCode.UNAVAILABLE,
                f"attempt {attempt} did not start: {what} (quarantined: the next attempt"
                " leases other GPUs)",
            )
        for node, why in sorted(failing.items()):
            if chosen is not None:
                kind, text = "attempt", f"node {node} left out of attempt {attempt}: it failed"
                text += f" its preflight: {why}"
            else:
                kind, text = "preflight", f"node {node} failed its preflight ({why}); attempt"
                text += f" {attempt} starts with it: too few nodes would be left"
            self.book.event(run, kind, text, "warning")
        if chosen is None:
            return members, words, {}
        await self.give_back(run, attempt, [m for m in members if m not in chosen])
        return (
            chosen,
            chosen_words,
            {n: f"it failed its preflight: {why}" for n, why in failing.items()},
        )

    async def give_back(
        self, run: RunRecord, attempt: int, ranks: list[int], local: bool = False
    ) -> None:
        """Release the attempt's reservation on those nodes (and this one, with `local`)."""
        if local:
            self.local.release_gpus(run, attempt)
        if ranks:
            release = PartReleaseRequest(run_id=run.id, attempt=attempt)
            await self.links.call(run, ranks, PART_RELEASE, each(release))

    async def release(self, run: RunRecord, attempt: int, cancel: str | None = None) -> None:
        """Give back the attempt's reservations on every node (and cancel the queued run
        on the other nodes, with `cancel`)."""
        self.local.release_gpus(run, attempt)
        request = PartReleaseRequest(run_id=run.id, attempt=attempt, cancel=cancel)
        everyone = list(range(1, len(run.nodes)))  # an elastic reservation may be anywhere
        replies = await self.links.call(run, everyone, PART_RELEASE, each(request))
        for rank, reply in replies.items():
            if isinstance(reply, ClientError) and cancel:
                self.book.event(
                    run, "stop", f"could not tell node {rank} the run is cancelled: {reply}"
                )
