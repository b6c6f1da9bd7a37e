"""Runs under Slurm: the part runner srun starts on every node of a job (issue 12)."""
