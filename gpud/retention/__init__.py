"""Bounded state (issue 22 §1): what a daemon keeps of finished runs, and for how long.

`policy` (pure) holds the `retention:` settings and chooses which finished runs go;
`reduce` (pure) thins a finished run's old metric points to the shape of its curve;
`files` measures and removes run dirs, never a checkpoint; `rows` deletes a run's rows in
batches that each hold the loop a few milliseconds; `compact` keeps SQLite's file small
(incremental vacuum); `usage` is the per-run row that outlives a pruned run; `service`
is the daemon's side: `gpuctl gc` and the periodic pass, off the control loop; `heap`
keeps what the daemon has held for minutes out of the garbage collector's walks.
"""
