"""Model FLOPs utilization (issue 23 §1): how much of its GPUs' peak a run achieves.

`peaks` holds the table of GPU model × dtype; `model` the `RunFlops` record every view
reads (on node 0's health summary, in `gpuctl status`, on `/metrics`); `mfu` the pure math
from what the daemon knows of a run (the FLOPs source, its rate, its GPUs) to that record.
Nothing here does I/O.
"""
