"""What every gpud command line shares: one-line usage errors and their exit code."""

from __future__ import annotations

import sys
from pathlib import Path

import click

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def run_click(command: click.Command, prog: str) -> None:
    """Run a click command; usage errors become one line and exit 2, never a traceback."""
    try:
        command.main(prog_name=prog, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo(f"{prog}: aborted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        hint = ""
        if isinstance(exc, click.UsageError) and exc.ctx is not None:
            hint = f" (see `{exc.ctx.command_path} --help`)"
        click.echo(f"{prog}: error: {exc.format_message()}{hint}", err=True)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


#: `--state-dir` as every command that names a daemon's state dir spells it.
state_dir_option = click.option(
    "--state-dir",
    envvar="GPUD_STATE_DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="The daemon's state dir [$GPUD_STATE_DIR, else ~/.local/state/gpud].",
)
