"""gputop: the terminal UI over every gpud node."""
