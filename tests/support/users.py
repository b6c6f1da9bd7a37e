"""Other local users, for the tests of what one user can do to another's runs.

Needs root (to create users and to become them). The interpreter may not be reachable by
another user (it lives under /root here), so code runs as that user in a forked child of
the test process: `os.fork()`, drop to the user's uid and gid, run a function, send back
its JSON result. Only fresh sockets may be used in the child.
"""

from __future__ import annotations

import json
import os
import pwd
import select
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root: it creates two local users and acts as each"
    if shutil.which("useradd") is None:
        return "useradd is not installed"
    return None


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


def local_user(name: str) -> User:
    """The user, created (no home, no login) if this host does not have it."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True, capture_output=True,
        )  # fmt: skip
        entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid)


def _become(user: User) -> None:
    os.setgroups([])
    os.setgid(user.gid)
    os.setuid(user.uid)


class AsUser:
    """`fn` running as `user` in a forked child; `result()` waits for what it returned.

    `fn` gets a `stop` callable: it may block on it (returns once the test calls `stop()`
    here), to keep a connection open while the test does other things.
    """

    def __init__(self, user: User, fn: Callable[[Callable[[], None]], Any]) -> None:
        out_r, out_w = os.pipe()
        stop_r, stop_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            code = 0
            try:
                os.close(out_r)
                os.close(stop_w)
                _become(user)

                def wait() -> None:
                    os.read(stop_r, 1)  # returns when the test closes its end

                value = fn(wait)
                payload = json.dumps({"ok": True, "value": value})
            except BaseException as exc:  # report anything: the test fails with it
                payload = json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                code = 1
            os.write(out_w, payload.encode())
            os._exit(code)
        os.close(out_w)
        os.close(stop_r)
        self.pid = pid
        self._out = out_r
        self._stop = stop_w

    def stop(self) -> None:
        if self._stop >= 0:
            os.close(self._stop)  # the child's read returns
            self._stop = -1

    def result(self, timeout: float = 30.0) -> Any:
        ready, _, _ = select.select([self._out], [], [], timeout)
        if not ready:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
            raise AssertionError(f"the child as another user did not answer in {timeout}s")
        data = b""
        while chunk := os.read(self._out, 65536):
            data += chunk
        os.close(self._out)
        os.waitpid(self.pid, 0)
        reply = json.loads(data or b'{"ok": false, "error": "no answer"}')
        if not reply["ok"]:
            raise AssertionError(f"as another user: {reply['error']}")
        return reply["value"]


def run_as(user: User, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
    """`fn()` as `user`; its JSON-able result."""
    child = AsUser(user, lambda stop: fn())
    return child.result(timeout)
