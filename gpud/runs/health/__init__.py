"""A running run's health: what its trainers tell gpud, and what gpud makes of it.

`intake` takes what this node's runs say (their parts' output, their trainers' messages),
`telemetry` keeps heartbeats, probes and metrics history, `verdict` assesses the run's
health from its ranks (straggler, stall, bandwidth, warnings), `stragglers` keeps that
verdict still, `hangs` acts on a run that hangs, and `goodput` accounts node 0's goodput.

May import `gpud.runs.process`, `diagnosis`, `placement`, `state` and `multinode`.
"""
