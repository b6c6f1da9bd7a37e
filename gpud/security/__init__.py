"""Who may do what to a daemon, and how much one client may make it hold.

`keys` (CurveZMQ key pairs on disk), `known_nodes` (the server key pinned for each daemon a
user knows), `roles` (what a key may do), `auth` (authorized keys and the ZAP
authenticator), `keygate` (who may open another events connection), `guard` (what one
client may make the daemon hold), `audit` (who did what, in the audit log) and `bursts` (a
repeated thing told once, then counted).

May import `gpud.model` and `gpud.node`; never the wire or the runs.
"""
