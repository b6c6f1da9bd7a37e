"""Who may talk to a daemon: the authorized-keys file and the ZAP authenticator.

`<state-dir>/authorized_keys.json` maps client public keys to a role. The authenticator
consults it on every CURVE handshake (re-reading the file when it changed, so
`gpuctl keys authorize` needs no restart) and labels each connection with the client's
public key; zmq stamps that label as `User-Id` on every message from the connection.
The role is *not* fixed at the handshake: the `Authorizer` looks the key up again for
every request, against the file as it is now (re-read at most every RECHECK_S when it
changed), so a revoked or downgraded key loses its rights on open connections too.
"""

from __future__ import annotations

import getpass
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from zmq.auth.thread import ThreadAuthenticator

from gpud.node.paths import atomic_write, exclusive
from gpud.node.statedir import AUDIT_LOG
from gpud.security.audit import AuditLog, AuditRecord, append_record, local_user
from gpud.security.bursts import ThrottledLog
from gpud.security.keygate import KeyGate
from gpud.security.keys import KeyFileError, check_public_key, load_or_create_client_keypair
from gpud.security.roles import Role

log = logging.getLogger("gpud.auth")

AUTHORIZED_KEYS = "authorized_keys.json"
#: The ZAP domain of the control socket (and of every other CURVE socket of gpud).
ZAP_DOMAIN = "gpud"
#: The events socket's own domain: its handshakes also pass the events `KeyGate`.
EVENTS_ZAP_DOMAIN = "gpud-events"
#: How often the authorized-keys file is checked for changes, at most.
RECHECK_S = 0.25


@dataclass(frozen=True)
class Caller:
    """Who sent a request, as decided for that request."""

    role: Role
    name: str
    key: str | None = None  # z85 public key; None on an --insecure daemon


