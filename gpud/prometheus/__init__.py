"""The Prometheus endpoint of `gpud serve --metrics` (issue 11)."""
