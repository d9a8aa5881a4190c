"""The one size parser and the one duration parser every flag uses, as tables."""

from __future__ import annotations

import pytest

from toolproxy.term.quantities import parse_duration, parse_size

K, M, G = 1024, 1024**2, 1024**3


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4096", 4096),
        ("0", 0),
        ("100b", 100),
        ("100B", 100),
        ("4k", 4 * K),
        ("4kb", 4 * K),
        ("4KiB", 4 * K),
        ("512K", 512 * K),
        ("64MiB", 64 * M),
        ("64mb", 64 * M),
        ("64m", 64 * M),
        ("1.5g", int(1.5 * G)),
        ("20GiB", 20 * G),
        ("2T", 2 * 1024**4),
        (" 8 MiB ", 8 * M),
        ("200000", 200_000),
    ],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "1x", "-5", "5ib", "k", "1e9", "1.5.2m", "64 MiB extra", "1 kk"])
def test_not_sizes(text):
    with pytest.raises(ValueError, match="is not a size; write a number and a unit"):
        parse_size(text)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("90s", 90),
        ("30m", 1800),
        ("12h", 43200),
        ("7d", 7 * 86400),
        ("2w", 14 * 86400),
        ("1.5H", 5400),
        (" 5 s ", 5),
    ],
)
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "90", "soon", "5y", "-1d", "1d2h"])
def test_not_durations(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)
