"""A run's records and their state changes on this node.

`book` (`RunBook`) is the one owner of run records and their states: every state change
goes through it, is stored and is published. `part` is one node's part of one attempt:
its shim, its log, its stop, its ending. `checkpoints` says which checkpoint a new attempt
resumes from.

May import `gpud.runs.process` and `gpud.runs.diagnosis`.
"""
