"""Run specs: examples parse, bad configs fail with the right one-line message, schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch.sections import Launcher, SpecError
from launch.spec import apply_overrides, load_spec, parse_spec, spec_json_schema

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "config" / "examples").glob("*.yaml"))
SCHEMA = ROOT / "config" / "schema" / "runspec.schema.json"

MINIMAL = "name: t\nscript: train.py\n"


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_there_are_examples_for_every_documented_case() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {
        "cpu-ddp",
        "ddp-4gpu",
        "deepspeed-zero2-offload",
        "accelerate-fp16",
        "multinode-2x4",
        "unmodified-script",
        "single-process",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_parses(path: Path) -> None:
    spec = load_spec(path)
    assert spec.name
    if spec.workdir:
        assert Path(spec.workdir).is_absolute()
    if spec.script and spec.workdir and spec.workdir.startswith(str(ROOT)):
        assert (Path(spec.workdir) / spec.script).exists(), f"{path.name} names a missing script"


def test_cpu_ddp_is_what_the_issue_describes() -> None:
    spec = load_spec(ROOT / "config/examples/cpu-ddp.yaml")
    assert (spec.launcher, spec.nproc_per_node, spec.backend) == (Launcher.TORCHRUN, 2, "gloo")
    assert spec.script == "trainers/examples/ddp.py"
    assert spec.workdir == str(ROOT)
    short = load_spec(ROOT / "config/examples/cpu-ddp.yaml", ["training.max_steps=50"])
    assert short.training.max_steps == 50 and short.training.lr == spec.training.lr


def test_deepspeed_json_template_is_inlined() -> None:
    spec = load_spec(ROOT / "config/examples/deepspeed-zero3-json.yaml")
    assert spec.deepspeed is not None and isinstance(spec.deepspeed.config, dict)
    assert spec.deepspeed.config["zero_optimization"]["stage"] == 3


def test_overrides_set_nested_keys_with_yaml_values() -> None:
    data = apply_overrides(
        {"name": "a", "training": {"lr": 1.0}},
        ["training.max_steps=10", "args=[--fast, '1']", "nccl.debug=INFO", "env.X=1"],
    )
    assert data["training"] == {"lr": 1.0, "max_steps": 10}
    assert data["args"] == ["--fast", "1"]
    assert data["nccl"] == {"debug": "INFO"}
    with pytest.raises(SpecError, match=r"expected KEY\.PATH=VALUE"):
        apply_overrides({}, ["oops"])
    with pytest.raises(SpecError, match="name is not a mapping"):
        apply_overrides({"name": "a"}, ["name.x=1"])


BAD_CONFIGS = [
    ("traning:\n  lr: 1\n", "traning: unknown key (did you mean 'training'?)"),
    (
        "training:\n  lr: 1\n  batch_szie: 3\n",
        "training.batch_szie: unknown key (did you mean 'batch_size_per_gpu'?)",
    ),
    ("nproc_per_node: many\n", "nproc_per_node: expected a positive number of processes or 'auto'"),
    ("nproc_per_node: 0\n", "nproc_per_node"),
    (
        "launcher: slurm\n",
        "launcher: Input should be 'torchrun', 'deepspeed', 'accelerate' or 'python'",
    ),
    ("backend: mpi\n", "backend: Input should be 'nccl', 'gloo' or 'auto'"),
    ("module: pkg.train\n", "give exactly one of `script` and `module`"),
    (
        "deepspeed:\n  zero_stage: 4\n",
        "deepspeed.zero_stage: Input should be less than or equal to 3",
    ),
    ("deepspeed:\n  offload_params: true\n", "deepspeed.offload_params needs zero_stage: 3"),
    (
        "deepspeed:\n  zero_stage: 0\n  offload_optimizer: true\n",
        "offload_optimizer needs zero_stage 1, 2 or 3",
    ),
    ("deepspeed:\n  precision: fp8\n", "deepspeed.precision"),
    (
        "launcher: accelerate\ndeepspeed:\n  zero_stage: 2\n",
        "`deepspeed` settings need launcher: deepspeed",
    ),
    ("accelerate:\n  mixed_precision: fp16\n", "`accelerate` settings need launcher: accelerate"),
    ("launcher: accelerate\naccelerate:\n  mixed_precision: half\n", "accelerate.mixed_precision"),
    ("launcher: python\nnproc_per_node: 2\n", "launcher: python starts one process"),
    ("launcher: python\nnodes: [a:1, b:1]\n", "launcher: python runs on one node"),
    ("nodes: ['bad host:1']\n", "nodes: expected HOST:PORT"),
    ("nodes: [a:7711, 'tcp://a:7711']\n", "a node is listed twice"),
    ("env:\n  GPUD_RUN_ID: x\n", "GPUD_RUN_ID is set by gpud itself"),
    ("env:\n  1BAD: x\n", "is not an environment variable name"),
    ("training:\n  lr_scaling: linear\n", "training.lr_scaling: linear needs training.lr"),
    ("training:\n  lr: -1\n", "training.lr: Input should be greater than 0"),
    ("training:\n  max_steps: 0\n", "training.max_steps"),
    ("metrics:\n  - pattern: 'loss ([0-9.]+)'\n", "metrics.0.pattern: needs a named group"),
    ("metrics:\n  - pattern: 'loss (?P<loss>[0-9.]+'\n", "metrics.0.pattern: not a valid regex"),
    ("metrics:\n  - regex: x\n", "metrics.0.regex: unknown key (expected one of: pattern)"),
    ("restart:\n  max_attempts: -1\n", "restart.max_attempts"),
    ("stop_grace_s: forever\n", "stop_grace_s"),
    ("checkpoint:\n  keep_last: 0\n", "checkpoint.keep_last"),
    ("resume:\n  latest: oldest\n", "resume.latest"),
    ("wandb:\n  mode: loud\n", "wandb.mode"),
    ("nccl:\n  debug: LOUD\n", "nccl.debug"),
    ("name: 'has space'\n", "name: String should match pattern"),
    ("args: --fast\n", "args: Input should be a valid list"),
    ("notify:\n  - url: ftp://x/y\n", "notify.0.url: expected an http:// or https:// URL"),
    ("notify:\n  - url: https://x/y\n    formt: slack\n", "notify.0.formt: unknown key"),
    ("logs:\n  max_bytes: lots\n", "logs.max_bytes: expected a size such as 100MB"),
    ("logs:\n  max_bytes: 10kB\n", "logs.max_bytes: '10kB' is below the least bound, 64 kB"),
    ("logs:\n  max_byte: 1GB\n", "logs.max_byte: unknown key (did you mean 'max_bytes'?)"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_CONFIGS, ids=[f[1][:40] for f in BAD_CONFIGS])
def test_bad_configs_are_rejected_naming_file_and_key(
    tmp_path: Path, text: str, fragment: str
) -> None:
    base = MINIMAL if "name:" not in text else "script: train.py\n"
    if text.startswith("module:"):
        base = "name: t\nscript: train.py\n"
    path = write(tmp_path, base + text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    assert fragment in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("overrides", "name", "origin", "fragment"),
    [
        (["training.max_steps=abc"], None, "--set training.max_steps=abc", "training.max_steps:"),
        # A parent key set by an override: the override is still what to fix.
        (["training={max_steps: abc}"], None, "--set 'training={max_steps: abc}'", "max_steps"),
        (["training.max_stepz=5"], None, "--set training.max_stepz=5", "did you mean"),
        # The later of two overrides of the same key is the one that counts.
        (["stop_grace_s=1", "stop_grace_s=-1"], None, "--set stop_grace_s=-1", "stop_grace_s:"),
        (["deepspeed.config=nope.json"], None, "--set deepspeed.config=nope.json", "cannot read"),
        ([], "has space", "--name 'has space'", "name: String should match pattern"),
        (["name=has space"], None, "--set 'name=has space'", "name: String should match"),
    ],
)
def test_an_error_in_an_override_names_the_override(
    tmp_path: Path, overrides: list[str], name: str | None, origin: str, fragment: str
) -> None:
    path = write(tmp_path, MINIMAL)
    with pytest.raises(SpecError) as err:
        load_spec(path, overrides, name)
    message = str(err.value)
    assert message.startswith(f"{origin}: "), message
    assert fragment in message and str(path) not in message, message


def test_an_error_in_the_file_still_names_the_file_under_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "training:\n  max_steps: abc\n")
    with pytest.raises(SpecError) as err:
        load_spec(path, ["training.lr=0.1", "stop_grace_s=2"], "fine")
    assert str(err.value).startswith(f"{path}: training.max_steps: "), str(err.value)
    # --name is a plain string, never YAML: a numeric name is a name.
    assert load_spec(write(tmp_path, MINIMAL), [], "123").name == "123"


def test_bad_table_is_big_enough() -> None:
    assert len(BAD_CONFIGS) >= 20


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("name: [unclosed\n", ":2:1: not valid YAML"),
        ("- a list\n", "a run spec is a mapping"),
        (
            "name: t\nscript: x.py\ndeepspeed:\n  config: missing.json\n",
            "deepspeed.config: cannot read",
        ),
        (
            "name: t\nscript: x.py\ndeepspeed:\n  config: ds.json\n  zero_stage: 3\n",
            "are exclusive",
        ),
    ],
)
def test_file_level_errors(tmp_path: Path, text: str, fragment: str) -> None:
    (tmp_path / "ds.json").write_text("{}")
    path = write(tmp_path, text)
    with pytest.raises(SpecError, match=None) as err:
        load_spec(path)
    assert fragment in str(err.value), str(err.value)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "nope.yaml")


def test_parse_spec_refuses_non_mappings() -> None:
    with pytest.raises(SpecError, match="mapping"):
        parse_spec([1, 2])


def test_json_schema_has_not_drifted_from_the_models() -> None:
    shipped = json.loads(SCHEMA.read_text())
    assert shipped == spec_json_schema(), (
        "config/schema/runspec.schema.json is stale: regenerate it with `gpuctl schema > "
        "config/schema/runspec.schema.json`"
    )


def test_schema_forbids_unknown_keys_for_editors() -> None:
    schema = spec_json_schema()
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["TrainingHints"]["additionalProperties"] is False


def test_logs_max_bytes_takes_a_size_and_defaults_to_the_daemons(tmp_path: Path) -> None:
    assert load_spec(write(tmp_path, MINIMAL)).logs.max_bytes is None
    spec = load_spec(write(tmp_path, MINIMAL + "logs:\n  max_bytes: 200kB\n"))
    assert spec.logs.max_bytes == 200_000
    assert load_spec(write(tmp_path, MINIMAL), ["logs.max_bytes=2GiB"]).logs.max_bytes == 2**31


def test_yaml_on_off_yes_no_are_words_in_keys_and_still_booleans_in_values(
    tmp_path: Path,
) -> None:
    # YAML 1.1 reads `on:` as the key True: `restart: {on: [user]}` was refused with
    # "restart.1: Keys should be strings"
    path = write(
        tmp_path,
        "name: r\nscript: train.py\nqueue: yes\nrestart: {max_attempts: 1, on: [user, signal]}\n",
    )
    spec = load_spec(path)
    assert [kind.value for kind in spec.restart.on] == ["user", "signal"]
    assert spec.queue is True
    again = load_spec(path, ["restart.on=[hang]", "queue=off"])
    assert [kind.value for kind in again.restart.on] == ["hang"] and again.queue is False


def test_metrics_auto_none_or_patterns(tmp_path: Path) -> None:
    """Issue 32 §2: no patterns is `auto` (gpud's recognizers); `none` turns it off."""
    plain = load_spec(write(tmp_path, MINIMAL))
    assert plain.metrics == "auto" and plain.auto_metrics and plain.metric_patterns == []
    assert load_spec(write(tmp_path, MINIMAL + "metrics: []\n")).auto_metrics
    off = load_spec(write(tmp_path, MINIMAL + "metrics: none\n"))
    assert not off.auto_metrics and off.metric_patterns == []
    own = load_spec(write(tmp_path, MINIMAL + "metrics: [{pattern: 'loss (?P<loss>[0-9.]+)'}]\n"))
    assert not own.auto_metrics and own.metric_patterns == ["loss (?P<loss>[0-9.]+)"]
    with pytest.raises(SpecError) as bad:
        load_spec(write(tmp_path, MINIMAL + "metrics: autoo\n"))
    assert str(bad.value).endswith(
        "run.yaml: metrics: 'autoo': give a list of patterns, `auto` or `none`"
    )


def _laughs(levels: int) -> str:
    """A YAML "billion laughs" in deepspeed.extra: 10**levels values in a few lines."""
    lines = ['    l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for n in range(1, levels):
        lines.append(f"    l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 10) + "]")
    return MINIMAL + "deepspeed:\n  extra:\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (  # 10,000 levels: the composer's recursion was a 2,997-line RecursionError
            MINIMAL.replace(
                "script: train.py", "script: train.py\nargs: " + "[" * 10_000 + "]" * 10_000
            ),
            "too large: nested more than 64 levels deep",
        ),
        (  # 10**9 values, and gpuctl grew past 3 GB
            _laughs(9),
            "too large: more than 200,000 values or 4 MiB once its aliases are expanded",
        ),
        (  # few values, but a long string used a thousand times
            MINIMAL
            + "env:\n  A: &a "
            + "x" * 10_000
            + "\nargs: ["
            + ", ".join(["*a"] * 1000)
            + "]\n",
            "too large: more than 200,000 values or 4 MiB once its aliases are expanded",
        ),
        (MINIMAL + "# " + "x" * 1_100_000 + "\n", "too large: 1.0 MiB; a spec is at most 1 MiB"),
    ],
    ids=["deep", "billion-laughs", "long-alias", "big-file"],
)
def test_a_spec_past_its_bounds_is_one_line(tmp_path: Path, text: str, said: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(err.value) == f"{path}: {said}"


def test_anchors_and_aliases_within_the_bounds_still_work(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, MINIMAL + "env: &e {A: '1'}\ndeepspeed:\n  extra:\n"
                           "    a: &a [1, 2]\n    b: [*a, *a]\n"))  # fmt: skip
    assert spec.deepspeed is not None and spec.deepspeed.extra == {"a": [1, 2], "b": [[1, 2]] * 2}
    assert load_spec(write(tmp_path, _laughs(5))).deepspeed is not None  # 100,000 values
