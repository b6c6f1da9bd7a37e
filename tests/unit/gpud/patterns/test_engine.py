"""RE2 for the patterns users write: what it takes, what it refuses, and in what words."""

from __future__ import annotations

import pytest

from gpud.patterns.engine import PatternError, compile_pattern
from launch.sections import MetricPattern

CATASTROPHIC = r"^(?P<loss>(a+)+)$"


def test_the_catastrophic_pattern_is_linear_on_re2() -> None:
    """Python's re takes minutes on one such line; 10,000 of them here are instant."""
    pattern = compile_pattern(CATASTROPHIC)
    for _ in range(10_000):
        assert pattern.search("a" * 34 + "b") is None
    assert pattern.search("a" * 34) == {"loss": "a" * 34}


def test_named_groups_are_found_by_name_and_unmatched_ones_left_out() -> None:
    pattern = compile_pattern(r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)(?:, lr (?P<lr>\S+))?")
    assert pattern.names == ("loss", "lr", "step")
    assert pattern.search("iter 12: loss 3.25") == {"step": "12", "loss": "3.25"}
    assert pattern.search("[rank0] iter 7: loss 1.5, lr 3e-4") == {
        "step": "7",
        "loss": "1.5",
        "lr": "3e-4",
    }
    assert pattern.search("nothing here") is None


def test_text_that_is_not_ascii_keeps_its_characters() -> None:
    pattern = compile_pattern(r"étape (?P<step>\d+) perte (?P<loss>[\d.]+)")
    assert pattern.search("→ étape 3 perte 0.5 ✓") == {"step": "3", "loss": "0.5"}


@pytest.mark.parametrize(
    ("source", "words"),
    [
        (r"(?P<loss>\d+)\1", "invalid escape sequence"),
        (r"(?P<loss>\d+)(?=ms)", "(?="),
        (r"(?<=loss )(?P<loss>\d+)", "(?<"),
        (r"(?P<loss>\d++)", "repetition operator"),
        (r"(?P<x>a)(?P=x)", "(?P"),
    ],
)
def test_what_needs_backtracking_is_refused_saying_so(source: str, words: str) -> None:
    with pytest.raises(PatternError) as err:
        compile_pattern(source)
    message = str(err.value)
    assert message.startswith("not supported by RE2: ") and words in message
    assert "backtracking" in message and "\n" not in message


def test_a_broken_or_huge_pattern_is_one_line() -> None:
    with pytest.raises(PatternError, match="not a valid regex: missing \\)"):
        compile_pattern("(?P<loss>x")
    with pytest.raises(PatternError, match="longer than 2000"):
        compile_pattern("x" * 2001)
    with pytest.raises(PatternError, match="too big for RE2"):
        compile_pattern(r"(?P<loss>(x{1000}){1000})")


def test_the_spec_refuses_at_launch_what_re2_refuses() -> None:
    with pytest.raises(ValueError, match="not supported by RE2"):
        MetricPattern(pattern=r"(?P<loss>\d+)(?!ms)")
    assert MetricPattern(pattern=CATASTROPHIC).pattern == CATASTROPHIC
