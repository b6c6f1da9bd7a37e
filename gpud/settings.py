"""`gpud serve` settings: flags, environment and config file, validated in one model.

Precedence is the usual one: command line, then environment (`GPUD_*`), then the config
file (`--config`, env `GPUD_SERVE_CONFIG`, or `<config-dir>/gpud.yaml` when it exists),
then the defaults below.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpud.kube.podresources import DEFAULT_SOCKET
from gpud.model.endpoints import AddressError, is_loopback, parse_endpoint
from gpud.node.paths import config_dir, default_state_dir
from gpud.notify.targets import Webhook
from gpud.retention.policy import RetentionSettings
from gpud.wire.protocol import describe_validation_error
from launch.sections import DEFAULT_LOG_MAX_BYTES, LogBound

SERVE_CONFIG_ENV = "GPUD_SERVE_CONFIG"
DEFAULT_CONFIG_NAME = "gpud.yaml"
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")


class SettingsError(ValueError):
    """A setting a person gave that cannot work; the message names it."""


def parse_port_span(text: str) -> tuple[int, int]:
    """`29500-30499` (or one port, `29500`) as (first, last), both within 1024-65535."""
    first, sep, last = text.strip().partition("-")
    try:
        span = int(first), int(last if sep else first)
    except ValueError:
        span = (0, -1)
    if not 1024 <= span[0] <= span[1] <= 65535:
        raise ValueError(
            f"expected FIRST-LAST, ports from 1024 to 65535 with FIRST <= LAST"
            f" (e.g. 29500-30499); got {text!r}"
        )
    return span


def default_node_name() -> str:
    name = socket.gethostname().split(".")[0] or "localhost"
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", name)[:63]


class ServeSettings(BaseModel):
    """Everything `gpud serve` can be told."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    control: str = Field("tcp://127.0.0.1:7711", description="control socket (ROUTER) address")
    events: str = Field("tcp://127.0.0.1:7712", description="events socket (PUB) address")
    state_dir: Path = Field(default_factory=default_state_dir, description="keys, db, runs")
    node_name: str = Field(default_factory=default_node_name, description="name in topics/UI")
    interval: float = Field(1.0, gt=0.0, le=3600.0, description="seconds between snapshots")
    simulate_gpus: int | None = Field(None, ge=1, le=1024, description="simulate N GPUs")
    simulate_foreign: list[str] = Field(
        default_factory=list,
        description="GPU:PID: a process outside gpud on a simulated GPU (needs simulate_gpus)",
    )
    simulate_xid_file: Path | None = Field(
        None,
        description="test hook (needs simulate_gpus): each GPU:CODE line written to this file"
        " becomes an XID on that simulated GPU at the next sample",
    )
    metrics: str | None = Field(
        None, description="HOST:PORT to serve Prometheus /metrics on (off unless set)"
    )
    metrics_tls_cert: Path | None = Field(None, description="TLS certificate for /metrics")
    metrics_tls_key: Path | None = Field(None, description="its private key")
    metrics_client_ca: Path | None = Field(
        None, description="CA whose client certificates may scrape (mutual TLS)"
    )
    metrics_insecure: bool = Field(
        False, description="serve /metrics in plain HTTP on a non-loopback address"
    )
    attach: Path | None = Field(
        None,
        description="directory of the attach and shared ingest sockets, for runs gpud did not"
        " start (Slurm jobs, pods); off unless set",
    )
    kubelet_socket: Path = Field(
        DEFAULT_SOCKET,
        description="the kubelet's pod-resources socket: which pod each GPU is allocated to"
        " (used where it exists; in a pod without it, pods come from cgroups alone)",
    )
    audit_max_mb: float = Field(
        64.0,
        ge=0.1,
        le=1_000_000.0,
        description="the audit log (audit.log), its refusals (audit-refused.log) and their"
        " rotated files hold at most this many MiB together; the oldest records go first",
    )
    logs_max_bytes: LogBound = Field(
        DEFAULT_LOG_MAX_BYTES,
        description="each run's log, per node and attempt, holds at most this much (e.g."
        " 100MB, 2GiB): the first quarter and the last half to three quarters are kept;"
        " a run's `logs.max_bytes` wins",
    )
    notify: list[Webhook] = Field(
        default_factory=list,
        max_length=32,
        description="webhooks that get alerts (a run failed, stalled or hung; a GPU"
        " quarantined): url, format (json, slack, discord), events; config file only",
    )
    retention: RetentionSettings = Field(
        default_factory=RetentionSettings,
        description="what the state dir keeps of finished runs and node events (README,"
        " Retention and state size): max_runs, max_age_days, max_bytes, node_events,"
        " full_steps, interval_minutes",
    )
    insecure: bool = Field(False, description="no CURVE; refused unless both are loopback")
    master_ports: str = Field(
        "29500-30499",
        description="FIRST-LAST: the ports this node hands runs as MASTER_PORT (their"
        " rendezvous, when it is node 0); those the firewall opens between nodes",
    )
    log_level: str = Field("info", description="debug, info, warning or error")

    @field_validator("control", "events")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        try:
            return parse_endpoint(value)
        except AddressError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("simulate_foreign")
    @classmethod
    def _foreign(cls, value: list[str]) -> list[str]:
        for item in value:
            gpu, _, pid = item.partition(":")
            if not (gpu.isdigit() and pid.isdigit()):
                raise ValueError(f"{item!r}: expected GPU:PID, e.g. 2:1234")
        return value

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            endpoint = parse_endpoint(value.removeprefix("http://"), default_port=9400)
        except AddressError as exc:
            raise ValueError(str(exc)) from None
        if not endpoint.startswith("tcp://"):
            raise ValueError(f"{value!r}: expected HOST:PORT, e.g. 127.0.0.1:9400")
        return endpoint.removeprefix("tcp://")

    def _check_metrics(self) -> None:
        if self.metrics is None:
            return
        tls = (self.metrics_tls_cert, self.metrics_tls_key)
        if any(tls) and not all(tls):
            raise ValueError("--metrics-tls-cert and --metrics-tls-key go together")
        if self.metrics_client_ca is not None and not all(tls):
            raise ValueError("--metrics-client-ca needs --metrics-tls-cert and --metrics-tls-key")
        secured = all(tls) and self.metrics_client_ca is not None
        if not is_loopback(f"tcp://{self.metrics}") and not secured and not self.metrics_insecure:
            raise ValueError(
                f"--metrics {self.metrics} is not a loopback address, and /metrics names runs"
                " and hosts: give --metrics-tls-cert, --metrics-tls-key and"
                " --metrics-client-ca, or --metrics-insecure to serve it in the clear"
            )

    def foreign_processes(self) -> dict[int, list[int]]:
        """simulate_foreign as GPU index → pids."""
        found: dict[int, list[int]] = {}
        for item in self.simulate_foreign:
            gpu, _, pid = item.partition(":")
            found.setdefault(int(gpu), []).append(int(pid))
        return found

    @field_validator("node_name")
    @classmethod
    def _node_name(cls, value: str) -> str:
        if not _NODE_NAME.match(value):
            raise ValueError(
                "use letters, digits, '.', '_' and '-' (at most 63, starting with a letter "
                "or digit): it becomes part of event topics"
            )
        return value

    @field_validator("master_ports", mode="before")
    @classmethod
    def _master_ports(cls, value: object) -> str:
        first, last = parse_port_span(str(value))
        return f"{first}-{last}"

    def master_port_range(self) -> range:
        first, last = parse_port_span(self.master_ports)
        return range(first, last + 1)

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        if value.lower() not in ("debug", "info", "warning", "error"):
            raise ValueError("expected debug, info, warning or error")
        return value.lower()

    @model_validator(mode="after")
    def _insecure_only_on_loopback(self) -> ServeSettings:
        if self.insecure:
            public = [a for a in (self.control, self.events) if not is_loopback(a)]
            if public:
                raise ValueError(
                    f"--insecure is refused on a non-loopback address ({', '.join(public)}): "
                    "anyone who reaches it could launch code; drop --insecure to use CurveZMQ"
                )
        if self.control == self.events:
            raise ValueError("control and events need different addresses")
        self._check_metrics()
        if self.simulate_xid_file is not None and not self.simulate_gpus:
            raise ValueError("--simulate-xid-file needs --simulate-gpus")
        if self.simulate_foreign:
            beyond = [g for g in self.foreign_processes() if g >= (self.simulate_gpus or 0)]
            if not self.simulate_gpus or beyond:
                raise ValueError(
                    "--simulate-foreign needs --simulate-gpus with that GPU"
                    f" (GPU {beyond[0] if beyond else 0})"
                )
        return self


