"""The `gpud` command: `serve` (the daemon), `stop`, `probe`, and `demo`.

Exit codes of `gpud serve`: 0 stopped cleanly, 1 failed, 2 bad settings, 3 an address or
the state dir is already in use.
Exit codes of `gpud stop`: 0 stopped, 1 no daemon holds the state dir, it did not stop
in time, or (`--runs`) its runs could not be stopped, which leaves it running.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from gpud import __version__
from gpud.commands import shutdown
from gpud.commands.frontend import run_click, state_dir_option
from gpud.daemon import EXIT_FAILURE, EXIT_USAGE, serve
from gpud.node.statedir import StateDir, held_by
from gpud.settings import (
    SERVE_CONFIG_ENV,
    SettingsError,
    build_settings,
    group_flags,
    load_config_file,
    readable_secrets,
)

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def _fail(message: str, code: int) -> None:
    click.echo(f"gpud: error: {message}", err=True)
    sys.exit(code)


def _warn(message: str) -> None:
    click.echo(f"gpud: warning: {message}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpud")
def cli() -> None:
    """gpud: the per-node daemon of gpud (GPU telemetry, run supervision)."""


def main() -> None:
    run_click(cli, "gpud")


@cli.command("serve")
@click.option(
    "--control", envvar="GPUD_CONTROL_ADDR", help="Control address [tcp://127.0.0.1:7711]."
)
@click.option("--events", envvar="GPUD_EVENTS_ADDR", help="Events address [tcp://127.0.0.1:7712].")
@state_dir_option
@click.option("--node-name", envvar="GPUD_NODE_NAME", help="Name in topics and UIs [hostname].")
@click.option("--interval", envvar="GPUD_INTERVAL", type=float, help="Seconds per snapshot [1].")
@click.option(
    "--simulate-gpus",
    envvar="GPUD_SIMULATE_GPUS",
    type=int,
    help="Serve N simulated GPUs (flagged simulated everywhere).",
)
@click.option(
    "--simulate-foreign",
    multiple=True,
    metavar="GPU:PID",
    help="With --simulate-gpus: show process PID on simulated GPU GPU as a process outside"
    " gpud holding memory (for tests and demos of shared boxes; repeatable).",
)
@click.option(
    "--simulate-xid-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="With --simulate-gpus: a test hook; each GPU:CODE line written to this file"
    " becomes an XID on that simulated GPU.",
)
@click.option(
    "--metrics",
    envvar="GPUD_METRICS_ADDR",
    metavar="HOST:PORT",
    help="Serve Prometheus /metrics there (dcgm-exporter's GPU names, and runs) [off].",
)
@click.option(
    "--metrics-tls-cert",
    type=click.Path(path_type=Path, dir_okay=False),
    help="TLS certificate for /metrics.",
)
@click.option(
    "--metrics-tls-key", type=click.Path(path_type=Path, dir_okay=False), help="Its private key."
)
@click.option(
    "--metrics-client-ca",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Only clients with a certificate this CA signed may scrape.",
)
@click.option(
    "--metrics-insecure",
    is_flag=True,
    help="Plain HTTP /metrics on a non-loopback address (refused otherwise).",
)
@click.option(
    "--attach",
    envvar="GPUD_ATTACH_DIR",
    type=click.Path(path_type=Path, file_okay=False),
    help="Let runs gpud did not start (Slurm jobs, pods) report here: the attach and"
    " ingest sockets go in this directory, e.g. /run/gpud [off].",
)
@click.option(
    "--kubelet-socket",
    envvar="GPUD_KUBELET_SOCKET",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The kubelet's pod-resources socket, for the pod on each GPU"
    " [/var/lib/kubelet/pod-resources/kubelet.sock].",
)
@click.option(
    "--audit-max-mb",
    envvar="GPUD_AUDIT_MAX_MB",
    type=float,
    help="The audit log (audit.log), its refusals (audit-refused.log) and their rotated"
    " files hold at most this many MiB together [64].",
)
@click.option(
    "--logs-max-bytes",
    envvar="GPUD_LOGS_MAX_BYTES",
    help="Each run's log, per node and attempt, holds at most this much, e.g. 100MB or"
    " 2GiB: its head and its tail, with a mark where lines were dropped; a run's"
    " logs.max_bytes wins [100MB].",
)
@click.option(
    "--retention-max-runs",
    envvar="GPUD_RETENTION_MAX_RUNS",
    type=int,
    help="Finished runs kept (records, events, metrics, run dirs); 0: no bound [1000].",
)
@click.option(
    "--retention-max-age-days",
    envvar="GPUD_RETENTION_MAX_AGE_DAYS",
    type=float,
    help="Finished runs older than this (since they ended) are removed; 0: no bound [90].",
)
@click.option(
    "--retention-max-bytes",
    envvar="GPUD_RETENTION_MAX_BYTES",
    metavar="SIZE",
    help="Bytes of finished runs kept, e.g. 10GiB, 500M (checkpoints are not counted and"
    " never removed); 0: no bound [10GiB].",
)
@click.option(
    "--retention-node-events",
    envvar="GPUD_RETENTION_NODE_EVENTS",
    type=int,
    help="Node events kept (XIDs, throttling, holds); 0: no bound [100000].",
)
@click.option(
    "--retention-full-steps",
    envvar="GPUD_RETENTION_FULL_STEPS",
    type=int,
    help="A finished run keeps every metric point of its last N steps; older points are"
    " thinned to the curve's shape [10000].",
)
@click.option(
    "--retention-interval-minutes",
    envvar="GPUD_RETENTION_INTERVAL_MINUTES",
    type=float,
    help="Minutes between the daemon's own retention passes; 0: only `gpuctl gc` [60].",
)
@click.option(
    "--insecure",
    envvar="GPUD_INSECURE",
    is_flag=True,
    help="No CurveZMQ; refused unless both addresses are loopback.",
)
@click.option(
    "--master-ports",
    envvar="GPUD_MASTER_PORTS",
    help="FIRST-LAST: the ports runs get as MASTER_PORT where this node is their node 0;"
    " open them between the nodes [29500-30499].",
)
@click.option("--log-level", envvar="GPUD_LOG_LEVEL", help="debug, info, warning, error [info].")
@click.option(
    "--config",
    "config_file",
    envvar=SERVE_CONFIG_ENV,
    type=click.Path(dir_okay=False, path_type=Path),
    help="YAML file with the settings above [<config-dir>/gpud.yaml if present].",
)
@click.pass_context
def serve_command(ctx: click.Context, /, config_file: Path | None, **flags: Any) -> None:
    """Run the daemon in the foreground until SIGTERM or SIGINT."""
    try:
        values = load_config_file(config_file)
        for name, value in flags.items():
            if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT:
                values[name] = value
        values = group_flags(values, "retention")
        settings = build_settings(values)
    except SettingsError as exc:
        _fail(str(exc), EXIT_USAGE)
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    logging.getLogger("gpud.zap").setLevel(logging.WARNING)
    exposed = readable_secrets(config_file, settings)
    if exposed is not None:
        _warn(exposed)
    sys.exit(serve(settings))


@cli.command("stop")
@state_dir_option
@click.option("--timeout", default=15.0, show_default=True, help="Seconds to wait for it.")
@click.option(
    "--runs",
    "stop_runs",
    is_flag=True,
    help="Stop every run first (as `gpuctl stop` does) and wait until they have ended.",
)
@click.option(
    "--runs-timeout",
    default=shutdown.RUNS_TIMEOUT_S,
    show_default=True,
    help="Seconds --runs waits for them (more for specs with a long stop_grace_s).",
)
def stop_command(
    state_dir: Path | None, timeout: float, stop_runs: bool, runs_timeout: float
) -> None:
    """Stop the daemon that holds a state dir (SIGTERM, then wait).

    Its runs keep going under their shims, and the next gpud on the state dir adopts them
    again; it says how many. With --runs it stops them first.
    """
    from gpud.node.paths import default_state_dir

    state = StateDir(state_dir or default_state_dir())
    pid = held_by(state.pid_file)
    if pid is None:
        _fail(f"no gpud is running with state dir {state.root}", EXIT_FAILURE)
        return
    try:
        shutdown.stop(state, pid, timeout, click.echo, _warn, stop_runs, runs_timeout)
    except shutdown.StopFailed as exc:
        _fail(str(exc), EXIT_FAILURE)


@cli.command("probe")
@click.option("--simulate-gpus", type=int, help="Probe N simulated GPUs instead of NVML.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole snapshot as JSON.")
def probe_command(simulate_gpus: int | None, as_json: bool) -> None:
    """Sample this machine once, without a daemon, and say which fields are not available."""
    from gpud.hardware.host import HostSampler
    from gpud.hardware.node import NodeSampler, open_gpu_sampler
    from gpud.settings import default_node_name

    node = default_node_name()
    gpus = open_gpu_sampler(simulate_gpus, node)
    sampler = NodeSampler(node, gpus, HostSampler(), interval_s=1.0)
    try:
        sampler.sample()
        time.sleep(1.0)  # rates and GPM metrics need two samples
        snapshot = sampler.sample()
    finally:
        gpus.close()
    if as_json:
        click.echo(snapshot.model_dump_json(indent=2))
        return
    click.echo(
        f"{snapshot.node}: backend {snapshot.backend}, driver {snapshot.driver_version}, "
        f"CUDA {snapshot.cuda_driver_version}, {len(snapshot.gpus)} GPU(s)"
        + (" [SIMULATED]" if snapshot.simulated else "")
    )
    for gpu in snapshot.gpus:
        fields = gpu.model_dump()
        missing = sorted(k for k, v in fields.items() if v is None)
        present = sorted(k for k, v in fields.items() if v is not None)
        click.echo(f"GPU {gpu.index} {gpu.name} ({gpu.uuid})")
        click.echo(f"  available ({len(present)}): {', '.join(present)}")
        click.echo(f"  not available ({len(missing)}): {', '.join(missing) or '-'}")
    click.echo(json.dumps({"sample_ms": snapshot.sample_ms}))


@cli.command("attach", context_settings={"ignore_unknown_options": True})
@click.option("--run-id", help="The run's id: the same on every node [$GPUD_RUN_ID, else new].")
@click.option("--name", help="The run's name [$GPUD_RUN_NAME, else the command's].")
@click.option("--run-dir", help="Where its logs go [$GPUD_RUN_DIR, else ./gpud-runs/RUN].")
@click.option("--nproc", type=int, help="Processes on this node [$PET_NPROC_PER_NODE, else 1].")
@click.option(
    "--socket",
    "socket_file",
    help="The daemon's attach socket [$GPUD_ATTACH, else /run/gpud/attach.sock].",
)
@click.option(
    "--metrics",
    "patterns",
    multiple=True,
    metavar="REGEX",
    help="A metrics pattern over rank 0's output, as a spec's `metrics:` (RE2; named groups"
    " are metrics, `step` the step); repeatable.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def attach_command(command: tuple[str, ...], **options: Any) -> None:
    """Run COMMAND (after --) as this node's part of a run gpud did not launch — in a pod,
    or a torchrun typed by hand — reporting to this node's daemon: its metrics, heartbeats,
    health and end, in gpuctl and gputop. Exits with COMMAND's status.

        gpud attach --run-id ddp-1 -- torchrun --nproc-per-node 8 train.py

    With --metrics, node 0 applies the patterns to the output itself and writes what they
    find to the run dir's metrics.jsonl, daemon or not.
    """
    from gpud.attach import run as attach_run

    try:
        code = attach_run.main(list(command), **options)
    except attach_run.AttachUsageError as exc:
        _fail(str(exc), EXIT_USAGE)
        return
    sys.exit(code)


@cli.command("demo")
@state_dir_option
@click.option(
    "--simulate-gpus",
    type=int,
    help=f"Simulate N GPUs [{8} when NVML finds no GPU, else real ones].",
)
@click.option(
    "--no-tui",
    is_flag=True,
    default=None,
    help="Print where things are and exit instead of opening gputop [when not in a terminal].",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    help="Steps for the demo run [1800: about a minute on 2 idle cores].",
)
def demo_command(
    state_dir: Path | None, simulate_gpus: int | None, no_tui: bool | None, steps: int | None
) -> None:
    """The whole flow: a local daemon, the CPU DDP example launched on it, and gputop."""
    from gpud.commands.demo import run_demo
    from gpud.node.paths import default_state_dir

    sets = (f"training.max_steps={steps}",) if steps else ()
    state = (state_dir or default_state_dir()).expanduser().resolve()
    run_demo(state, simulate_gpus, no_tui, sets=sets)
