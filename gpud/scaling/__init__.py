"""Scaling as data: `arithmetic` turns runs' own records into throughput, speedup and
efficiency (pure, no I/O), `baselines` keeps the user's measured baseline per spec name.
`gpuctl scaling` measures, gputop compares a live run with the baseline.
"""
