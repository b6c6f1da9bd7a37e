"""gpuctl against real daemons: nodes, hw, keys, and its exit codes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.daemons import RunningDaemon, complete, free_port, gpuctl
from tests.support.runs import CPU_DDP, FAST, launch, script_spec, wait_for


def test_two_daemons_on_one_machine_both_show_in_nodes(
    daemons: Callable[..., RunningDaemon],
) -> None:
    a = daemons(node="alpha")
    b = daemons(node="beta", simulate_gpus=4)
    result = gpuctl("--node", a.address, "--node", b.address, "--json", "nodes")
    assert result.returncode == 0, result.stderr
    nodes = {n["info"]["node"]: n for n in json.loads(result.stdout)["nodes"]}
    assert set(nodes) == {"alpha", "beta"}
    assert nodes["alpha"]["info"]["gpu_count"] == 8 and nodes["beta"]["info"]["gpu_count"] == 4
    assert all(n["reachable"] and n["info"]["simulated"] for n in nodes.values())
    # Without --node, gpuctl lists every node it knows: both daemons recorded themselves.
    table = gpuctl("nodes")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["ADDRESS", "NODE", "STATUS", "GPUS"]
    assert any(
        line.startswith(a.address) and "alpha" in line and "online" in line for line in lines
    )
    assert any(
        line.startswith(b.address) and "beta" in line and "4 (simulated)" in line for line in lines
    )


def test_hw_json_lists_simulated_gpus_with_recommendations(daemon: RunningDaemon) -> None:
    result = gpuctl("--node", daemon.address, "hw", "--json")
    assert result.returncode == 0, result.stderr
    (node,) = json.loads(result.stdout)["nodes"]
    assert node["simulated"] is True and node["error"] is None
    assert len(node["gpus"]) == 8
    assert all(g["simulated"] and g["memory_total_bytes"] > 80e9 for g in node["gpus"])
    rec = node["recommendation"]
    assert rec["memory_class"] == "≥80 GB" and rec["gpus"] == 8
    assert rec["mixed_precision"] == "bf16" and rec["zero_stage"] == 2
    assert rec["batch_size_per_gpu"] * 8 * rec["gradient_accumulation"] == rec["effective_batch"]
    assert rec["effective_batch"] >= rec["target_batch"] == 256


def test_hw_text_report(daemon: RunningDaemon) -> None:
    result = gpuctl("--node", daemon.address, "hw", "--target-batch", "1024")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "[SIMULATED GPUs]" in out
    assert out.count("NVIDIA H100 80GB HBM3") == 8
    assert "Recommended training settings — memory class ≥80 GB, 8 GPU(s), target batch 1024" in out
    assert "DeepSpeed ZeRO stage" in out and "bf16" in out


def test_exit_codes(daemons: Callable[..., RunningDaemon], tmp_path: Path) -> None:
    d = daemons()
    # 2: usage and config errors, one line each
    for args, fragment in [
        (["--node", "bad host:1", "nodes"], "expected HOST:PORT"),
        (["--node", f"127.0.0.1:{free_port()}", "hw"], "no server key is known"),
        (["hw", "--target-batch", "0"], "--target-batch"),
        (
            ["launch", str(CPU_DDP), "--set", "training.max_steps=abc"],
            "error: --set training.max_steps=abc: training.max_steps: Input should be",
        ),
        (["frobnicate"], "No such command"),
    ]:
        result = gpuctl(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert fragment in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    # 3: unreachable — a known node whose daemon is gone
    address = d.address
    assert d.stop() == 0
    result = gpuctl("--node", address, "--timeout", "2", "hw")
    assert result.returncode == 3
    assert f"nothing is listening at {address}" in result.stderr
    nodes = gpuctl("--node", address, "--json", "nodes")
    assert nodes.returncode == 3
    (entry,) = json.loads(nodes.stdout)["nodes"]
    assert entry["reachable"] is False and "nothing is listening" in entry["error"]


def test_a_node_gpuctl_has_never_seen_is_unknown_on_its_row(daemon: RunningDaemon) -> None:
    stranger = "127.0.0.1:1"
    result = gpuctl("--node", daemon.address, "--node", stranger, "nodes")
    assert result.returncode == 2, (result.stdout, result.stderr)  # a config error: no key
    assert result.stderr == ""
    header, ours, theirs = result.stdout.splitlines()
    assert header.split()[:3] == ["ADDRESS", "NODE", "STATUS"]
    assert ours.split()[:3] == [daemon.address, "node0", "online"]
    assert theirs.split()[:3] == [stranger, "-", "UNKNOWN"]
    assert f"no server key is known for {stranger}" in theirs
    assert f"gpuctl keys trust {stranger} SERVER_KEY" in theirs
    alone = gpuctl("--node", stranger, "--json", "nodes")
    assert alone.returncode == 2 and "Traceback" not in alone.stderr
    (entry,) = json.loads(alone.stdout)["nodes"]
    assert (entry["address"], entry["reachable"], entry["known"]) == (stranger, False, False)


def test_verbs_that_read_ask_every_known_node_unless_told(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    """hw, ps, status and logs read the nodes `gpuctl nodes` and gputop show."""
    alpha, beta = daemons(node="alpha"), daemons(node="beta")
    runs = {}
    for daemon in (alpha, beta):
        code = f"print('hello from {daemon.node}')"
        spec = script_spec(tmp_path, code, name=f"on-{daemon.node}")
        runs[daemon.node] = launch(daemon, config=spec)
    for daemon in (alpha, beta):
        wait_for(daemon, runs[daemon.node], {"succeeded"})

    ps = gpuctl("ps")
    assert ps.returncode == 0, ps.stderr
    header, *rows = (line.split() for line in ps.stdout.splitlines())
    where = {row[0]: row[header.index("NODE")] for row in rows}
    assert where == {runs["alpha"]: "alpha", runs["beta"]: "beta"}
    status = gpuctl("--json", "status", "on-beta")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["run"]["id"] == runs["beta"]
    logs = gpuctl("logs", "on-beta")
    assert logs.returncode == 0 and logs.stdout.strip() == "hello from beta", logs.stderr
    hw = gpuctl("--json", "hw")
    assert hw.returncode == 0, hw.stderr
    assert {n["node"] for n in json.loads(hw.stdout)["nodes"]} == {"alpha", "beta"}
    # --node narrows it.
    only = gpuctl("--node", alpha.address, "--json", "ps")
    assert [r["id"] for r in json.loads(only.stdout)["runs"]] == [runs["alpha"]]
    # A known node that is down: the others still answer, and the exit code says so.
    assert beta.stop() == 0
    ps = gpuctl("--timeout", "2", "ps")
    assert ps.returncode == 3 and runs["alpha"] in ps.stdout
    assert f"nothing is listening at {beta.address}" in ps.stderr
    status = gpuctl("--timeout", "2", "status", "on-alpha")
    assert status.returncode == 0 and runs["alpha"] in status.stdout, status.stderr


def test_remote_style_set_up_with_keys_authorize_and_trust(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """A 'laptop' with its own config dir gets viewer access the way a remote user would."""
    laptop = {"GPUD_CONFIG_DIR": str(tmp_path / "laptop")}

    def on_laptop(*args: str) -> tuple[int, str, str]:
        env_before = dict(os.environ)
        os.environ.update(laptop)
        try:
            r = gpuctl(*args)
        finally:
            os.environ.clear()
            os.environ.update(env_before)
        return r.returncode, r.stdout, r.stderr

    code, out, _ = on_laptop("keys", "create")
    assert code == 0
    laptop_key = out.strip()
    assert len(laptop_key) == 40
    # Not trusted yet: the laptop knows no key for the node.
    code, out, _ = on_laptop("--node", daemon.address, "nodes")
    assert code == 2 and "UNKNOWN" in out and "gpuctl keys trust" in out
    # On the GPU box: authorize the laptop's key and print the server key.
    auth = gpuctl(
        "keys",
        "authorize",
        laptop_key,
        "--role",
        "viewer",
        "--name",
        "laptop",
        "--state-dir",
        str(daemon.state_dir),
    )
    assert auth.returncode == 0, auth.stderr
    server = gpuctl("keys", "server", "--state-dir", str(daemon.state_dir))
    assert server.returncode == 0
    # Back on the laptop: pin it, then use it.
    code, out, err = on_laptop("keys", "trust", daemon.address, server.stdout.strip())
    assert code == 0, err
    code, out, err = on_laptop("--node", daemon.address, "--json", "nodes")
    assert code == 0, err
    (entry,) = json.loads(out)["nodes"]
    assert entry["info"]["role"] == "viewer"
    listed = gpuctl("keys", "list", "--state-dir", str(daemon.state_dir), "--json")
    roles = {k["name"]: k["role"] for k in json.loads(listed.stdout)["keys"]}
    assert roles["laptop"] == "viewer" and "operator" in roles.values()
    # A wrongly pinned key is caught at the handshake.
    code, _, _ = on_laptop(
        "keys", "trust", daemon.address, "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
    )
    assert code == 0
    code, out, _ = on_laptop("--node", daemon.address, "nodes")
    assert code == 3 and "does not match the pinned server key" in out


@pytest.mark.parametrize(
    "args",
    [
        ["keys", "authorize", "not-a-key", "--name", "x"],
        ["keys", "trust", "127.0.0.1:1", "short"],
        ["keys", "list", "--state-dir", "/nonexistent/state"],
    ],
)
def test_key_commands_reject_bad_input_in_one_line(args: list[str], tmp_path: Path) -> None:
    result = gpuctl(*args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_finished_run_shows_the_same_steps_done_in_ps_status_and_health(
    daemon: RunningDaemon,
) -> None:
    """Issue 8: a run of max_steps N that ran to its end is N/N in every view."""
    steps = 20
    run_id = launch(daemon, FAST, f"training.max_steps={steps}")
    wait_for(daemon, run_id, {"succeeded"}, timeout=180)
    done = f"{steps}/{steps}"

    def ctl(*args: str) -> str:
        result = gpuctl("--node", daemon.address, *args)
        assert result.returncode == 0, result.stderr
        return result.stdout

    # health: every rank's last heartbeat (sent from run.finish()) has the last step.
    health = json.loads(ctl("--json", "health", run_id))
    assert [(r["rank"], r["last_step"], r["steps_done"]) for r in health["ranks"]] == [
        (0, steps - 1, steps),
        (1, steps - 1, steps),
    ]
    ranks = [line.split() for line in ctl("health", run_id).splitlines()]
    table = ranks[next(i for i, row in enumerate(ranks) if row[:1] == ["RANK"]) + 1 :]
    assert [row[2] for row in table] == [done, done]
    # ps
    (row,) = [r for r in json.loads(ctl("--json", "ps"))["runs"] if r["id"] == run_id]
    assert (row["last_step"], row["steps_done"], row["max_steps"]) == (steps - 1, steps, steps)
    (line,) = [line.split() for line in ctl("ps").splitlines() if line.startswith(run_id)]
    assert line[2:6] == ["succeeded", "1x2", "-", done]  # an ended run holds no GPUs
    # status
    status = json.loads(ctl("--json", "status", run_id))
    assert (status["run"]["steps_done"], status["run"]["max_steps"]) == (steps, steps)
    progress = next(
        line for line in ctl("status", run_id).splitlines() if line.startswith("progress")
    )
    assert f"step {done}" in progress, progress


def test_shell_completion_offers_the_run_ids_and_names_the_nodes_know(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    script = gpuctl("completion", "bash")
    assert script.returncode == 0 and "_GPUCTL_COMPLETE=bash_complete" in script.stdout
    spec = script_spec(tmp_path, "print('hi')", name="tabbed")
    run_id = launch(daemon, config=spec)
    wait_for(daemon, run_id, {"succeeded"})
    offered = complete("gpuctl stop ")
    assert offered.returncode == 0 and offered.stderr == "", offered.stderr
    assert set(offered.stdout.splitlines()) == {f"plain,{run_id}", "plain,tabbed"}
    assert complete(f"gpuctl logs {run_id[:-2]}").stdout.splitlines() == [f"plain,{run_id}"]
    assert complete("gpuctl st").stdout.splitlines() == ["plain,status", "plain,stop"]
    # No daemon answering: nothing offered, nothing printed, no delay past the timeout.
    assert daemon.stop() == 0
    quiet = complete(f"gpuctl --node {daemon.address} status ")
    assert (quiet.returncode, quiet.stdout.strip(), quiet.stderr) == (0, "", "")


def test_a_dry_run_of_a_plain_script_says_which_health_it_gets(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """Issue 26 §2: a script without the trainers library gets health from its output only;
    `--dry-run` says so, in one line, as the launch does. A script with the library gets
    no note."""
    spec = script_spec(tmp_path, "print('step 1 loss 0.5')\n", name="plain")
    dry = gpuctl("--node", daemon.address, "launch", str(spec), "--dry-run",
                 "--set", "restart.hang_timeout_s=30")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert dry.stderr.splitlines() == [
        "gpuctl: note: plain.py does not import the trainers library, so gpud judges its"
        " health from its output: metrics from its framework's output (`metrics: auto`:"
        " Hugging Face Trainer, Lightning, nanoGPT, torchtitan, DeepSpeed, tqdm), a hang after"
        " 30s without output; per-rank heartbeats, stragglers, a stall's culprit, the"
        " checkpoint-then-exit stop and the collective probe need `from trainers import ...`"
    ], dry.stderr
    assert "plain.py" in dry.stdout  # the plan, and nothing started
    ps = json.loads(gpuctl("--node", daemon.address, "--json", "ps").stdout)
    assert ps["runs"] == []
    unset = gpuctl("--node", daemon.address, "launch", str(spec), "--dry-run")
    assert "a hang when it prints nothing for restart.hang_timeout_s (unset)" in unset.stderr
    library = script_spec(tmp_path, "from trainers import run\n", name="library")
    quiet = gpuctl("--node", daemon.address, "launch", str(library), "--dry-run")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_ps_lists_the_newest_runs_and_says_how_many_older_ones_it_left_out(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """A node may keep 10,000 runs: `ps` lists the newest (200 by default, `--limit`) and
    says on stderr how many older ones there are, so a short list is never mistaken for
    the whole history."""
    spec = script_spec(tmp_path, "print('done')\n", name="quick")
    ids = [launch(daemon, config=spec) for _ in range(3)]
    for run_id in ids:
        wait_for(daemon, run_id, {"succeeded"}, timeout=60)
    newest = gpuctl("--node", daemon.address, "ps", "--limit", "2")
    assert newest.returncode == 0, newest.stderr
    assert [line.split()[0] for line in newest.stdout.splitlines()[1:]] == ids[:0:-1]
    assert newest.stderr == (
        f"… 1 older run on {daemon.address} not listed: gpuctl ps --limit 1000 lists up to 1,000\n"
    )
    listed = json.loads(gpuctl("--node", daemon.address, "--json", "ps", "--limit", "2").stdout)
    assert listed["older"] == {daemon.address: 1}
    every = gpuctl("--node", daemon.address, "ps")
    assert len(every.stdout.splitlines()) == 1 + 3 and every.stderr == ""
