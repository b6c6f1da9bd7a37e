"""The processes of one node's part of a run: the shim that starts and owns them and pumps
their output into the attempt's log (`shim`, also run as `python -m gpud.runs.process.shim`),
and finding and ending a run's processes by the tags they carry (`procs`).

The lowest room of `gpud.runs`: imports nothing else of it.
"""
