"""Whole-process totals, losses and what to do about them, and the notes a sampled or
residency-mode trace carries."""

from __future__ import annotations

import os

import pandas as pd

from common.tracefile.names import lost_events
from common.tracefile.reader import Trace

from .sources import by_source, is_device, live_by_source
from .timeline import peak_margin, peak_rows
from .touches import kill_rss

LOSS_ADVICE = {
    "lost_live_full": "the live-allocation map was full: raise --max-live",
    "lost_live_full_bytes": None,
    "lost_stack_full": "the stack map was full: some bytes are shown under '[stack lost]'",
    "lost_stack_err": "some stacks could not be read: those bytes are under '[stack lost]'",
    "lost_site_full": "the site map was full: bytes counted in totals but not per site",
    "lost_inflight_full": "no kernel memory for a thread's entry state: some calls were not seen",
    "lost_unmatched_ret": "returns without their entry (normal right after attach; large values mean missed calls)",
    "lost_stale_entry": "entries whose return was never seen (a thread left malloc abnormally)",
    "lost_ring_full": "the event ring overflowed: some mmap/munmap/thread events are missing",
    "lost_flow_full": "the thread-flow map was full: some cross-thread frees are not in the flow table",
    "lost_stack_truncated": "some stacks were cut short (deeper than 64 frames, or code the DWARF unwinder "
    "cannot follow): their sites show the innermost frames only; their bytes are all counted",
    "lost_stack_pending": "some stacks were cut short at a module whose unwind table was still being built "
    "(the lines below say which, until when); `allocscope doctor --pid PID --warm` "
    "before recording builds them all ahead",
}


def losses(trace: Trace) -> dict[str, int]:
    """Every lost_* counter at the end of the recording (cumulative)."""
    last = trace.intervals.iloc[-1]
    return {c: int(last[c]) for c in trace.intervals.columns if c.startswith("lost_") and not pd.isna(last[c])}


def _col_max(df: pd.DataFrame, col: str) -> int:
    return int(df[col].max()) if col in df and len(df) else 0


def _last(row: pd.Series, col: str) -> int:
    """An integer column of an intervals row; 0 when the trace has no such column."""
    v = row.get(col)
    return 0 if v is None or pd.isna(v) else int(v)


def totals(trace: Trace) -> dict:
    """Whole-process numbers: live_bytes, live_count (tracked and outstanding at the end),
    peak_live_bytes, rss_bytes (last sample while the target was readable), peak_rss_bytes
    (highest sample), hwm_bytes (kernel VmHWM), lost_events (sum of the lost_* counters except
    byte counts and the stacks cut short, NOT_LOST), losses (the non-zero lost_* counters),
    heap_live_bytes, mmap_live_bytes,
    duration_s, intervals — host memory only — and, kept apart: device_bytes (GPU memory live
    at the end, `intervals.device_live_bytes`), device_peak_bytes (its highest), device_count
    (GPU allocations live at the end, from the sites), cuda_host_bytes (pinned and managed host
    memory made through the CUDA driver API at the end, `intervals.cuda_host_live_bytes`; part of
    live_bytes), live_by_source (`live_by_source`). 0 for a trace made before GPU memory was
    traced. peak_snapshots: the intervals rows that are peak snapshots (tracer/record/peaks.py), not
    counted in `intervals`; peak_margin_bytes: their margin (0: a trace without them)."""
    iv = trace.intervals
    alive = iv[iv["rss_bytes"] >= 0] if "rss_bytes" in iv else iv.iloc[0:0]
    last = iv.iloc[-1]
    lost = losses(trace)
    peak_cols = [c for c in ("live_bytes", "heap_peak_bytes") if c in iv]
    st = trace.final_sites()
    device_count = int(st.loc[is_device(st["source"]), "live_count"].sum()) if len(st) else 0
    return {
        "live_bytes": int(last["live_bytes"]),
        # the kernel's block count holds the driver API's GPU allocations too: not host blocks
        "live_count": int(last["live_count"]) - device_count,
        "peak_live_bytes": max((_col_max(iv, c) for c in peak_cols), default=0),
        "rss_bytes": int(alive["rss_bytes"].iloc[-1]) if len(alive) else 0,
        "peak_rss_bytes": _col_max(alive, "rss_bytes"),
        # VmHWM read alive; an OOM kill's RSS as the kernel's mark gave it is a high-water too
        "hwm_bytes": max(_col_max(alive, "hwm_bytes"), kill_rss(trace.meta) or 0),
        "lost_events": lost_events(lost),
        "losses": {k: v for k, v in lost.items() if v},
        "heap_live_bytes": int(last.get("heap_live_bytes", 0)),
        "mmap_live_bytes": int(last.get("mmap_live_bytes", 0)),
        "duration_s": float(last.get("elapsed_s", 0.0)),
        # the intervals the trace holds (watch --keep drops old ones: counted apart)
        "intervals": len(iv) - int(peak_rows(iv).sum()),
        "intervals_dropped": int((trace.meta.get("kept") or {}).get("dropped_intervals") or 0),
        "peak_snapshots": int(peak_rows(iv).sum()),
        "peak_margin_bytes": peak_margin(trace, max((_col_max(iv, c) for c in peak_cols), default=0)),
        "device_bytes": _last(last, "device_live_bytes"),
        "device_peak_bytes": max(_col_max(iv, "device_peak_bytes"), _col_max(iv, "device_live_bytes")),
        "device_count": device_count,
        "cuda_host_bytes": _last(last, "cuda_host_live_bytes"),
        "live_by_source": live_by_source(trace, st),
        "by_source": by_source(st),
        **(
            {
                "touch_estimate_bytes": _last(last, "touch_estimate_bytes"),
                "touches_bytes": _last(last, "touches_bytes"),
                # mapped, not yet touched: taken off the exact rows (analysis/touches.py)
                "untouched_bytes": _last(last, "untouched_bytes"),
            }
            if "touch_estimate_bytes" in iv
            else {}
        ),
    }


