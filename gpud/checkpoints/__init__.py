"""Checkpoints on disk, as a resume sees them (issue 32 §5).

`whole`: whether a checkpoint file or directory is whole, from its own record of itself
(a zip archive's central directory, a safetensors header), so that a save cut short by a
full disk is passed over instead of resumed from. Standard library only; it reads files
and imports nothing of gpud's.
"""
