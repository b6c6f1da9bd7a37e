"""The `gpuctl` entry point: global options and the verbs.

Global options come before the verb: `gpuctl --node HOST:PORT --json hw`.
"""

from __future__ import annotations

import importlib

import click

from gpud import __version__
from gpud.commands.frontend import run_click
from launch.gpuctl.context import DEFAULT_NODE, Ctl, split_nodes

#: Verbs are imported when used: every gpuctl call pays only for its own verb
#: (`keys` alone would pull in zmq.auth, asyncio and ssl). `launch` is on the critical path
#: of a run's start, so this is measured (bench/launch_overhead.py).
VERBS = {
    "launch": "launch.gpuctl.launching:launch_command",
    "ps": "launch.gpuctl.runs:ps_command",
    "status": "launch.gpuctl.runs:status_command",
    "stop": "launch.gpuctl.runs:stop_command",
    "resume": "launch.gpuctl.runs:resume_command",
    "resize": "launch.gpuctl.resize:resize_command",
    "logs": "launch.gpuctl.runs:logs_command",
    "metrics": "launch.gpuctl.observe:metrics_command",
    "health": "launch.gpuctl.observe:health_command",
    "scaling": "launch.gpuctl.scaling:scaling_command",
    "nodes": "launch.gpuctl.nodes:nodes_command",
    "hw": "launch.gpuctl.hw:hw_command",
    "drain": "launch.gpuctl.drain:drain_command",
    "undrain": "launch.gpuctl.drain:undrain_command",
    "notify": "launch.gpuctl.notify:notify_group",
    "gc": "launch.gpuctl.gc:gc_command",
    "usage": "launch.gpuctl.usage:usage_command",
    "keys": "launch.gpuctl.keys:keys_group",
    "completion": "launch.gpuctl.completion:completion_command",
}


class LazyVerbs(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *VERBS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = VERBS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyVerbs, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--node",
    "nodes",
    multiple=True,
    envvar="GPUD_NODES",
    metavar="HOST:PORT",
    help="A daemon's control address; repeatable; env GPUD_NODES [every known node; "
    f"launch: the spec's nodes, else {DEFAULT_NODE}].",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds to wait for each node.",
)
@click.version_option(__version__, prog_name="gpuctl", message="%(prog)s (gpud) %(version)s")
@click.pass_context
def cli(ctx: click.Context, nodes: tuple[str, ...], as_json: bool, timeout: float) -> None:
    """gpuctl: launch, inspect and control runs on gpud nodes.

    Without --node, verbs that read ask every known node (as `gpuctl nodes` lists them);
    launch goes to the spec's nodes, else the local daemon.

    \b
    Exit codes: 0 ok, 1 a request failed, 2 usage or config error,
                3 a node is unreachable or refused the key.
    """
    ctx.obj = Ctl(nodes=split_nodes(nodes), json=as_json, timeout=timeout)


@cli.command("schema")
def schema_command() -> None:
    """Print the JSON schema of run specs (config/schema/runspec.schema.json)."""
    import json

    from launch.spec import spec_json_schema

    click.echo(json.dumps(spec_json_schema(), indent=2))


def main() -> None:
    run_click(cli, "gpuctl")