class AuthorizedKey(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    key: str = Field(description="z85 CURVE public key of the client")
    role: Role
    name: str = Field(description="who the key belongs to, for logs and the audit trail")
    added: float = Field(default_factory=time.time)


class AuthorizedKeys(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    keys: list[AuthorizedKey] = Field(default_factory=list)


def authorized_keys_path(state_dir: Path) -> Path:
    return state_dir / AUTHORIZED_KEYS


def read_authorized_keys(path: Path) -> AuthorizedKeys:
    """Missing file → no keys. A corrupt file is an error, never silently 'no keys'."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return AuthorizedKeys()
    try:
        return AuthorizedKeys.model_validate_json(data)
    except ValidationError as exc:
        raise KeyFileError(
            f"{path} is not a valid authorized-keys file: {exc.errors()[0]['msg']}"
        ) from None


def _audit_key_change(
    state_dir: Path, action: str, key: AuthorizedKey, old: AuthorizedKey | None
) -> None:
    """Who changed which key, appended to the state dir's audit log (a daemon may be
    running or not; it records what it loads of the change on its own)."""
    body: dict[str, object] = {"key": key.key, "name": key.name, "role": key.role.value}
    if old is not None:
        body["was"] = {"name": old.name, "role": old.role.value}
    if action == "keys.revoke":
        what = f"revoked {key.name}'s key ({key.key[:8]}…, {key.role.value})"
    else:
        was = f", was {old.role.value} as {old.name}" if old is not None else ""
        what = f"authorized {key.name}'s key ({key.key[:8]}…) as {key.role.value}{was}"
    record = AuditRecord(
        time=time.time(), caller=local_user(), role="local", action=action, body=body,
        ok=True, detail=what,
    )  # fmt: skip
    append_record(state_dir / AUDIT_LOG, record)


def authorize(state_dir: Path, key: str, role: Role, name: str) -> bool:
    """Authorize `key` with `role` (replacing its earlier role). Returns True if changed
    (and then the change is in the audit log, with who made it)."""
    key = check_public_key(key).decode()
    path = authorized_keys_path(state_dir)
    with exclusive(path):
        current = read_authorized_keys(path)
        kept = [k for k in current.keys if k.key != key]
        old = next((k for k in current.keys if k.key == key), None)
        if old is not None and old.role == role and old.name == name:
            return False
        new = AuthorizedKey(key=key, role=role, name=name)
        atomic_write(path, AuthorizedKeys(keys=[*kept, new]).model_dump_json(indent=2).encode())
        _audit_key_change(state_dir, "keys.authorize", new, old)
    return True


def revoke(state_dir: Path, key: str) -> bool:
    """Remove `key`; returns False when it was not authorized (the removal is audited)."""
    key = check_public_key(key).decode()
    path = authorized_keys_path(state_dir)
    with exclusive(path):
        current = read_authorized_keys(path)
        kept = [k for k in current.keys if k.key != key]
        gone = [k for k in current.keys if k.key == key]
        if not gone:
            return False
        atomic_write(path, AuthorizedKeys(keys=kept).model_dump_json(indent=2).encode())
        _audit_key_change(state_dir, "keys.revoke", gone[0], None)
    return True


@dataclass(frozen=True)
class KeyChanges:
    """What one reload of the authorized-keys file changed."""

    added: list[AuthorizedKey]
    removed: list[AuthorizedKey]
    changed: list[tuple[AuthorizedKey, AuthorizedKey]]  # (before, after)

    @staticmethod
    def between(before: dict[str, AuthorizedKey], after: dict[str, AuthorizedKey]) -> KeyChanges:
        return KeyChanges(
            added=[k for key, k in after.items() if key not in before],
            removed=[k for key, k in before.items() if key not in after],
            changed=[
                (before[key], k)
                for key, k in after.items()
                if key in before and (before[key].role, before[key].name) != (k.role, k.name)
            ],
        )

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def authorize_local_user_on_first_start(state_dir: Path) -> None:
    """A daemon's first start authorizes the user who started it as operator (their client
    key, made if they have none); never again once the file exists: the operator owns it
    from then on, and a revoked key is never re-added."""
    path = authorized_keys_path(state_dir)
    if path.exists():
        return
    client, created = load_or_create_client_keypair()
    name = f"{getpass.getuser()}@{socket.gethostname()}"
    authorize(state_dir, client.public_text, Role.OPERATOR, name)
    log.info(
        "authorized the local user's key (%s) as operator%s",
        name,
        " (created it)" if created else "",
    )


def record_key_changes(audit: AuditLog, changes: KeyChanges) -> None:
    """The daemon's own record of a change of its authorized keys, as it applied it
    (gpuctl records who made it; a hand edit of the file has only this one)."""

    def entry(k: AuthorizedKey, was: AuthorizedKey | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"key": k.key, "name": k.name, "role": k.role.value}
        if was is not None:
            out["was"] = {"name": was.name, "role": was.role.value}
        return out

    body = {
        "added": [entry(k) for k in changes.added],
        "removed": [entry(k) for k in changes.removed],
        "changed": [entry(new, old) for old, new in changes.changed],
    }
    said = [f"added {k.name} ({k.role.value})" for k in changes.added]
    said += [f"removed {k.name} ({k.role.value})" for k in changes.removed]
    said += [f"{new.name}: {old.role.value} → {new.role.value}" for old, new in changes.changed]
    detail = "applied from authorized_keys.json: " + "; ".join(said)
    audit.record("authorized_keys.json", "file", "keys.applied", body, True, detail)


class PeerKeys:
    """Keys of coordinator daemons, each good for the runs it coordinates here.

    Replaced wholesale on every change, so the ZAP thread always reads a consistent map.
    """

    def __init__(self) -> None:
        self._runs: dict[str, frozenset[str]] = {}

    def grant(self, key: str, run_id: str) -> None:
        runs = dict(self._runs)
        runs[key] = runs.get(key, frozenset()) | {run_id}
        self._runs = runs

    def revoke(self, run_id: str) -> None:
        self._runs = {k: v - {run_id} for k, v in self._runs.items() if v - {run_id}}

    def runs_of(self, key: str) -> frozenset[str]:
        return self._runs.get(key, frozenset())

    def lookup(self, key: str) -> AuthorizedKey | None:
        if key in self._runs:
            return AuthorizedKey(key=key, role=Role.PEER, name=key)
        return None


class KeyRing:
    """The authorized keys, re-read when the file changes. Safe to call from any thread.

    `peers` (optional) is consulted for keys not in the file: coordinators of runs.
    """

    def __init__(
        self,
        path: Path,
        peers: PeerKeys | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[KeyChanges], None] | None = None,
    ) -> None:
        self.path = path
        self.peers = peers
        self._clock = clock
        self.on_change = on_change  # after a reload that changed something (any thread)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._checked_at = float("-inf")
        self._by_key: dict[str, AuthorizedKey] = {}
        self._loaded = False
        self._reload_if_changed()  # now: a corrupt file fails at start-up, not at first client
        self._loaded = True  # from now on, each reload's changes are news

    def _reload_if_changed(self, fresh: bool = True) -> None:
        now = self._clock()
        if not fresh and now - self._checked_at < RECHECK_S:
            return
        self._checked_at = now
        try:
            st = self.path.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp:
            return
        keys = read_authorized_keys(self.path)
        before, self._by_key = self._by_key, {k.key: k for k in keys.keys}
        self._stamp = stamp
        log.info("authorized keys loaded: %d key(s) from %s", len(self._by_key), self.path)
        changes = KeyChanges.between(before, self._by_key)
        if changes and self._loaded and self.on_change is not None:
            self.on_change(changes)

    def lookup(self, z85_key: str, fresh: bool = True) -> AuthorizedKey | None:
        """The key's entry now. `fresh=False` (per request) may use a file state up to
        RECHECK_S old; handshakes always look at the file as it is."""
        with self._lock:
            try:
                self._reload_if_changed(fresh)
            except KeyFileError as exc:
                # Keep serving with the keys we had; a broken edit must not lock everyone out.
                log.error("%s; keeping the previously loaded keys", exc)
            found = self._by_key.get(z85_key)
        if found is None and self.peers is not None:
            return self.peers.lookup(z85_key)
        return found


#: Refused handshakes, told once per interval with a count (a client may retry in a loop).
_refusals = ThrottledLog(log)


class _CredentialsProvider:
    """Lets in the keys of the ring; with a `gate`, only when the gate admits them too."""

    def __init__(self, ring: KeyRing, gate: KeyGate | None = None, what: str = "") -> None:
        self._ring = ring
        self._gate = gate
        self._what = what

    def callback(self, domain: str, key: bytes) -> bool:
        text = key.decode("ascii", errors="replace")
        entry = self._ring.lookup(text)
        if entry is None:
            _refusals.warning(
                "unknown", f"refused a client key not in {self._ring.path}: {text[:8]}…"
            )
            return False
        why = self._gate.admit(text) if self._gate is not None else None
        if why is not None:
            _refusals.warning(
                ("gate", text), f"refused {entry.name}'s key ({text[:8]}…) on {self._what}: {why}"
            )
            return False
        return True


class RoleAuthenticator(ThreadAuthenticator):
    """ZAP handler: only keys in the ring get in; their User-Id is their public key. The
    events socket's domain also asks the events `KeyGate`."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        ring: KeyRing,
        events_gate: KeyGate | None = None,
    ) -> None:
        super().__init__(context, log=logging.getLogger("gpud.zap"))
        self._ring = ring
        self._events_gate = events_gate

    def start(self) -> None:
        super().start()
        self.configure_curve_callback(
            ZAP_DOMAIN, credentials_provider=_CredentialsProvider(self._ring)
        )
        self.configure_curve_callback(
            EVENTS_ZAP_DOMAIN,
            credentials_provider=_CredentialsProvider(
                self._ring, self._events_gate, "the events socket"
            ),
        )

    def curve_user_id(self, client_public_key: bytes) -> str:
        # The key itself: the role is looked up per request, never frozen here.
        return zmq.utils.z85.encode(client_public_key).decode("ascii")


class Authorizer:
    """The caller of each request: its key's role *now*, or None when it has none."""

    def __init__(self, ring: KeyRing) -> None:
        self._ring = ring

    def caller(self, user_id: str | None) -> Caller | None:
        if not user_id:
            return None
        entry = self._ring.lookup(user_id, fresh=False)
        if entry is None:
            return None
        return Caller(entry.role, entry.name, user_id)

    def authorized(self, key: str) -> bool:
        return self._ring.lookup(key, fresh=False) is not None
