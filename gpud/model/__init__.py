"""Data, no I/O: what a run is (`run`: states, records, events, health), what trainers
send (`trainer_messages`), what one hardware sample is (`snapshot`), byte sizes as people
write them (`sizes`) and daemon addresses as people type them (`endpoints`).

Everything else builds on these. The lowest room of `gpud`: it may import only the pure
records of `gpud.efficiency`.
"""
