"""The RSS split of a sampled recording (--sample-bytes, --inject): what is an estimate, how
wide its error is, and what allocscope's own agent keeps resident in the process.

Under sampling each allocator's `live` is an estimate (sites' live bytes: a sampled block stands
for max(size, N) bytes), with the 95 % bound of `sampling_error`. The figures derived from it by
subtraction carry the same error, with the opposite sign: `retained` (resident − live), or, for
glibc with its census, `live_before_attach` (the census's chunks in use − the chunks of the
blocks seen), which also counts the chunk headers of the blocks not sampled (8–23 bytes each:
allocscope keeps a sampled block's weight, not its size); glibc's `retained` is then
(nearly) exact: resident − the census's chunks in use. Under --inject, "other anonymous" also
holds the agent's tables (tracer/inject/agentrss.py), measured at the end.
"""

from __future__ import annotations

from common.tracefile.reader import Trace

from .sites import sampling_error

NOTE = (
    "sampled: live is an estimate (±live_error, 95 %); the same error lies in retained, or, for glibc "
    "with its census, in live before the attach (with the unsampled blocks' chunk headers)"
)
AGENT_NOTE = "allocscope's --inject agent: its tables' resident pages, inside other anonymous"


def sample_bytes_of(trace: Trace) -> int:
    return int((trace.meta.get("sampling") or {}).get("sample_bytes", 0) or 0)


def sampled_split(trace: Trace, allocs: list[dict], parts: dict) -> dict:
    """Adds each allocator's `live_error` (sampled recordings) and returns the keys for the RSS
    split: live_heap_error_bytes and sampled_note (sampled), inject_agent_bytes and
    inject_agent_note (--inject, when the tracer measured the agent's tables; at most the other
    anonymous bytes). {} for a recording of every block."""
    n = sample_bytes_of(trace)
    out: dict = {}
    if n:
        for a in allocs:
            a["live_error"] = sampling_error(a["live"], n)
        out.update(live_heap_error_bytes=sampling_error(parts["live_heap_bytes"], n), sampled_note=NOTE)
    inj = (trace.meta.get("probes") or {}).get("inject")
    if isinstance(inj, dict) and isinstance(inj.get("tables_resident_bytes"), int):
        out.update(
            inject_agent_bytes=min(inj["tables_resident_bytes"], parts["other_anon_bytes"]),
            inject_agent_note=AGENT_NOTE,
        )
    return out
