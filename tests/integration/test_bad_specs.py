"""Bad specs get one clear line from gpuctl (issue 33 §5): a request over the wire's limit
is refused at once, before it is sent; a workdir the node lacks is said at the dry run."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.daemons import RunningDaemon, gpuctl

#: 600 kB of `"`: JSON escapes each as `\\"`, so six uses (env and args) make a 7 MB
#: request from a 600 kB file whose expansion (3.6 MB) is within the spec's own bounds.
QUOTES = "'" + '"' * 600_000 + "'"


def test_a_spec_over_the_wire_limit_is_refused_at_once_in_one_line(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    (tmp_path / "a.py").write_text("print('never runs')\n")
    spec = tmp_path / "big.yaml"
    spec.write_text(
        f"name: big\nscript: a.py\nworkdir: {tmp_path}\n"
        f"env:\n  BIG: &big {QUOTES}\nargs: [*big, *big, *big, *big, *big]\n"
    )
    started = time.monotonic()
    done = gpuctl("--node", daemon.address, "launch", str(spec))
    took = time.monotonic() - started
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        f"gpuctl: error: {daemon.address}: the run.launch request is 6.9 MiB; a gpud takes at"
        " most 4 MiB a request: make the spec smaller (a large DeepSpeed config, env or args"
        " belong in a file the script reads) [invalid_body]"
    ]
    assert took < 20  # not the 60 s wait for an answer that never comes
    assert "refused a request" not in daemon.log()  # never sent


def test_a_dry_run_says_the_workdir_is_missing(daemon: RunningDaemon, tmp_path: Path) -> None:
    spec = tmp_path / "lost.yaml"
    spec.write_text("name: lost\nscript: train.py\nworkdir: no/such/dir\n")
    done = gpuctl("--node", daemon.address, "launch", "--dry-run", str(spec))
    assert done.returncode == 2, (done.stdout, done.stderr)
    missing = tmp_path / "no" / "such" / "dir"
    assert done.stderr.strip() == (
        f"gpuctl: error: {daemon.address}: spec: workdir: {missing} is not a directory on"
        " node0; the script runs there on every node of the run [invalid_body]"
    )
