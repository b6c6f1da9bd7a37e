"""Keys on disk and the authorized-keys ring."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest
import zmq

from gpud.security.audit import local_user
from gpud.security.auth import (
    RECHECK_S,
    Authorizer,
    Caller,
    KeyChanges,
    KeyRing,
    authorize,
    authorized_keys_path,
    read_authorized_keys,
    revoke,
)
from gpud.security.keys import KeyFileError, check_public_key, load_or_create_keypair
from gpud.security.roles import Role


def new_public_key() -> str:
    return zmq.curve_keypair()[0].decode()


def test_keypair_is_created_once_with_a_private_secret(tmp_path: Path) -> None:
    pair, created = load_or_create_keypair(tmp_path / "keys", "server")
    again, created_again = load_or_create_keypair(tmp_path / "keys", "server")
    assert created and not created_again
    assert pair == again and len(pair.public) == 40
    secret = tmp_path / "keys" / "server.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700


@pytest.mark.parametrize("text", ["short", "~" * 40, "a" * 41, ""])
def test_bad_public_keys_are_refused_with_a_reason(text: str) -> None:
    with pytest.raises(KeyFileError, match="z85"):
        check_public_key(text)


def test_authorize_replace_and_revoke(tmp_path: Path) -> None:
    key = new_public_key()
    assert authorize(tmp_path, key, Role.VIEWER, "alice")
    assert not authorize(tmp_path, key, Role.VIEWER, "alice")  # nothing changed
    assert authorize(tmp_path, key, Role.OPERATOR, "alice")  # role changed in place
    keys = read_authorized_keys(authorized_keys_path(tmp_path)).keys
    assert [(k.key, k.role) for k in keys] == [(key, Role.OPERATOR)]
    assert revoke(tmp_path, key)
    assert not revoke(tmp_path, key)
    assert read_authorized_keys(authorized_keys_path(tmp_path)).keys == []


def test_keyring_sees_changes_without_restart(tmp_path: Path) -> None:
    ring = KeyRing(authorized_keys_path(tmp_path))
    key = new_public_key()
    assert ring.lookup(key) is None
    authorize(tmp_path, key, Role.VIEWER, "bob")
    found = ring.lookup(key)
    assert found is not None and found.role is Role.VIEWER and found.name == "bob"
    revoke(tmp_path, key)
    assert ring.lookup(key) is None


def test_keyring_keeps_old_keys_when_the_file_is_broken(tmp_path: Path) -> None:
    key = new_public_key()
    authorize(tmp_path, key, Role.OPERATOR, "carol")
    ring = KeyRing(authorized_keys_path(tmp_path))
    assert ring.lookup(key) is not None
    authorized_keys_path(tmp_path).write_text("{ not json")
    assert ring.lookup(key) is not None  # a bad edit must not lock everyone out


def test_broken_file_fails_loudly_at_start(tmp_path: Path) -> None:
    authorized_keys_path(tmp_path).write_text("[]")
    with pytest.raises(KeyFileError, match="not a valid authorized-keys file"):
        KeyRing(authorized_keys_path(tmp_path))


def test_authorizer_decides_each_request_against_the_current_file(tmp_path: Path) -> None:
    now = [0.0]
    ring = KeyRing(authorized_keys_path(tmp_path), clock=lambda: now[0])
    authorizer = Authorizer(ring)
    key = new_public_key()
    authorize(tmp_path, key, Role.OPERATOR, "dave")
    assert ring.lookup(key) is not None  # the handshake (always fresh)
    assert authorizer.caller(key) == Caller(Role.OPERATOR, "dave", key)
    authorize(tmp_path, key, Role.VIEWER, "dave")
    now[0] += RECHECK_S  # a request after the recheck interval sees the downgrade
    assert authorizer.caller(key) == Caller(Role.VIEWER, "dave", key)
    revoke(tmp_path, key)
    now[0] += RECHECK_S
    assert authorizer.caller(key) is None
    assert not authorizer.authorized(key)
    assert authorizer.caller(None) is None and authorizer.caller("") is None


def test_handshakes_see_a_new_key_at_once(tmp_path: Path) -> None:
    ring = KeyRing(authorized_keys_path(tmp_path), clock=lambda: 0.0)  # time stands still
    key = new_public_key()
    assert ring.lookup(key) is None
    authorize(tmp_path, key, Role.VIEWER, "erin")
    assert ring.lookup(key) is not None  # fresh by default: what the ZAP handler uses


def test_key_changes_are_audited_with_who_what_and_when(tmp_path: Path) -> None:
    key = new_public_key()
    before = time.time()
    authorize(tmp_path, key, Role.VIEWER, "frank")
    assert not authorize(tmp_path, key, Role.VIEWER, "frank")  # no change, no record
    authorize(tmp_path, key, Role.OPERATOR, "frank")
    revoke(tmp_path, key)
    records = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert [r["action"] for r in records] == ["keys.authorize", "keys.authorize", "keys.revoke"]
    assert all(r["caller"] == local_user() and r["role"] == "local" for r in records)
    assert all(before <= r["time"] <= time.time() and r["ok"] for r in records)
    assert records[0]["body"] == {"key": key, "name": "frank", "role": "viewer"}
    assert records[1]["body"]["was"] == {"name": "frank", "role": "viewer"}
    assert "as operator, was viewer" in records[1]["detail"]
    assert records[2]["body"] == {"key": key, "name": "frank", "role": "operator"}


def test_the_ring_reports_what_each_reload_changed(tmp_path: Path) -> None:
    kept, dropped, added = new_public_key(), new_public_key(), new_public_key()
    authorize(tmp_path, kept, Role.VIEWER, "gina")
    authorize(tmp_path, dropped, Role.OPERATOR, "hal")
    seen: list[KeyChanges] = []
    ring = KeyRing(authorized_keys_path(tmp_path), on_change=seen.append)
    assert seen == []  # the first load is no change
    authorize(tmp_path, kept, Role.OPERATOR, "gina")
    revoke(tmp_path, dropped)
    authorize(tmp_path, added, Role.VIEWER, "ivy")
    ring.lookup(kept)
    (changes,) = seen
    assert [k.name for k in changes.added] == ["ivy"]
    assert [k.name for k in changes.removed] == ["hal"]
    assert [(old.role, new.role) for old, new in changes.changed] == [(Role.VIEWER, Role.OPERATOR)]
