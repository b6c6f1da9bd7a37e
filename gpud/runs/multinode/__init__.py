"""The gang: one run across nodes, as node 0 runs it.

`gang` holds the gang's state on node 0 (one state for the whole run, whatever node it
comes from) and a node's own part of it; `decide` is what node 0 does with it, from plain
records (the gang as node 0 last saw it: `GangView`); `reserving` is the all-or-none round
that reserves an attempt's GPUs on every node, and its collective preflight; `local` what
the gang needs of this node's own parts (`LocalParts`); `peers` is node 0's links to the
other daemons, `peer_stops` the stops it asks until they are done, `coordinator_watch` a
node's own look at node 0, and `elastic` the attempt protocol of elastic runs (pure).

May import `gpud.runs.process`, `diagnosis`, `placement` and `state`.
"""