def load_config_file(path: Path | None) -> dict[str, Any]:
    """The config file's settings (keys as in ServeSettings); {} when there is none."""
    explicit = path is not None
    path = path or config_dir() / DEFAULT_CONFIG_NAME
    if not path.exists():
        if explicit:
            raise SettingsError(f"config file {path} does not exist")
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SettingsError(f"cannot read config file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must be a mapping of setting: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def readable_secrets(path: Path | None, settings: ServeSettings) -> str | None:
    """A warning when the config file holds webhook URLs (secrets) and users other than its
    owner may read it; None when all is well."""
    path = path or config_dir() / DEFAULT_CONFIG_NAME
    if not settings.notify:
        return None
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if not mode & 0o077:
        return None
    return (
        f"{path} holds webhook URLs, which are secrets, and others may read it"
        f" (mode {mode & 0o777:o}): chmod 600 {path}"
    )


def group_flags(values: dict[str, Any], group: str) -> dict[str, Any]:
    """`--retention-max-runs` (`retention_max_runs`) into `retention: {max_runs}`, over what
    the config file's `retention:` says."""
    prefix = f"{group}_"
    flat = {k.removeprefix(prefix): v for k, v in values.items() if k.startswith(prefix)}
    out = {k: v for k, v in values.items() if not k.startswith(prefix)}
    given = {k: v for k, v in flat.items() if v is not None}
    if not given:
        return out
    nested = out.get(group)
    if nested is not None and not isinstance(nested, dict):
        raise SettingsError(f"{group}: expected a mapping of setting: value")
    merged = {str(k).replace("-", "_"): v for k, v in (nested or {}).items()}
    out[group] = {**merged, **given}
    return out


def build_settings(values: dict[str, Any], source: str = "settings") -> ServeSettings:
    """Validate merged settings; one-line SettingsError naming the bad one."""
    try:
        return ServeSettings.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        raise SettingsError(f"bad {source}: {describe_validation_error(exc)}") from None
