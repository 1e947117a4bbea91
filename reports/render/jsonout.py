"""`--format json`: a report or diff document as strict JSON."""

from __future__ import annotations

import json
import math


def to_json(doc: dict) -> str:
    """Strict JSON: a value that is not a finite number (an unknown figure) is null, never NaN."""
    return json.dumps(_finite(doc), indent=2, default=_json_default, allow_nan=False) + "\n"


def _finite(o):
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if hasattr(o, "item") and not hasattr(o, "__len__"):  # numpy scalar
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
