"""gpuctl keys takes z85 keys that begin with "-" (about one key in 85 does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpud.security.auth import authorized_keys_path, read_authorized_keys
from launch.gpuctl.main import cli

DASH_KEYS = [
    "-htpQzne^!f7ch@Hc!>&yv9edlwNwSUx(*MLl}o#",  # would read as -h (help)
    "-szh^vr]NOobP+o:bU:ztb14QKmfz4x]65VIoj-u",
    "--y:1j2w-Z7D{fIUK4QD4-SeOU(Q0oIR%D3FY!R4",  # would read as a long option
]


@pytest.mark.parametrize("key", DASH_KEYS)
@pytest.mark.parametrize("key_first", [True, False])
def test_authorize_and_revoke_a_key_that_begins_with_a_dash(
    tmp_path: Path, key: str, key_first: bool
) -> None:
    opts = ["--role", "operator", "--name", "ops", "--state-dir", str(tmp_path)]
    args = ["keys", "authorize", *([key, *opts] if key_first else [*opts, key])]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "authorized: ops as operator" in result.output
    [entry] = read_authorized_keys(authorized_keys_path(tmp_path)).keys
    assert entry.key == key
    result = CliRunner().invoke(cli, ["keys", "revoke", key, "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert read_authorized_keys(authorized_keys_path(tmp_path)).keys == []


def test_trust_a_server_key_that_begins_with_a_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUD_CONFIG_DIR", str(tmp_path))
    key = DASH_KEYS[0]
    result = CliRunner().invoke(cli, ["--json", "keys", "trust", "10.0.0.7:7711", key])
    assert result.exit_code == 0, result.output
    nodes = json.loads((tmp_path / "nodes.json").read_text())
    assert [n["server_key"] for n in nodes["nodes"]] == [key]


def test_a_real_option_is_still_an_option(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["keys", "authorize", "-x", "--name", "n"])
    assert result.exit_code == 2
    assert "No such option" in result.output
