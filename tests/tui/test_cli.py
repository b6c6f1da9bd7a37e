"""`gputop`'s command line: which nodes, and one clear line (exit 2) for bad input."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpud.security.known_nodes import KnownNode, remember_node
from tests.support.daemons import RunningDaemon, free_port
from tui.cli import app_argv, parser
from tui.model.targets import TargetError, load_cluster, resolve_targets

KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"


def gputop(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tui", *args], capture_output=True, text=True, timeout=60
    )


def test_a_cluster_file_pins_keys_names_and_groups(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "nodes:\n"
        f"  - {{address: gpu1:7711, server_key: '{KEY}', name: gpu1, group: rack-a}}\n"
        "  - {address: '127.0.0.1:9000', insecure: true, events: '127.0.0.1:9001'}\n"
    )
    first, second = load_cluster(path)
    assert first.node.control == "tcp://gpu1:7711"
    assert first.node.server_key == KEY.encode()
    assert (first.node.name, first.group) == ("gpu1", "rack-a")
    assert second.node.server_key is None
    assert second.node.events == "tcp://127.0.0.1:9001"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("nodes: [{address: gpu1:7711}]", "give its server_key"),
        ("nodes: [{address: gpu1:7711, insecure: true, colour: red}]", "colour"),
        ("nodes: []", "nodes"),
        ("nodes: [{address: 'gpu1:99999', insecure: true}]", "out of range"),
        ("nodes: [oops", "not valid YAML"),
    ],
)
def test_bad_cluster_files_say_what_is_wrong(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(content)
    with pytest.raises(TargetError, match=expected):
        load_cluster(path)


def test_default_nodes_are_the_known_ones(config_dir: Path) -> None:
    with pytest.raises(TargetError, match=r"no nodes known yet: start a local daemon"):
        resolve_targets([], None)
    remember_node(KnownNode(control="tcp://10.1.1.1:7711", server_key=KEY, name="box"))
    remember_node(KnownNode(control="tcp://10.1.1.2:7711", insecure=True))
    targets = resolve_targets([], None)
    assert [t.node.control for t in targets] == ["tcp://10.1.1.1:7711", "tcp://10.1.1.2:7711"]
    assert targets[0].node.name == "box"
    # --node picks from the known nodes (and only those have keys); duplicates collapse.
    picked = resolve_targets(["10.1.1.2:7711", "10.1.1.2:7711"], None)
    assert [t.node.control for t in picked] == ["tcp://10.1.1.2:7711"]


def test_web_passes_the_same_selection_to_the_served_app(tmp_path: Path) -> None:
    args = parser().parse_args(
        ["--node", "a:1", "--node", "b:2", "--readonly", "--run", "r-1", "--web"]
    )
    assert app_argv(args) == ["--node", "a:1", "--node", "b:2", "--readonly", "--run", "r-1"]
    assert (args.web_host, args.web_port) == ("127.0.0.1", 8000)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--cluster", "/nonexistent/cluster.yaml"], "cannot read cluster file"),
        (["--node", "not a host"], "expected HOST:PORT"),
        (["--node", "10.9.9.9:7711"], "no server key is known for 10.9.9.9:7711"),
        (["--web", "--web-port", "70000"], "out of range"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], expected: str) -> None:
    result = gputop(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gputop: error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


def test_gpud_never_imports_textual() -> None:
    # gpud (the daemon and its demo) must not import textual; gputop is a separate process.
    code = "import sys, gpud.cli, gpud.commands.demo; print('textual' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_web_serves_gputop_on_loopback(daemon: RunningDaemon) -> None:
    import aiohttp

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tui", "--node", daemon.address, "--web", "--web-port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = b""
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 30
            while True:  # until the server listens
                try:
                    async with session.get(f"http://127.0.0.1:{port}/") as page:
                        assert page.status == 200
                        break
                except aiohttp.ClientConnectorError:
                    assert time.monotonic() < deadline, "gputop --web never listened"
                    await asyncio.sleep(0.2)
            url = f"http://127.0.0.1:{port}/ws?width=100&height=30"
            async with session.ws_connect(url) as ws, asyncio.timeout(30):
                async for message in ws:
                    if message.type == aiohttp.WSMsgType.BINARY:
                        seen += message.data
                    elif message.type == aiohttp.WSMsgType.TEXT:
                        seen += message.data.encode()
                    if b"Fleet" in seen and b"1/1 nodes up" in seen:
                        break
        assert b"node0" in seen
    finally:
        server.terminate()
        server.wait(timeout=15)
