"""What a client key may do: the role an authorized key carries.

Pure. The wire carries roles (`gpud.wire.protocol` re-exports `Role`); `gpud.security.auth`
gives each key one.
"""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    """What a client key may do.

    An operator can do everything. A viewer reads. A peer is another node's daemon acting
    as the coordinator of a run that has a part here: it may start, stop and query that
    run's parts, and nothing else (the handler checks which run).
    """

    VIEWER = "viewer"
    OPERATOR = "operator"
    PEER = "peer"

    def allows(self, needed: Role) -> bool:
        return self is Role.OPERATOR or needed is self
