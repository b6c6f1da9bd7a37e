"""`python -m gpud` is `gpud`."""

from gpud.cli import main

main()
