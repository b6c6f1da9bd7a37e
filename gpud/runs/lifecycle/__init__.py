"""A run from its launch to the last check: the rooms below, tied together.

`supervisor` (`Supervisor`) is the daemon's run service: launch, stop, resume, restarts and
the end-of-run checks; `queries` its read-only views (status, lists, logs, health),
`attached` runs that gpud did not start (watched through the attach socket) and
`aftermath` what is done after a part ended (whose fault, what is left).

The top room of `gpud.runs`: may import every other.
"""
