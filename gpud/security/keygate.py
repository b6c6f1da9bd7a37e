"""Which authorized key may open another events connection now.

Asked at every CURVE handshake on the events socket (its own ZAP domain), after the key
was found authorized. Two rules, both per key:

- **A burst, then a rate.** A key may open `burst` connections at once, then one every
  `refill_s`: gputop opens one per node, a script a few; 340 from one key is a loop.
- **A key cut for abuse waits.** When the guard cuts one of a key's connections for what
  it did (too many subscriptions, too much in flight), the key is refused for
  `penalty_s`. libzmq reconnects a cut SUB socket by itself and sends its subscriptions
  again, so without this a connection over its allowance is cut, reconnects and is cut
  again, forever; a refused handshake instead ends the client's connection for good
  (libzmq does not retry an authentication failure).

A refused handshake costs the daemon one CURVE handshake and nothing else: no pipe, no
subscription, no trie walk. Thread-safe: the ZAP thread asks, the events thread penalizes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Connections one key may open at once on the events socket.
BURST = 32
#: Then one more every this many seconds.
REFILL_S = 1.0
#: How long a key the guard cut for abuse is refused.
PENALTY_S = 30.0


@dataclass
class _Key:
    tokens: float
    at: float
    refused_until: float = 0.0


class KeyGate:
    def __init__(
        self,
        burst: int = BURST,
        refill_s: float = REFILL_S,
        penalty_s: float = PENALTY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.refill_s = refill_s
        self.penalty_s = penalty_s
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, _Key] = {}  # authorized keys only: bounded by the key file

    def _entry(self, key: str, now: float) -> _Key:
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Key(float(self.burst), now)
        else:
            entry.tokens = min(float(self.burst), entry.tokens + (now - entry.at) / self.refill_s)
            entry.at = now
        return entry

    def admit(self, key: str) -> str | None:
        """None when `key` may connect now (and counts it); else why not, in a few words."""
        with self._lock:
            now = self._clock()
            entry = self._entry(key, now)
            if now < entry.refused_until:
                return f"refused for {entry.refused_until - now:.0f} s more after a cut for abuse"
            if entry.tokens < 1.0:
                return f"over {self.burst} connections at once (then one per {self.refill_s:g} s)"
            entry.tokens -= 1.0
            return None

    def penalize(self, key: str) -> None:
        with self._lock:
            now = self._clock()
            self._entry(key, now).refused_until = now + self.penalty_s

    def penalized(self, key: str) -> bool:
        with self._lock:
            entry = self._keys.get(key)
            return entry is not None and self._clock() < entry.refused_until
