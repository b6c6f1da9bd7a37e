"""Test support: real daemons as subprocesses, free ports, raw zmq peers."""
