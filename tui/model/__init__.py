"""gputop's model and feed: everything the UI shows, without a Textual import.

`fleet.FleetModel` holds every node and run behind one lock; `feed.Feed` runs one thread
per node that writes into it; `series`, `lttb` and `logs` keep histories bounded.
"""
