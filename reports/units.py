"""Byte counts and rates for people: 1.5 MiB, +12 KiB, +1.5 KiB/s. Shared by the analysis (the
findings' sentences), the renderers and the live view; human_bytes itself is common/units.py's
(the tracer's lines say sizes the same way)."""

from __future__ import annotations

from common.units import human_bytes

__all__ = ["human_bytes", "human_delta", "human_rate"]


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
