"""The user's scaling baselines: what `gpuctl scaling` measured, by spec name.

`<config-dir>/scaling.json` keeps one `ScalingResult` per spec name, the latest
measurement of that name, with the hardware it was measured on. gpuctl writes it; gputop
reads it to show a live run's efficiency against linear. Next to `nodes.json`: it belongs
to the user, like their keys, not to a daemon.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpud.node.paths import atomic_write, config_dir, exclusive
from gpud.scaling.arithmetic import ScalingResult

BASELINES = "scaling.json"


class BaselineFileError(ValueError):
    """A baselines file that cannot be read; `str()` says which and what to do."""


class Baselines(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    baselines: dict[str, ScalingResult] = Field(
        default_factory=dict, description="spec name → its latest scaling measurement"
    )


def baselines_path() -> Path:
    return config_dir() / BASELINES


def load_baselines(path: Path | None = None) -> Baselines:
    path = path or baselines_path()
    try:
        return Baselines.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return Baselines()
    except (ValidationError, OSError) as exc:
        why = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else exc.strerror
        raise BaselineFileError(
            f"{path} is not a readable baselines file ({why}); fix or delete it"
        ) from None


def save_baseline(result: ScalingResult, path: Path | None = None) -> Path:
    """Keep `result` as its spec's baseline, replacing an older one of that name."""
    path = path or baselines_path()
    with exclusive(path):
        current = load_baselines(path)
        kept = {**current.baselines, result.name: result}
        atomic_write(path, Baselines(baselines=kept).model_dump_json(indent=2).encode())
    return path
