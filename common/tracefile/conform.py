"""Check the fields of a trace's meta.json that the reports use, so a damaged or hand-edited
meta.json gives a trace with warnings, never an exception deep inside a report.

`sanitize(meta)` returns (meta, warnings): every field the reports read has its documented type
afterwards; a field of the wrong type is dropped (or, for strings, turned into one) and named in
a warning. Fields nobody reads are left as they are.
"""

from __future__ import annotations

import math
from typing import Any

# field -> expected kind; nested objects by dotted name
_OBJECTS = ("target", "probes", "clock", "labels", "limits", "host", "tool", "sampling")
_NUMBERS = {"interval_s": "positive", "duration_s": "any", "created": "any", "clock.wall_s": "any"}
_INTS = (
    "clock.monotonic_ns",
    "sampling.sample_bytes",
    "sampling.fault_sample",
    "target.pid",
    "limits.max_live",
    "limits.max_stacks",
    "limits.max_sites",
    "intervals",
)
_STRINGS = (
    "end_reason",
    "mode",
    "target.comm",
    "target.exe",
    "target.exe_build_id",
    "probes.allocator",
    "probes.allocator_kind",
    "host.kernel",
    "host.hostname",
)
_STR_LISTS = ("target.argv", "probes.attached", "probes.tracepoints")
_STR_DICTS = ("labels", "probes.aliases", "probes.skipped", "probes.placement")


def _get(meta: dict, dotted: str):
    parts = dotted.split(".")
    obj: Any = meta
    for p in parts[:-1]:
        obj = obj.get(p)
        if not isinstance(obj, dict):
            return None, None
    return obj, parts[-1]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**64


def sanitize(meta: dict) -> tuple[dict, list[str]]:
    warnings: list[str] = []

    def bad(name: str, why: str) -> None:
        warnings.append(f"meta.json: {name} {why}; ignored")

    for key in _OBJECTS:
        if key in meta and meta[key] is not None and not isinstance(meta[key], dict):
            bad(key, "is not an object")
            meta[key] = {}
    for name, kind in _NUMBERS.items():
        obj, key = _get(meta, name)
        if obj is None or key not in obj or obj[key] is None:
            continue
        v = obj[key]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if ok and kind == "positive":
            ok = v > 0
        if not ok:
            bad(name, "is not a valid number")
            del obj[key]
    for name in _INTS:
        obj, key = _get(meta, name)
        if obj is not None and key in obj and obj[key] is not None and not _is_int(obj[key]):
            bad(name, "is not an integer")
            del obj[key]
    for name in _STRINGS:
        obj, key = _get(meta, name)
        if obj is not None and key in obj and obj[key] is not None and not isinstance(obj[key], str):
            bad(name, "is not a string")
            del obj[key]
    for name in _STR_LISTS:
        obj, key = _get(meta, name)
        if (
            obj is not None
            and key in obj
            and obj[key] is not None
            and not (isinstance(obj[key], list) and all(isinstance(x, str) for x in obj[key]))
        ):
            bad(name, "is not a list of strings")
            del obj[key]
    for name in _STR_DICTS:
        obj, key = _get(meta, name)
        if (
            obj is not None
            and isinstance(obj.get(key), dict)
            and not all(isinstance(v, str) for v in obj[key].values())
        ):
            bad(name, "has values that are not strings")
            obj[key] = {k: v for k, v in obj[key].items() if isinstance(v, str)}
    return meta, warnings


# --- parts ----------------------------------------------------------------------------------------

# Columns every `intervals` part has (the lost_*/n_* counters beside them vary by version).
INTERVAL_COLUMNS = (
    "seq",
    "ts_ns",
    "elapsed_s",
    "rss_bytes",
    "rss_anon_bytes",
    "rss_file_bytes",
    "rss_shmem_bytes",
    "hwm_bytes",
    "heap_live_bytes",
    "heap_peak_bytes",
    "mmap_live_bytes",
    "live_bytes",
    "live_count",
    "target_alive",
)
# Columns that may be null (the rest never are in a trace the tracer wrote).
NULLABLE = {"stacks": {"function", "file", "line"}}


def first_line(e: BaseException) -> str:
    """An error's first line, whole (Arrow's can run on for lines; a warning is never cut)."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def conform_part(table: str, tab, schemas: dict, seq: int | None = None, after: int | None = None):
    """`tab` (one part of `table`, named with interval `seq`) with the table's columns and types,
    rows with missing values dropped: (table, rows dropped). Raises ValueError saying why when
    the part does not hold that table (wrong columns, values that do not fit the types, rows of
    other intervals than its name says: a part holds rows of the intervals after `after` (the
    seq of its table's part before it; None: seq - 1) up to `seq` — one interval up to version 5,
    several when the writer held them, version 6).
    Tables without a fixed schema (intervals: its counters vary) only need an integer `seq`."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415

    if table in schemas:
        want = schemas[table]
        from .format import ADDED_COLUMNS  # noqa: PLC0415

        for name, value in ADDED_COLUMNS.get(table, {}).items():  # a part written before they were
            if name not in tab.column_names and name in want.names:
                tab = tab.append_column(name, pa.array([value] * tab.num_rows, want.field(name).type))
        missing = [c for c in want.names if c not in tab.column_names]
        if missing:
            raise ValueError(f"no column {missing[0]}")
        tab = tab.select(want.names)
        # A string column read as a dictionary (the reader asks for that on big tables) stays
        # one: same values, no per-row strings.
        target = pa.schema(
            [
                pa.field(f.name, pa.dictionary(pa.int32(), f.type))
                if f.type == pa.string() and pa.types.is_dictionary(tab.schema.field(f.name).type)
                else f
                for f in want
            ]
        )
        try:
            tab = tab.cast(target)
        except (pa.ArrowException, ValueError, TypeError) as e:
            raise ValueError(f"values do not fit: {first_line(e)}") from None
        check = [c for c in want.names if c not in NULLABLE.get(table, ())]
    else:
        missing = [c for c in INTERVAL_COLUMNS if c not in tab.column_names]
        if missing:
            raise ValueError(f"no column {missing[0]}")
        numeric = [f.name for f in tab.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
        wrong = [c for c in INTERVAL_COLUMNS if c not in numeric]
        if wrong:
            raise ValueError(f"column {wrong[0]} is not a number")
        tab = tab.select(numeric)  # counters are numbers; anything else is not ours to sum
        try:
            tab = tab.set_column(tab.column_names.index("seq"), "seq", tab["seq"].cast(pa.int64()))
        except (pa.ArrowException, ValueError, TypeError) as e:
            raise ValueError(f"seq is not an integer: {first_line(e)}") from None
        check = list(INTERVAL_COLUMNS)
    if seq is not None and "seq" in tab.column_names and tab.num_rows:
        lo, hi = pc.min(tab["seq"]).as_py(), pc.max(tab["seq"]).as_py()
        first = seq if after is None else after + 1
        if (lo is not None and lo < first) or (hi is not None and hi > seq):
            want = str(seq) if first >= seq else f"{first}..{seq}"
            raise ValueError(f"its rows are of interval {lo}..{hi}, its name says {want}")
    keep = None
    for c in check:
        if tab[c].null_count:
            valid = pc.is_valid(tab[c])
            keep = valid if keep is None else pc.and_(keep, valid)
    if keep is None:
        return tab, 0
    kept = tab.filter(keep)
    return kept, tab.num_rows - kept.num_rows
