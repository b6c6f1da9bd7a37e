"""Shell completion for gpuctl: `gpuctl completion bash|zsh|fish` prints the script, and
run arguments complete to the run ids and names the nodes know (asked with a short
timeout; a node that does not answer adds nothing, and completion never prints an error)
and, as in `gpuctl ps` without --node, to the Slurm runs submitted from here (read from
their run dirs: Slurm is not asked while the user waits)."""

from __future__ import annotations

import contextlib
import io

import click
from click.shell_completion import CompletionItem, get_completion_class

from gpud.wire.run_messages import RunList
from launch.gpuctl import slurm_jobs
from launch.gpuctl.context import Ctl, split_nodes

#: Seconds each node gets to list its runs while the user waits at the prompt.
COMPLETION_TIMEOUT_S = 1.0
SHELLS = ("bash", "zsh", "fish")


def complete_runs(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    nodes = ctx.find_root().params.get("nodes") or ()
    ctl = Ctl(nodes=split_nodes(nodes), json=False, timeout=COMPLETION_TIMEOUT_S)
    items: dict[str, str] = {}
    newest: dict[str, float] = {}

    def offer(run_id: str, name: str, created_at: float, what: str) -> None:
        items.setdefault(run_id, f"{name}, {what}")
        if created_at > newest.get(name, float("-inf")):
            newest[name] = created_at
            items[name] = f"its newest run: {run_id}"

    if not ctl.nodes:
        for on_slurm in slurm_jobs.known_runs():
            with contextlib.suppress(KeyError, TypeError, ValueError):  # a damaged slurm.json
                created_at = float(on_slurm.config["created_at"])
                offer(on_slurm.id, on_slurm.name, created_at, f"Slurm job {on_slurm.job}")
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            results = ctl.on_every_node(lambda client: client.runs(limit=200))
    except (Exception, SystemExit):  # no node known, a bad --node: nothing more to offer
        results = []
    for result in results:
        if not isinstance(result.value, RunList):
            continue
        for run in result.value.runs:
            offer(run.id, run.name, run.created_at, run.state_label)
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
