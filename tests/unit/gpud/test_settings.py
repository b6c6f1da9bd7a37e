"""`gpud serve` settings: validation and the config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpud.settings import SettingsError, build_settings, load_config_file, readable_secrets


def test_defaults_are_loopback_and_secure(tmp_path: Path) -> None:
    s = build_settings({"state_dir": tmp_path})
    assert (s.control, s.events) == ("tcp://127.0.0.1:7711", "tcp://127.0.0.1:7712")
    assert s.insecure is False and s.interval == 1.0 and s.simulate_gpus is None
    assert s.logs_max_bytes == 100_000_000
    assert build_settings({"logs_max_bytes": "2GiB"}).logs_max_bytes == 2 * 1024**3
    assert s.master_port_range() == range(29500, 30500)
    assert build_settings({"master_ports": " 40000 "}).master_port_range() == range(40000, 40001)


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"interval": 0}, "interval"),
        ({"simulate_gpus": 0}, "simulate_gpus"),
        ({"control": "http://x:1"}, "only tcp:// and ipc://"),
        ({"node_name": "bad name"}, "node_name"),
        ({"insecure": True, "control": "tcp://0.0.0.0:7711"}, "--insecure is refused"),
        ({"insecure": True, "events": "tcp://10.0.0.1:7712"}, "--insecure is refused"),
        ({"control": "tcp://127.0.0.1:1", "events": "tcp://127.0.0.1:1"}, "different addresses"),
        ({"log_level": "loud"}, "log_level"),
        ({"logs_max_bytes": "1kB"}, "'1kB' is below the least bound, 64 kB"),
        ({"colour": "blue"}, "colour"),
        ({"master_ports": "30000-29000"}, "master_ports: Value error, expected FIRST-LAST"),
        ({"master_ports": "80-90"}, "from 1024 to 65535"),
        ({"master_ports": "29500-"}, "got '29500-'"),
    ],
)
def test_bad_settings_get_one_line_naming_the_setting(
    values: dict[str, object], fragment: str
) -> None:
    with pytest.raises(SettingsError) as err:
        build_settings(values)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_insecure_is_fine_on_loopback() -> None:
    s = build_settings({"insecure": True, "control": "localhost:7000", "events": "127.0.0.1:7001"})
    assert s.insecure and s.control == "tcp://localhost:7000"


def test_config_file_keys_may_use_dashes(tmp_path: Path) -> None:
    path = tmp_path / "gpud.yaml"
    path.write_text("node-name: box7\ninterval: 2.5\nsimulate_gpus: 4\n")
    assert load_config_file(path) == {"node_name": "box7", "interval": 2.5, "simulate_gpus": 4}


def test_missing_explicit_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="does not exist"):
        load_config_file(tmp_path / "nope.yaml")


def test_default_config_file_is_optional(config_dir: Path) -> None:
    assert load_config_file(None) == {}


def test_config_file_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "gpud.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(SettingsError, match="mapping"):
        load_config_file(path)


def test_webhooks_come_from_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "gpud.yaml"
    path.write_text(
        "notify:\n"
        "  - url: https://hooks.slack.com/services/T0/B0/s3cr3t\n"
        "    format: slack\n"
        "  - url: http://alerts.internal:8080/gpud\n"
        "    events: [failed, succeeded]\n"
        "    stalled_after_s: 600\n"
    )
    s = build_settings({**load_config_file(path), "state_dir": tmp_path})
    slack, plain = s.notify
    assert (slack.format, slack.shown) == ("slack", "https://hooks.slack.com/…")
    assert [e.value for e in plain.events] == ["failed", "succeeded"]
    assert plain.stalled_after_s == 600 and plain.format == "json"
    assert "s3cr3t" not in repr(s)


@pytest.mark.parametrize(
    ("hook", "said"),
    [
        ({"url": "ftp://x/s3cr3t"}, "notify.0.url: Value error, expected an http:// or https://"),
        ({"url": "https://x/s3cr3t", "format": "teams"}, "notify.0.format"),
        ({"url": "https://x/s3cr3t", "events": ["exploded"]}, "notify.0.events.0"),
        ({"url": "https://x/s3cr3t", "formt": "slack"}, "notify.0.formt"),
    ],
)
def test_a_bad_webhook_is_one_line_without_its_url(hook: dict[str, object], said: str) -> None:
    with pytest.raises(SettingsError) as err:
        build_settings({"notify": [hook]})
    assert said in str(err.value) and "s3cr3t" not in str(err.value)


def test_a_config_file_with_webhooks_others_can_read_is_named(tmp_path: Path) -> None:
    path = tmp_path / "gpud.yaml"
    path.write_text("notify: [{url: 'https://hooks.slack.com/services/T0/B0/s3cr3t'}]\n")
    settings = build_settings(load_config_file(path))
    path.chmod(0o644)
    said = readable_secrets(path, settings)
    assert said == (
        f"{path} holds webhook URLs, which are secrets, and others may read it (mode 644):"
        f" chmod 600 {path}"
    )
    path.chmod(0o600)
    assert readable_secrets(path, settings) is None
    path.chmod(0o644)
    assert readable_secrets(path, build_settings({})) is None  # no webhooks in it
