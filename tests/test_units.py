import pytest

from simcore.units import (
    UnitError,
    format_bytes,
    format_rate,
    format_time,
    parse_rate,
    parse_size,
    parse_time,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("10Gbps", 1.25e9),
        ("100Gb/s", 12.5e9),
        ("25GB/s", 25e9),
        ("1.5 GB/s", 1.5e9),
        ("8bps", 1.0),
        ("12.5e9B/s", 12.5e9),
        (3e9, 3e9),
        ("1GiB/s", 2**30),
    ],
)
def test_parse_rate(text, expected):
    assert parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["fast", "", "10 Gbit", "-1Gbps", "0Gbps", "inf", True])
def test_parse_rate_rejects(bad):
    with pytest.raises(UnitError) as err:
        parse_rate(bad)
    assert err.value.expected


@pytest.mark.parametrize(
    "text, expected",
    [("25MiB", 25 * 2**20), ("4096", 4096), ("1.5GB", 1_500_000_000), ("1KiB", 1024), (7, 7)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text, expected", [("2us", 2e-6), ("0.5ms", 5e-4), ("1e-6", 1e-6), ("3s", 3.0), ("10ns", 1e-8)]
)
def test_parse_time(text, expected):
    assert parse_time(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["lots", "-3MiB"])
def test_parse_size_rejects(bad):
    with pytest.raises(UnitError):
        parse_size(bad)


def test_formatting_round_trips_units():
    assert format_rate(1.25e9) == "10 Gbps"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_time(0.0123) == "12.3 ms"
