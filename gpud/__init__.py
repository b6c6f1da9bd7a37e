"""gpud: the per-node daemon, its wire protocol, client, hardware samplers and auth."""

from __future__ import annotations

__version__ = "0.1.0"
