"""Where a part runs: its GPUs and its MASTER_PORT.

`gpus` is the pure choice (the spec's `gpus` against the node's GPUs and what holds them),
`leases` keeps which run holds which GPUs (in the store, checked against NVML's process
list), `ports` leases MASTER_PORTs, `simload` turns real ranks into load on simulated GPUs.

May import `gpud.runs.process`, and nothing else of `gpud.runs`.
"""
