"""`python -m tui`: the same as `gputop`."""

from tui.cli import main

main()
