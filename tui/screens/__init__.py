"""gputop's screens, one per file, each with its own .tcss."""
