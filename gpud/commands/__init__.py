"""Commands of `gpud` beside `serve`: `demo` (the README's first command), `shutdown`
(`gpud stop`), and `frontend` (what every gpud command line shares: one-line usage errors
and their exit code).
"""
