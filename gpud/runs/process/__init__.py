"""The processes of one node's part of a run: the shim that starts and owns them and pumps
their output into the attempt's log (`shim`: standard library only, started by its path as
`python -S shim.py`, so it runs without gpud importable), and finding and ending a run's
processes by the tags they carry (`procs`).

The lowest room of `gpud.runs`: imports nothing else of it.
"""
