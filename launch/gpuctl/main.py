"""The `gpuctl` entry point: global options and the verbs.

Global options come before the verb: `gpuctl --node HOST:PORT --json hw`.
"""

from __future__ import annotations

import click

from gpud import __version__
from gpud.frontend import run_click
from launch.gpuctl.context import DEFAULT_NODE, Ctl, split_nodes
from launch.gpuctl.hw import hw_command
from launch.gpuctl.keys import keys_group
from launch.gpuctl.nodes import nodes_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--node",
    "nodes",
    multiple=True,
    envvar="GPUD_NODES",
    metavar="HOST:PORT",
    help=f"A daemon's control address; repeatable; env GPUD_NODES [{DEFAULT_NODE}].",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds to wait for each node.",
)
@click.version_option(__version__, prog_name="gpuctl")
@click.pass_context
def cli(ctx: click.Context, nodes: tuple[str, ...], as_json: bool, timeout: float) -> None:
    """gpuctl: launch, inspect and control runs on gpud nodes.

    \b
    Exit codes: 0 ok, 1 a request failed, 2 usage or config error,
                3 a node is unreachable or refused the key.
    """
    chosen = split_nodes(nodes)
    ctx.obj = Ctl(
        nodes=chosen or [DEFAULT_NODE],
        explicit_nodes=bool(chosen),
        json=as_json,
        timeout=timeout,
    )


cli.add_command(nodes_command)
cli.add_command(hw_command)
cli.add_command(keys_group)


def main() -> None:
    run_click(cli, "gpuctl")
