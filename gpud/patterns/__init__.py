"""User-supplied patterns: the spec's metric regexes, run on a linear-time engine (RE2)
wherever they run — the daemon, the Slurm part runner, `gpud attach` — with a time budget
per pattern, so one run's regex can never freeze the process that evaluates it."""
