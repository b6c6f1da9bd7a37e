"""A run from its launch to the last check: the rooms below, tied together.

`supervisor` (`Supervisor`) is the daemon's run service: launch, join, stop, resume,
restarts, the tick and the end of each part; `starting` (`PartStarter`) its launch and
placement path: a request's spec checked, the GPUs taken, the part placed and spawned, the
GPU preflight on them; `queries` its read-only views (status, lists, logs, health),
`attached` runs that gpud did not start (watched through the attach socket) and
`aftermath` what is done after a part ended (why, whose fault, what is left).

The top room of `gpud.runs`: may import every other.
"""
