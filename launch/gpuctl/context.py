"""What every gpuctl verb shares: the nodes to talk to, output mode, timeout, exit codes.

Verbs that read (`nodes`, `hw`, `ps`, and every verb that finds a run by id or name) ask
every known node unless `--node` is given, the same nodes gputop watches; `launch` goes to
`--node`, else the spec's nodes, else the local daemon.

Exit codes (documented in the README): 0 ok, 1 a request failed, 2 usage or config error,
3 a node is unreachable or refused the key.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

import click

from gpud.model.endpoints import AddressError, parse_endpoint
from gpud.security.known_nodes import load_known_nodes
from gpud.wire.client import (
    Client,
    ClientError,
    ConfigError,
    IncompatibleVersion,
    NodeTarget,
    RequestFailed,
    UnknownNode,
    Unreachable,
    known_targets,
)
from gpud.wire.client import resolve_target as resolve_node_target

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

DEFAULT_NODE = "127.0.0.1:7711"
#: How long gpuctl waits for node 0 to start an attempt (a launch, a resume, a resize): on
#: several nodes the preflight's collective check runs first, and takes up to
#: `gpud.heal.collective.CHECK_TIMEOUT_S`.
START_TIMEOUT_S = 60.0
T = TypeVar("T")


def fail(message: str, code: int) -> NoReturn:
    """One line on stderr, no traceback, and the documented exit code."""
    click.echo(f"gpuctl: error: {message}", err=True)
    sys.exit(code)


def exit_code_for(error: BaseException) -> int:
    if isinstance(error, Unreachable):
        return EXIT_UNREACHABLE
    if isinstance(error, (ConfigError, IncompatibleVersion)):
        return EXIT_USAGE
    if isinstance(error, RequestFailed):
        # A request the daemon found invalid (a spec asking for GPUs the node lacks) is
        # bad input, like a bad config: what to fix is in the message.
        return EXIT_USAGE if error.code == "invalid_body" else EXIT_FAILED
    return EXIT_FAILED


def split_nodes(values: Sequence[str]) -> list[str]:
    """`--node a --node b,c` → ["a", "b", "c"] (click already splits GPUD_NODES on spaces)."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


@dataclass
class NodeResult(Generic[T]):
    """The outcome of one verb on one node: a value or an error, never both."""

    address: str
    value: T | None = None
    error: ClientError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Ctl:
    """Parsed global options, handed to every verb."""

    nodes: list[str]  # --node (or GPUD_NODES) as given; empty when not given
    json: bool
    timeout: float

    def targets(self) -> list[NodeTarget]:
        """Where a launch goes: each --node, else the local daemon; a bad or unknown one is
        a usage error (exit 2)."""
        try:
            known = load_known_nodes()
        except ValueError as exc:
            fail(str(exc), EXIT_USAGE)
        targets = []
        for address in self.nodes or [DEFAULT_NODE]:
            try:
                targets.append(resolve_node_target(address, known))
            except ClientError as exc:
                fail(str(exc), exit_code_for(exc))
        return targets

    def every_node(self) -> list[NodeTarget | NodeResult[Any]]:
        """The nodes a verb that reads asks: each --node, else every known node (the list
        gputop watches). A --node address gpuctl knows no key for is a result with that
        error, in its place; a malformed one, or no node known at all, exits 2."""
        if not self.nodes:
            try:
                return list(known_targets())
            except ConfigError as exc:
                fail(str(exc), EXIT_USAGE)
        try:
            known = load_known_nodes()
        except ValueError as exc:
            fail(str(exc), EXIT_USAGE)
        nodes: list[NodeTarget | NodeResult[Any]] = []
        for address in self.nodes:
            try:
                label = parse_endpoint(address).removeprefix("tcp://")
            except AddressError as exc:
                fail(str(exc), EXIT_USAGE)
            try:
                nodes.append(resolve_node_target(address, known))
            except ClientError as exc:
                nodes.append(NodeResult(label, error=exc))
        return nodes

    def on_every_node(self, action: Callable[[Client], T]) -> list[NodeResult[T]]:
        """Run `action` against every node (`every_node`) at once, in that order; per-node
        failures are kept, not raised."""

        def one(node: NodeTarget | NodeResult[T]) -> NodeResult[T]:
            if isinstance(node, NodeResult):
                return node
            try:
                with Client(node, timeout_s=self.timeout) as client:
                    return NodeResult(node.label, value=action(client))
            except ClientError as exc:
                return NodeResult(node.label, error=exc)

        nodes = self.every_node()
        if len(nodes) == 1:
            return [one(nodes[0])]
        from concurrent.futures import ThreadPoolExecutor  # here: one node needs no threads

        with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
            return list(pool.map(one, nodes))


def report_errors(results: Sequence[NodeResult[T]]) -> None:
    """One stderr line per node that failed."""
    for r in results:
        if r.error is not None:
            # These errors name the address themselves.
            where = "" if isinstance(r.error, Unreachable | UnknownNode) else f"{r.address}: "
            click.echo(f"gpuctl: error: {where}{r.error}", err=True)


def worst_exit_code(results: Sequence[NodeResult[T]]) -> int:
    """Unreachable beats a failed request beats success."""
    codes = [exit_code_for(r.error) for r in results if r.error is not None]
    if EXIT_UNREACHABLE in codes:
        return EXIT_UNREACHABLE
    return max(codes, default=EXIT_OK)


def _set_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(Ctl).json = True


#: `--json` after the verb too (`gpuctl hw --json`), same as the global one.
json_option = click.option(
    "--json",
    "json_after_verb",
    is_flag=True,
    expose_value=False,
    callback=_set_json,
    help="Machine-readable output.",
)
