"""--inject: what allocscope's agent itself keeps resident in the target.

The agent's tables (tracer/inject/agent.py: the thread states, 1 MiB; the set of sampled pointers, 8 MiB
of buckets a pointer lands in by its hash, and 128 KiB of counts; 16 KiB of page counts in front of
them; the watchdog's stack; the fork guard's page) are an anonymous mapping made with
MAP_NORESERVE: only the pages touched are resident, ~4 KiB for each sampled block (live or since
freed) until every page of the set has been, ~9.2 MiB at most. Those
pages are in the target's RssAnon, so the report's "other anonymous" holds them; this measures
them (pagemap, once, when the meta is written at the end), so that the report can say how much.
"""

from __future__ import annotations


def tables_span() -> int:
    """Bytes of the agent's tables mapping (its thread states, set, counts, watchdog stack and
    fork guard's page)."""
    from .agent import TABLES_SPAN  # noqa: PLC0415

    return TABLES_SPAN


def tables_resident(pid: int, tables: int) -> int | None:
    """Resident bytes of the agent's tables at `tables` in `pid`; None when unknown (the process
    gone, no tables)."""
    from ..allocators.arenas import resident_meter  # noqa: PLC0415

    if not tables:
        return None
    try:
        with resident_meter(pid) as m:
            return int(m.resident(tables, tables + tables_span()))
    except OSError:
        return None
