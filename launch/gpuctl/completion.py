"""Shell completion for gpuctl: `gpuctl completion bash|zsh|fish` prints the script, and
run arguments complete to the run ids and names the nodes know (asked with a short
timeout; a node that does not answer adds nothing, and completion never prints an error)."""

from __future__ import annotations

import contextlib
import io

import click
from click.shell_completion import CompletionItem, get_completion_class

from gpud.protocol import RunList
from launch.gpuctl.context import Ctl, split_nodes

#: Seconds each node gets to list its runs while the user waits at the prompt.
COMPLETION_TIMEOUT_S = 1.0
SHELLS = ("bash", "zsh", "fish")


def complete_runs(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    nodes = ctx.find_root().params.get("nodes") or ()
    ctl = Ctl(nodes=split_nodes(nodes), json=False, timeout=COMPLETION_TIMEOUT_S)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            results = ctl.on_every_node(lambda client: client.runs(limit=200))
    except (Exception, SystemExit):  # no node known, a bad --node: nothing to offer
        return []
    items: dict[str, str] = {}
    newest: dict[str, float] = {}
    for result in results:
        if not isinstance(result.value, RunList):
            continue
        for run in result.value.runs:
            items.setdefault(run.id, f"{run.name}, {run.state_label}")
            if run.created_at > newest.get(run.name, float("-inf")):
                newest[run.name] = run.created_at
                items[run.name] = f"its newest run: {run.id}"
    return [
        CompletionItem(value, help=help)
        for value, help in sorted(items.items())
        if value.startswith(incomplete)
    ]


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion_command(shell: str) -> None:
    """Print the shell completion script: eval "$(gpuctl completion bash)" in ~/.bashrc.

    Verbs, options and run ids and names complete (runs from every known node, or --node).
    """
    from launch.gpuctl.main import cli

    completion = get_completion_class(shell)
    assert completion is not None
    click.echo(completion(cli, {}, "gpuctl", "_GPUCTL_COMPLETE").source())


#: The RUN argument of every verb that takes one: an id, an id prefix, or a name.
run_argument = click.argument("run", metavar="RUN", shell_complete=complete_runs)
