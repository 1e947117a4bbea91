"""Byte counts and rates for people: 1.5 MiB, +12 KiB, +1.5 KiB/s. Shared by the analysis (the
findings' sentences), the renderers and the live view; imports nothing."""

from __future__ import annotations

_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]


def human_bytes(n: float | int | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for u in _UNITS:
        if n < 1024 or u == _UNITS[-1]:
            return f"{sign}{n:.0f} {u}" if u == "B" else f"{sign}{n:.1f} {u}"
        n /= 1024
    return f"{sign}{n:.1f} PiB"


def human_rate(n: float | None) -> str:
    """Bytes per second with a sign: +1.5 KiB/s; '-' when unknown."""
    if n is None:
        return "-"
    return ("+" if n > 0 else "") + human_bytes(n) + "/s"


def human_delta(n: int | None) -> str:
    """A byte delta with a sign: +1.5 KiB, -12 B, 0 B."""
    if n is None:
        return "-"
    return ("+" if n > 0 else "") + human_bytes(n)
