"""The wire: every message between gpud, gpuctl, gputop and trainers, and the sockets that
carry them.

`protocol` declares every message and method once; `brief` is a node in brief; `client` is
the one client of a daemon (gpuctl and gputop use it); `control` the control socket,
`publisher` the events socket, `ingest` the trainer-facing sockets, and `drain` reads a zmq
socket from the asyncio loop.

May import `gpud.model`, `gpud.node` and `gpud.security` (and the pure records of
`gpud.efficiency`, `gpud.notify.targets` and `gpud.retention.usage`); never the runs.
"""
