"""The gang: one run across nodes, as node 0 runs it.

`gang` holds the gang's state on node 0 (one state for the whole run, whatever node it
comes from) and a node's own part of it; `decide` is what node 0 does with it, from plain
records; `peers` is node 0's link to the other daemons, `peer_stops` the stops it asks
until they are done, `coordinator_watch` a node's own look at node 0, and `elastic` the
attempt protocol of elastic runs (pure).

May import `gpud.runs.process`, `diagnosis`, `placement` and `state`.
"""
