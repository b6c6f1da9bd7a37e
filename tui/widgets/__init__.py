"""gputop's widgets, one per file; they render from the model and post messages up."""
