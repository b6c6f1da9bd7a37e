"""What a run is: the YAML run spec, validated strictly by pydantic.

A person writes these, so every model forbids unknown keys (a typo fails loudly, naming the
key and the nearest valid one) and cross-field rules reject impossible combinations before
anything starts. `load_spec()` turns a file plus `--set` overrides into a `RunSpec`, or a
`SpecError` whose message names where the bad value came from (the file, or the `--set`
override that set it), the key path and what was expected.

Paths in a spec are resolved by gpuctl against the config file's directory (`workdir`,
`deepspeed.config`; `checkpoint.dir` against the workdir), so what travels to the daemons
is self-contained: the DeepSpeed JSON is inlined, the paths are absolute. A daemon refuses
a relative path (`require_absolute_paths`).

The top level (`RunSpec`) and the loading are here; the sections below it are
`launch.sections`.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gpud.model.endpoints import AddressError, parse_endpoint
from gpud.notify.targets import Webhook
from launch.sections import (
    AccelerateSettings,
    CheckpointSettings,
    DeepSpeedSettings,
    ElasticSettings,
    Launcher,
    LogSettings,
    MetricPattern,
    NcclSettings,
    RestartSettings,
    ResumeSettings,
    SlurmSettings,
    SpecError,
    SpecModel,
    TrainingHints,
    WandbSettings,
)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Environment variables gpud sets itself; a spec may not override them.
RESERVED_ENV_PREFIX = "GPUD_"
#: ...except the trainers library's test hooks (see trainers/hooks.py).
TEST_HOOK_PREFIX = "GPUD_TEST_"


class RunSpec(SpecModel):
    """One run: what to start on which nodes, and how to watch, stop and resume it."""

    name: Annotated[str, Field(pattern=NAME_PATTERN, description="a name for people and UIs")]
    nodes: list[str] = Field(
        default_factory=list, description="daemon addresses HOST:PORT; node 0 coordinates"
    )
    nproc_per_node: int | Literal["auto"] = Field(
        "auto", description="processes per node; auto: all GPUs, or 1 without GPUs"
    )
    gpus: int | list[int | str] | Literal["all"] | None = Field(
        None,
        description="GPUs per node: a count, a list of indices or UUIDs, or all (default:"
        " nproc_per_node of them, every free one for auto); leased to the run alone",
    )
    queue: bool = Field(
        False,
        description="when its GPUs are busy, wait in the node's queue (first come, first"
        " served) instead of being refused; gpuctl launch --queue sets it too",
    )
    launcher: Launcher = Launcher.TORCHRUN
    script: str | None = Field(None, description="script path (relative to workdir)")
    module: str | None = Field(None, description="python module to run instead of a script")
    args: list[str] = Field(default_factory=list, description="arguments for the script")
    python: str | None = Field(
        None, description="interpreter on the nodes (default: the one gpud runs under)"
    )
    workdir: str | None = Field(None, description="working directory (relative to this file)")
    env: dict[str, str | None] = Field(
        default_factory=dict,
        description="extra environment; a number or true/false is taken as its text, and"
        " null removes a variable the processes would otherwise inherit or get from gpud",
    )
    distributed_env: bool | None = Field(
        None,
        description="give a `launcher: python` process RANK, WORLD_SIZE, LOCAL_RANK and"
        " MASTER_* as torchrun would (default: not, so a script does not take itself for"
        " one rank of many); the other launchers set them themselves",
    )
    backend: Literal["nccl", "gloo", "auto"] = Field(
        "auto", description="auto: nccl on GPUs, gloo on CPU"
    )
    master_addr: str | None = Field(
        None, description="rendezvous host (default: node 0's host as gpuctl reaches it)"
    )
    deepspeed: DeepSpeedSettings | None = None
    accelerate: AccelerateSettings | None = None
    training: TrainingHints = Field(default_factory=TrainingHints)
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    resume: ResumeSettings = Field(default_factory=ResumeSettings)
    restart: RestartSettings = Field(default_factory=RestartSettings)
    elastic: ElasticSettings | None = Field(
        None, description="continue on fewer nodes when one is lost (default: the whole gang)"
    )
    preflight: bool = Field(
        True,
        description="check each GPU before an attempt takes it (hardware slowdown, a recent"
        " XID, memory no process holds) and leave out those that fail",
    )
    stop_grace_s: float = Field(
        30.0, ge=0, le=3600, description="how long a stop waits for the checkpoint handshake"
    )
    lost_after_s: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="a node that does not answer for this long is lost: its part of the run"
        " ends as `lost` and the run fails (or restarts once every node answers again)",
    )
    metrics: list[MetricPattern] | Literal["auto", "none"] = Field(
        "auto",
        description="log-line regexes for scripts without the trainers library; `auto` (the"
        " default, as is an empty list): gpud's recognizers of Hugging Face Trainer, Lightning,"
        " nanoGPT, torchtitan, DeepSpeed and tqdm output; `none`: no metrics from the output",
    )
    logs: LogSettings = Field(default_factory=LogSettings)
    nccl: NcclSettings = Field(default_factory=NcclSettings)
    wandb: WandbSettings | None = None
    notify: list[Webhook] = Field(
        default_factory=list,
        max_length=16,
        description="webhooks for this run's alerts (failed, stalled, hang, quarantine;"
        " succeeded if asked), besides the daemons' own; each URL is a secret",
    )
    slurm: SlurmSettings | None = Field(
        None, description="submit to Slurm instead of gpud's nodes (`gpuctl launch --slurm`)"
    )
    allow_outside_scheduler: bool = Field(
        False,
        description="let gpud start this run on a Slurm compute node, outside Slurm (most"
        " clusters forbid it)",
    )

    @property
    def metric_patterns(self) -> list[str]:
        """The spec's own metric regexes (none under `auto` or `none`)."""
        return [m.pattern for m in self.metrics] if isinstance(self.metrics, list) else []

    @property
    def auto_metrics(self) -> bool:
        """gpud's recognizers read the output: `metrics: auto`, or no patterns given."""
        return self.metrics in ("auto", [])

    @field_validator("metrics", mode="before")
    @classmethod
    def _metrics(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in ("auto", "none"):
            raise ValueError(f"{value!r}: give a list of patterns, `auto` or `none`")
        return value

    @field_validator("nproc_per_node", mode="before")
    @classmethod
    def _nproc(cls, value: Any) -> Any:
        if value == "auto" or (
            isinstance(value, int) and not isinstance(value, bool) and value >= 1
        ):
            return value
        raise ValueError(f"expected a positive number of processes or 'auto', got {value!r}")

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: Any) -> Any:
        if value is None or value == "all":
            return value
        if isinstance(value, str):  # "0,1,2,3", as the guides write --gpus
            value = [int(e) if e.strip().isdigit() else e.strip() for e in value.split(",")]
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 1:
                raise ValueError(f"expected at least 1 GPU, got {value}")
            return value
        if not isinstance(value, list) or not value:
            raise ValueError(
                f"expected a count, a list of GPU indices or UUIDs, or 'all'; got {value!r}"
            )
        seen: set[int | str] = set()
        for entry in value:
            ok_index = isinstance(entry, int) and not isinstance(entry, bool) and entry >= 0
            ok_uuid = isinstance(entry, str) and entry.strip() != ""
            if not (ok_index or ok_uuid):
                raise ValueError(f"{entry!r} is neither a GPU index nor a UUID")
            if entry in seen:
                raise ValueError(f"GPU {entry!r} is listed twice")
            seen.add(entry)
        return value

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: list[str]) -> list[str]:
        endpoints = []
        for text in value:
            try:
                endpoints.append(parse_endpoint(text))
            except AddressError as exc:
                raise ValueError(str(exc)) from None
        if len(set(endpoints)) != len(endpoints):
            raise ValueError("a node is listed twice")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env_text(cls, value: Any) -> Any:
        """`--set env.X=1` and `X: 1` in YAML mean the text "1", as a shell would have it."""
        if not isinstance(value, dict):
            return value
        return {key: _env_value(v) for key, v in value.items()}

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str | None]) -> dict[str, str | None]:
        for key in value:
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if key.startswith(RESERVED_ENV_PREFIX) and not key.startswith(TEST_HOOK_PREFIX):
                raise ValueError(f"{key} is set by gpud itself; use another name")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> RunSpec:
        if (self.script is None) == (self.module is None):
            raise ValueError("give exactly one of `script` and `module`")
        if self.distributed_env is not None and self.launcher is not Launcher.PYTHON:
            raise ValueError(
                "distributed_env is for launcher: python; torchrun, deepspeed and accelerate"
                " always give their ranks RANK and WORLD_SIZE"
            )
        if self.launcher is Launcher.PYTHON:
            if self.nproc_per_node not in (1, "auto"):
                raise ValueError("launcher: python starts one process; use nproc_per_node: 1")
            if len(self.nodes) > 1:
                raise ValueError("launcher: python runs on one node; use torchrun for several")
        if self.deepspeed is not None and self.launcher not in (
            Launcher.DEEPSPEED,
            Launcher.TORCHRUN,
        ):
            raise ValueError(
                "`deepspeed` settings need launcher: deepspeed (or torchrun, with "
                "deepspeed.initialize inside the script)"
            )
        if self.accelerate is not None and self.launcher is not Launcher.ACCELERATE:
            raise ValueError("`accelerate` settings need launcher: accelerate")
        if self.backend == "nccl" and self.accelerate is not None and self.accelerate.use_cpu:
            raise ValueError("backend: nccl needs GPUs, but accelerate.use_cpu is true")
        if self.elastic is not None:
            check_elastic(self.elastic, self.nodes or None, self.restart, self.launcher)
        return self

    @property
    def entry(self) -> str:
        return self.script or self.module or ""


