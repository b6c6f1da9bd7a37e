"""Running trainers: the shim, process tracking, per-node supervision, gang coordination."""
