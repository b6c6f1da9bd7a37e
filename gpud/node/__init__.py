"""The node's own state: where gpud keeps things (`paths`), the daemon's state dir and its
lock (`statedir`), its SQLite database (`store`) and the writes a full disk refused
(`backlog`), and the daemon's CPU by component (`ledger`).

May import `gpud.model`; never the wire, security or the runs.
"""
