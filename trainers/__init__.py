"""Imported inside training processes: metrics, heartbeats, stop/resume handshake.

Must stay light: pyzmq and the standard library at import time.
"""
