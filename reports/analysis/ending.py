"""How the target ended (`recording.end`) and the finding that says it first."""

from __future__ import annotations


def recording_end(meta: dict) -> dict | None:
    """meta.json's `end` as the report's `recording.end` (None for traces written before it)."""
    end = meta.get("end")
    return dict(end) if isinstance(end, dict) else None


def end_finding(doc: dict) -> dict | None:
    """The first finding of a killed or OOM-killed target (None otherwise)."""
    return None
