"""`gpuctl nodes`: which daemons answer, what they serve, since when."""

from __future__ import annotations

import sys

import click

from gpud.known_nodes import load_known_nodes
from gpud.protocol import NodeInfo
from launch.gpuctl.context import EXIT_USAGE, Ctl, fail, json_option, worst_exit_code
from launch.gpuctl.output import emit_json, human_duration, table


@click.command("nodes")
@json_option
@click.pass_obj
def nodes_command(ctl: Ctl) -> None:
    """Every node: reachable or not, its GPUs, daemon version and uptime.

    Without --node (or GPUD_NODES) it lists every node in the known-nodes file.
    """
    if not ctl.explicit_nodes:
        try:
            known = load_known_nodes()
        except ValueError as exc:
            fail(str(exc), EXIT_USAGE)
        if not known.nodes:
            fail(
                "no nodes known yet: start a local daemon (`gpud serve` or `gpud demo`), "
                "or pin a remote one with `gpuctl keys trust HOST:PORT SERVER_KEY`",
                EXIT_USAGE,
            )
        ctl.nodes = [n.control for n in known.nodes]
    results = ctl.on_each(ctl.targets(), lambda client: client.node_info())
    if ctl.json:
        emit_json(
            {
                "nodes": [
                    {
                        "address": r.address,
                        "reachable": r.ok,
                        "error": str(r.error) if r.error else None,
                        "info": r.value,
                    }
                    for r in results
                ]
            }
        )
    else:
        rows = []
        for r in results:
            info: NodeInfo | None = r.value
            if info is None:
                rows.append([r.address, "-", "UNREACHABLE", "-", "-", "-", "-", str(r.error)])
                continue
            gpus = f"{info.gpu_count}" + (" (simulated)" if info.simulated else "")
            rows.append(
                [
                    r.address,
                    info.node,
                    "online",
                    gpus,
                    info.gpu_name or "-",
                    info.version,
                    human_duration(info.uptime_s),
                    "insecure" if not info.secure else info.role.value,
                ]
            )
        click.echo(
            table(["ADDRESS", "NODE", "STATUS", "GPUS", "MODEL", "VERSION", "UPTIME", "NOTE"], rows)
        )
    sys.exit(worst_exit_code(results))
