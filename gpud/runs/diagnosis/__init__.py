"""What a run says and why it failed.

`attempt_log` reads an attempt's captured log (as the shim wrote it, bounded), `logread`
serves it to `gpuctl logs`, `logparse` reads trainer output (rank prefixes, tracebacks,
NCCL and torchrun lines), `flight` and `fr_analyze` read NCCL flight-recorder dumps,
`causes` settles the cause of a failed attempt from the evidence, and `hints` says what to
do about a known one. Pure apart from reading files.

May import `gpud.runs.process`, and nothing else of `gpud.runs`.
"""