def check_elastic(
    elastic: ElasticSettings,
    nodes: list[str] | None,
    restart: RestartSettings,
    launcher: Launcher,
) -> None:
    """What an elastic spec needs; `nodes` None when gpuctl will give them (--node)."""
    if launcher is Launcher.PYTHON:
        raise ValueError("elastic: launcher: python runs on one node; use torchrun")
    if restart.max_attempts < 1:
        raise ValueError(
            "elastic: the next attempt on the healthy nodes is a restart; set"
            " restart.max_attempts to 1 or more"
        )
    if nodes is None:
        return
    if elastic.min_nodes > len(nodes):
        raise ValueError(
            f"elastic.min_nodes {elastic.min_nodes} is more than the {len(nodes)} node(s) listed"
        )
    overlap = sorted(set(elastic.spares) & set(nodes))
    if overlap:
        raise ValueError(f"elastic.spares: {', '.join(overlap)} is already one of the nodes")


def _env_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return str(value)
    return value


# --------------------------------------------------------------------------- loading


#: A spec file's bounds: its size, how deep it nests, and how many values it holds once
#: its aliases are expanded (a YAML "billion laughs" holds 10^9 in a few hundred bytes).
SPEC_MAX_BYTES = 1024 * 1024
SPEC_MAX_DEPTH = 64
SPEC_MAX_VALUES = 200_000
#: … and how many characters its values hold expanded (what the wire would carry).
SPEC_MAX_EXPANDED = 4 * 1024 * 1024


