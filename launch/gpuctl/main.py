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
from launch.gpuctl.launching import launch_command
from launch.gpuctl.nodes import nodes_command
from launch.gpuctl.runs import (
    logs_command,
    ps_command,
    resume_command,
    status_command,
    stop_command,
)


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


@cli.command("schema")
def schema_command() -> None:
    """Print the JSON schema of run specs (config/schema/runspec.schema.json)."""
    import json

    from launch.spec import spec_json_schema

    click.echo(json.dumps(spec_json_schema(), indent=2))


cli.add_command(nodes_command)
cli.add_command(hw_command)
cli.add_command(keys_group)
for verb in (
    launch_command,
    ps_command,
    status_command,
    stop_command,
    resume_command,
    logs_command,
):
    cli.add_command(verb)


def main() -> None:
    run_click(cli, "gpuctl")
