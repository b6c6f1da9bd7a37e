"""The one regex engine for patterns a user writes: RE2, linear in the line's length.

Python's `re` backtracks: `^(?P<loss>(a+)+)$` against a line of 35 `a`s and a `b` takes
minutes, and a daemon evaluating it on its loop answers nobody meanwhile. RE2 (google-re2)
runs every pattern in time linear in the text, at the price of the features that need
backtracking. It refuses, at compile time and so at `gpuctl launch`:

- backreferences (`\\1`, `(?P=name)`),
- lookahead and lookbehind (`(?=…)`, `(?!…)`, `(?<=…)`, `(?<!…)`),
- possessive quantifiers and atomic groups (`a++`, `(?>…)`),
- `\\Z` (use `$`), conditionals, and nesting or repetition past RE2's limits (1000).

Everything else the README promises works as in Python: named groups `(?P<loss>…)`,
classes, `\\d` `\\s` `\\w` (ASCII), anchors, `(?i)`, alternation, counted repetition.

This module is pure (no I/O): the spec validates patterns with it. Matching works on the
line's UTF-8 bytes through RE2's own object — the `re`-compatible wrapper around it costs
four times as much per line (bench/pattern_engines.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import re2

#: What the engine is called in messages and the README.
ENGINE = "RE2"
#: The longest pattern a spec may hold.
MAX_PATTERN_CHARS = 2000
#: RE2's memory for one compiled pattern (its DFA cache); past it RE2 refuses the pattern
#: or falls back to its slower NFA — still linear.
MAX_MEM_BYTES = 8 << 20

_NULL_SPAN = (-1, -1)
_UNANCHORED = re2._Anchor.UNANCHORED

WHAT_RE2_REFUSES = (
    "backreferences, lookarounds, possessive quantifiers and atomic groups need"
    " backtracking, which the linear-time engine (RE2) does not do"
)


class PatternError(ValueError):
    """A pattern the engine refuses; the message is one line that says why."""


class _Native(Protocol):
    def Match(self, anchor: Any, text: bytes, pos: int, endpos: int) -> list[tuple[int, int]]: ...  # noqa: N802

    def NamedCapturingGroups(self) -> list[tuple[bytes, int]]: ...  # noqa: N802


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would print every refusal to stderr
    options.max_mem = MAX_MEM_BYTES
    return options


@dataclass(frozen=True)
class Pattern:
    """A compiled pattern: `search(line)` gives its named groups' text, or None."""

    source: str
    native: _Native
    #: Named groups by their index in RE2's spans.
    groups: tuple[tuple[str, int], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.groups)

    def search_bytes(self, data: bytes) -> dict[str, str] | None:
        spans = self.native.Match(_UNANCHORED, data, 0, len(data))
        if spans[0] == _NULL_SPAN:
            return None
        found = {}
        for name, index in self.groups:
            start, end = spans[index]
            if start != -1:
                found[name] = data[start:end].decode(errors="replace")
        return found

    def search(self, text: str) -> dict[str, str] | None:
        return self.search_bytes(text.encode(errors="replace"))


def compile_pattern(source: str) -> Pattern:
    """Compile `source` for RE2, or raise PatternError with the reason in one line."""
    if len(source) > MAX_PATTERN_CHARS:
        raise PatternError(f"longer than {MAX_PATTERN_CHARS} characters")
    try:
        native = re2._re2.RE2(source.encode(), _options())
    except (TypeError, ValueError, UnicodeError) as exc:
        raise PatternError(f"not a usable pattern: {exc}") from None
    if not native.ok():
        raise PatternError(_explain(native.error()))
    groups = tuple(sorted((name.decode(), index) for name, index in native.NamedCapturingGroups()))
    return Pattern(source, native, groups)


def _explain(error: bytes | str) -> str:
    text = error.decode(errors="replace") if isinstance(error, bytes) else str(error)
    if any(m in text for m in ("invalid perl operator", "invalid escape", "repetition operator")):
        return f"not supported by {ENGINE}: {text} ({WHAT_RE2_REFUSES})"
    if "too large" in text or "too deeply" in text or "repetition size" in text:
        return f"too big for {ENGINE}: {text}"
    return f"not a valid regex: {text}"