class SpecTooLarge(yaml.YAMLError):
    """A spec past one of its bounds (a YAMLError: said as the file's one line)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class _SpecLoader(yaml.SafeLoader):
    """YAML 1.2's booleans (true/false only): under YAML 1.1's, `restart: {on: [user]}`
    read as `{True: [user]}` and failed with a line no one could act on. A value such as
    `queue: yes` still validates as true (pydantic reads yes/no/on/off).

    Bounded: nesting past SPEC_MAX_DEPTH is refused as it is read (the composer recurses:
    10,000 levels were a RecursionError), and a document whose aliases expand past
    SPEC_MAX_VALUES before anything is built from it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > SPEC_MAX_DEPTH:
                raise SpecTooLarge(f"nested more than {SPEC_MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_BOOL = "tag:yaml.org,2002:bool"
_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _expanded(node: yaml.Node, memo: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(values, characters) `node` holds with every alias expanded: each shared node is
    counted once per use, computed once. Stops adding up past the bounds."""
    known = memo.get(id(node))
    if known is not None:
        return known
    values, chars = 1, 2
    if isinstance(node, yaml.ScalarNode):
        chars = len(node.value) + 2
    else:
        children = (
            node.value
            if isinstance(node, yaml.SequenceNode)
            else [child for pair in node.value for child in pair]
        )
        for child in children:
            more = _expanded(child, memo)
            values, chars = values + more[0], chars + more[1]
            if values > SPEC_MAX_VALUES or chars > SPEC_MAX_EXPANDED:
                break
    memo[id(node)] = values, chars
    return values, chars


def _yaml(text: str) -> Any:
    """One YAML document, within the spec's bounds (a SafeLoader: no tags, no objects)."""
    if len(text) > SPEC_MAX_BYTES:
        raise SpecTooLarge(
            f"{len(text) / 2**20:.1f} MiB; a spec is at most {SPEC_MAX_BYTES // 2**20} MiB"
        )
    loader = _SpecLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        values, chars = _expanded(node, {})
        if values > SPEC_MAX_VALUES or chars > SPEC_MAX_EXPANDED:
            raise SpecTooLarge(
                f"more than {SPEC_MAX_VALUES:,} values or {SPEC_MAX_EXPANDED // 2**20} MiB"
                " once its aliases are expanded"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _split_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise SpecError(f"--set {text!r}: expected KEY.PATH=VALUE")
    path, raw = text.split("=", 1)
    keys = [k for k in path.strip().split(".")]
    if not all(keys):
        raise SpecError(f"--set {text!r}: empty key in {path!r}")
    try:
        value = _yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return keys, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`--set training.max_steps=100 --set args=[--fast]` on top of the file's mapping."""
    for text in overrides:
        keys, value = _split_override(text)
        node: dict[str, Any] = data
        for i, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                where = ".".join(keys[: i + 1])
                raise SpecError(f"--set {text!r}: {where} is not a mapping")
            node = child
        node[keys[-1]] = value
    return data


@dataclass(frozen=True)
class SpecSource:
    """Where a spec's values came from, so an error names what the user has to fix: the
    file, or the `--set` override (or `--name`) that set the failing key or a parent of it."""

    file: str
    overrides: tuple[str, ...] = ()
    name: str | None = None

    def of(self, loc: Sequence[object]) -> str:
        keys = [str(part) for part in loc]
        if self.name is not None and keys[:1] == ["name"]:
            return f"--name {shlex.quote(self.name)}"  # applied last: it wins
        for text in reversed(self.overrides):  # a later override wins over an earlier one
            path, _ = _split_override(text)
            if keys[: len(path)] == path:
                return f"--set {shlex.quote(text)}"
        return self.file


def _known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The valid keys at `loc` (for 'did you mean')."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        candidates = [a for a in getattr(annotation, "__args__", (annotation,)) if a is not None]
        models = [a for a in candidates if isinstance(a, type) and issubclass(a, BaseModel)]
        if not models:
            for arg in candidates:  # list[MetricPattern]
                inner = [
                    a
                    for a in getattr(arg, "__args__", ())
                    if isinstance(a, type) and issubclass(a, BaseModel)
                ]
                models.extend(inner)
        if not models:
            return []
        current = models[0]
    return list(getattr(current, "model_fields", {}))


def _other_form(part: object) -> bool:
    """A path step of the literal form of a field that also takes a list or a model."""
    return isinstance(part, str) and part.startswith("literal[")


def describe_spec_error(exc: ValidationError, source: str | SpecSource) -> str:
    """One line: `file: key.path: what was expected`, with a suggestion for typos; `--set
    key.path=value` instead of the file when an override set that key."""
    # A field of several forms (`metrics`: patterns, `auto` or `none`) fails in each: a
    # list's errors are about the list, not that it is not `auto`. Pydantic names the form
    # in the path (`list[MetricPattern]`); no key of ours has a `[`.
    errors = [e for e in exc.errors() if not any(_other_form(p) for p in e["loc"])]
    errors = errors or exc.errors()
    # A typo usually also makes a required key "missing": report the typo first.
    errors = sorted(errors, key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and "[" in p))
    if isinstance(source, SpecSource):
        source = source.of(loc)
    where = ".".join(str(p) for p in loc)
    if first["type"] == "extra_forbidden":
        known = _known_keys(RunSpec, loc)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        if close:
            hint = f" (did you mean {close[0]!r}?)"
        elif 0 < len(known) <= 8:
            hint = f" (expected one of: {', '.join(known)})"
        else:
            hint = ""
        message = f"unknown key{hint}"
    else:
        message = first["msg"].removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {where + ': ' if where else ''}{message}{more}"


def parse_spec(data: Any, source: str | SpecSource = "spec") -> RunSpec:
    """Validate an already-loaded mapping."""
    file = source.file if isinstance(source, SpecSource) else source
    if not isinstance(data, dict):
        raise SpecError(f"{file}: a run spec is a mapping of key: value")
    try:
        return RunSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(describe_spec_error(exc, source)) from None
    except Exception as exc:  # a validator that failed in an unforeseen way: still one line
        raise SpecError(f"{file}: cannot be validated ({type(exc).__name__})") from None


def _resolve_paths(data: dict[str, Any], base: Path, source: SpecSource) -> dict[str, Any]:
    """Make `workdir` and `checkpoint.dir` absolute and inline `deepspeed.config`.

    `workdir` and `deepspeed.config` are relative to the spec file, `checkpoint.dir` to the
    workdir (else the spec file's directory): daemons refuse relative paths, which they
    could only resolve against their own working directory.
    """
    workdir = data.get("workdir")
    if isinstance(workdir, str):
        data["workdir"] = str((base / workdir).resolve())
    checkpoint = data.get("checkpoint")
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("dir"), str):
        root = Path(data["workdir"]) if isinstance(data.get("workdir"), str) else base
        checkpoint["dir"] = str((root / checkpoint["dir"]).resolve())
    deepspeed = data.get("deepspeed")
    if isinstance(deepspeed, dict) and isinstance(deepspeed.get("config"), str):
        path = (base / deepspeed["config"]).resolve()
        origin = source.of(("deepspeed", "config"))
        try:
            if path.stat().st_size > SPEC_MAX_BYTES:
                raise SpecError(
                    f"{origin}: deepspeed.config: {path} is over"
                    f" {SPEC_MAX_BYTES // 2**20} MiB (a DeepSpeed config is a few kB)"
                )
            content = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SpecError(f"{origin}: deepspeed.config: cannot read {path}: {exc}") from None
        if not isinstance(content, dict):
            raise SpecError(f"{origin}: deepspeed.config: {path} must hold a JSON object")
        deepspeed["config"] = content
    return data


def require_absolute_paths(spec: RunSpec, source: str = "spec") -> None:
    """What a daemon checks: a relative path would resolve against its own working dir."""
    for where, value in (("workdir", spec.workdir), ("checkpoint.dir", spec.checkpoint.dir)):
        if value is not None and not Path(value).is_absolute():
            raise SpecError(
                f"{source}: {where}: {value!r} is relative; send an absolute path "
                "(gpuctl resolves relative ones against the config file)"
            )


def load_spec(path: Path, overrides: list[str] | None = None, name: str | None = None) -> RunSpec:
    """Read, override (`--set key.path=value`, then `--name`), resolve and validate a YAML
    run spec. An error names the override that set the bad value, else the file."""
    source = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{source}: cannot read: {exc.strerror}") from None
    try:
        data = _yaml(text)
    except SpecTooLarge as exc:
        raise SpecError(f"{source}: too large: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{source}{at}: not valid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a run spec is a mapping of key: value")
    data = apply_overrides(data, overrides or [])
    if name is not None:
        data["name"] = name
    origins = SpecSource(source, tuple(overrides or ()), name)
    data = _resolve_paths(data, path.resolve().parent, origins)
    return parse_spec(data, origins)


def spec_json_schema() -> dict[str, Any]:
    """The JSON schema editors use for run specs (config/schema/runspec.schema.json)."""
    schema = RunSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gpud run spec"
    return schema
