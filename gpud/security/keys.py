"""CurveZMQ key pairs on disk: the daemon's server key and each user's client key.

Files use pyzmq's certificate format (`zmq.auth.load_certificate` reads them): `NAME.key`
holds the public key, `NAME.key_secret` both keys and is readable by the owner only.

A pair is created whole or not at all, by one process: under a lock, in a temporary dir
beside it, renamed into place public key first, so `NAME.key_secret` existing means the
pair is complete. Daemons started together on one config dir (one user's client key)
therefore agree: the first creates it, the others wait for the lock and read it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from gpud.node.paths import config_dir, ensure_private_dir, exclusive

SERVER_KEY = "server"
CLIENT_KEY = "client"
Z85_KEY_LENGTH = 40


class KeyFileError(Exception):
    """A key file or key text that cannot be used; the message says what to do."""


@dataclass(frozen=True)
class KeyPair:
    public: bytes  # z85, 40 bytes
    secret: bytes | None  # z85, or None when only the public half is known

    @property
    def public_text(self) -> str:
        return self.public.decode("ascii")


def check_public_key(text: str) -> bytes:
    """Validate a z85 public key as typed by a person; returns it as bytes."""
    key = text.strip()
    if len(key) != Z85_KEY_LENGTH:
        raise KeyFileError(
            f"a public key is {Z85_KEY_LENGTH} z85 characters, got {len(key)}: {key[:60]!r}"
        )
    try:
        raw = zmq.utils.z85.decode(key.encode("ascii"))
    except (ValueError, UnicodeEncodeError, KeyError, IndexError):
        raise KeyFileError(f"not a z85 public key: {key!r}") from None
    if len(raw) != 32:
        raise KeyFileError(f"not a z85 public key: {key!r}")
    return key.encode("ascii")


def client_key_dir() -> Path:
    return config_dir() / "keys"


def server_key_dir(state_dir: Path) -> Path:
    return state_dir / "keys"


def _paths(directory: Path, name: str) -> tuple[Path, Path]:
    return directory / f"{name}.key", directory / f"{name}.key_secret"


def load_keypair(directory: Path, name: str) -> KeyPair:
    """Load an existing key pair; KeyFileError with a hint when it is missing or unreadable."""
    _public_path, secret_path = _paths(directory, name)
    try:
        public, secret = zmq.auth.load_certificate(secret_path)
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"cannot read key {secret_path}: {exc}") from None
    if secret is None:
        raise KeyFileError(f"{secret_path} holds no secret key")
    return KeyPair(public=public, secret=secret)


def load_or_create_keypair(directory: Path, name: str) -> tuple[KeyPair, bool]:
    """The key pair `name` in `directory`, created if missing. Returns (pair, created)."""
    _public_path, secret_path = _paths(directory, name)
    if secret_path.exists():
        return load_keypair(directory, name), False
    ensure_private_dir(directory)
    with exclusive(secret_path):
        if secret_path.exists():  # another process created it while we waited
            return load_keypair(directory, name), False
        _create(directory, name)
    return load_keypair(directory, name), True


def _create(directory: Path, name: str) -> None:
    """Write a new pair beside its place, then rename it in: public key, then secret."""
    import shutil  # here: every gpuctl call loads a key, few create one
    import tempfile

    public_path, secret_path = _paths(directory, name)
    old_umask = os.umask(0o077)  # the secret must never be readable by others, not even briefly
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=directory))
        try:
            zmq.auth.create_certificates(str(staging), name)
            new_public, new_secret = _paths(staging, name)
            os.replace(new_public, public_path)
            os.replace(new_secret, secret_path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        os.umask(old_umask)


def load_client_keypair() -> KeyPair | None:
    """This user's client key, or None when it has not been created yet."""
    directory = client_key_dir()
    if not _paths(directory, CLIENT_KEY)[1].exists():
        return None
    return load_keypair(directory, CLIENT_KEY)


def load_or_create_client_keypair() -> tuple[KeyPair, bool]:
    return load_or_create_keypair(client_key_dir(), CLIENT_KEY)


def load_server_public_key(state_dir: Path) -> bytes:
    """The daemon's public key from its state dir (for `gpuctl keys server`)."""
    public_path, _secret_path = _paths(server_key_dir(state_dir), SERVER_KEY)
    try:
        public, _ = zmq.auth.load_certificate(public_path)
    except (OSError, ValueError):
        raise KeyFileError(
            f"no server key in {public_path.parent}: has a daemon been started with "
            f"--state-dir {state_dir}?"
        ) from None
    return public
