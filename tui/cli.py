"""The `gputop` command line: which nodes, read-only or not, in a terminal or a browser.

    gputop [--node HOST:PORT ...] [--cluster FILE] [--readonly] [--run RUN]
           [--web [--web-host 127.0.0.1] [--web-port 8000]]

Without `--node` or `--cluster` it watches every node in the known-nodes file (a local
daemon records itself there): the same nodes gpuctl's verbs read. Bad input, or no node
known, is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import NoReturn

from gpud import __version__
from tui.model.targets import Target, TargetError, resolve_targets

EXIT_USAGE = 2
DEFAULT_WEB_PORT = 8000


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see `gputop --help`)")


def fail(message: str) -> NoReturn:
    print(f"gputop: error: {message}", file=sys.stderr)
    sys.exit(EXIT_USAGE)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gputop",
        description="One terminal UI over every gpud node: GPUs, NCCL health, loss curves, runs.",
    )
    p.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a daemon to watch (repeatable) [every known node]",
    )
    p.add_argument(
        "--cluster",
        type=Path,
        metavar="FILE",
        help="YAML listing nodes with their pinned server keys (nodes: [{address, server_key}])",
    )
    p.add_argument("--readonly", action="store_true", help="no stop or resume")
    p.add_argument("--version", action="version", version=f"gputop (gpud) {__version__}")
    p.add_argument(
        "--run",
        metavar="RUN",
        help="open this run's screen first: an id, an id prefix, or a name (its newest run)",
    )
    p.add_argument("--web", action="store_true", help="serve the UI in a browser (textual-serve)")
    p.add_argument("--web-host", default="127.0.0.1", help="address to serve on [127.0.0.1]")
    p.add_argument(
        "--web-port", type=int, default=DEFAULT_WEB_PORT, help=f"port [{DEFAULT_WEB_PORT}]"
    )
    return p


def app_argv(args: argparse.Namespace) -> list[str]:
    """The same selection, as arguments for the app process textual-serve starts."""
    argv = [a for node in args.node for a in ("--node", node)]
    if args.cluster is not None:
        argv += ["--cluster", str(args.cluster.resolve())]
    if args.readonly:
        argv.append("--readonly")
    if args.run:
        argv += ["--run", args.run]
    return argv


def serve_web(args: argparse.Namespace) -> None:
    try:
        from textual_serve.server import Server
    except ImportError:
        fail("--web needs textual-serve: pip install 'gpud[web]'")

    command = shlex.join([sys.executable, "-m", "tui", *app_argv(args)])
    print(f"gputop: serving on http://{args.web_host}:{args.web_port}", file=sys.stderr)
    Server(command, host=args.web_host, port=args.web_port, title="gputop").serve()


def run_app(targets: list[Target], readonly: bool, start_run: str | None) -> None:
    from tui.app import GpuTop
    from tui.model.feed import Feed
    from tui.model.fleet import FleetModel

    model = FleetModel(targets)
    app = GpuTop(model, Feed(model, targets), readonly=readonly, start_run=start_run)
    app.run()


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if not 0 < args.web_port < 65536:
        fail(f"--web-port {args.web_port} is out of range")
    try:
        targets = resolve_targets(args.node, args.cluster)
    except TargetError as exc:
        fail(str(exc))
    try:
        if args.web:
            serve_web(args)
        else:
            run_app(targets, args.readonly, args.run)
    except KeyboardInterrupt:
        sys.exit(130)
