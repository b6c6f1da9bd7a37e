"""gpud: the per-node daemon, its wire protocol, client, hardware samplers and auth."""

from __future__ import annotations

#: The one place the release is set (semantic versioning): pyproject.toml reads it, and
#: `gpud --version`, `gpuctl --version`, `gputop --version` and `node.info` report it. The
#: wire protocol has a version of its own (`gpud.wire.protocol.PROTOCOL_VERSION`).
__version__ = "0.2.0"