def advice(trace: Trace, tot: dict) -> list[str]:
    """One line per non-zero loss counter: what was lost and what to do about it."""
    out = []
    for k, v in tot["losses"].items():
        if k == "lost_live_full_bytes":
            continue
        msg = LOSS_ADVICE.get(k) or "some events were not recorded; the numbers are lower bounds"
        out.append(f"{k}={v}: {msg}")
    if tot["losses"].get("lost_live_full_bytes"):
        out.append(f"{tot['losses']['lost_live_full_bytes']} bytes were allocated but not tracked (live map full)")
    return out


def unwind_pending(trace: Trace) -> list[dict]:
    """meta.json `unwind.pending`: the modules stacks were cut short at while their unwind tables
    were being built (tracer/unwind/unwinder.py), most-hit first; [] for traces without it."""
    return [p for p in (trace.meta.get("unwind") or {}).get("pending") or [] if p.get("stacks")]


def pending_notes(pending: list[dict]) -> list[str]:
    """One line per module of unwind_pending: how many stacks, until when."""
    out = []
    for p in pending:
        name = os.path.basename(p["module"])
        n = f"{p['stacks']} stack{'s' if p['stacks'] != 1 else ''} cut short in {name}"
        if p.get("built_s") is not None:
            out.append(
                f"{n} until +{p['built_s']:.1f} s while its unwind table was built "
                f"({p.get('rows', 0)} rows in {p.get('build_s', 0):.1f} s)"
            )
        elif p.get("error"):
            out.append(f"{n}: its unwind table could not be built ({p['error']}); frame-pointer steps there since")
        else:
            out.append(
                f"{n} (last at +{p.get('last_s') or 0:.1f} s): its unwind table was still being built "
                "when the recording ended"
            )
    return out


def mode_notes(trace: Trace) -> list[str]:
    """What a sampled or residency-mode trace can and cannot answer (shown on top of reports)."""
    meta = trace.meta
    out = []
    if meta.get("mode") == "residency":
        n = (meta.get("sampling") or {}).get("fault_sample", 0)
        duty = (meta.get("sampling") or {}).get("fault_duty") or 1.0
        per = max(1, round(n / duty)) if n else n
        when = "" if duty >= 1 else f" in windows open {duty:.0%} of each second"
        out.append(
            f"residency mode: no allocator probes. Sites of source 'mmap'/'brk' are exact and live (mapped "
            f"bytes); sites of source 'fault' are an estimate: first touches of pages (sampled 1 in {n}{when}, each "
            f"standing for {per} pages), cumulative in the kernel, counted here only up to the anonymous RSS the "
            "exact sites leave, the latest touches first (a page freed and touched again counts once; "
            "'allocated' keeps the cumulative touches). Frees of heap blocks, per-block sizes and thread "
            "flows are not seen.".replace("{n}", str(n))
        )
    sb = (meta.get("sampling") or {}).get("sample_bytes", 0)
    if sb:
        out.append(
            f"sampled trace: one sample per {sb} bytes on average; heap bytes are unbiased estimates "
            "(see live_bytes_error, a 95% bound) and block counts are sample counts"
        )
    return out
