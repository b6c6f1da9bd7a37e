"""The wire: every message between gpud, gpuctl, gputop and trainers, and the sockets that
carry them.

`protocol` declares every method once and encodes and decodes requests, replies and
events; `envelope` holds the envelopes, versions and error codes, `node_messages` and
`run_messages` the bodies; `brief` is a node in brief (`briefing` builds it); `client` is
the one client of a daemon (gpuctl and gputop use it); `control` the control socket,
`publisher` the events socket, `ingest` the trainer-facing sockets, and `drain` reads a zmq
socket from the asyncio loop.

May import `gpud.model`, `gpud.node` and `gpud.security` (and the pure records of
`gpud.efficiency`, `gpud.notify.targets` and `gpud.retention.usage`); never the runs.
"""
