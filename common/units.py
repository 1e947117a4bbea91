"""Byte counts for people: 1.5 MiB, 12 B. The tracer's progress lines and the reports' words say
sizes alike (reports/units.py adds rates and deltas); imports nothing."""

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
