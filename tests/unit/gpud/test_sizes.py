"""Byte sizes as people write them, and as logs show them."""

from __future__ import annotations

import pytest

from gpud.model.sizes import SizeError, parse_size, size_text


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (4096, 4096),
        ("4096", 4096),
        ("200kB", 200_000),
        ("200 KB", 200_000),
        ("100MB", 100_000_000),
        ("100M", 100_000_000),
        ("1.5GB", 1_500_000_000),
        ("64KiB", 65_536),
        ("2GiB", 2 * 1024**3),
        ("1Ti", 1024**4),
    ],
)
def test_sizes_parse_in_si_and_iec_units(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "-1", -5, "1.5XB", "", True, None, "MB"])
def test_what_is_not_a_size_says_what_is_expected(text: object) -> None:
    with pytest.raises(SizeError, match="expected a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("size", "text"),
    [(512, "512 B"), (200_000, "200 kB"), (2_450_000, "2.45 MB"), (100_000_000, "100 MB"),
     (1_234_567_890, "1.23 GB"), (999_999, "1 MB")],
)  # fmt: skip
def test_sizes_are_written_the_short_si_way(size: int, text: str) -> None:
    assert size_text(size) == text
