"""How the target ended (`recording.end`) and the finding that says it first.

meta.json's `end` is written by the tracer (tracer/process/ending.py): `reason` ("exited",
"killed", "oom_killed", "exec", "stopped"), `exit_code`, `signal`, `oom` ({scope, cgroup,
limit_bytes, told_by, victim: the kernel's mark with its memory at the kill}), `time` (seconds
after the probes went live) and `last_alive` (the snapshot that last measured the target alive:
the end's RSS figures are that snapshot's, a dead process has none). A killed or OOM-killed
target's report opens with what it held when it died: the figure the table beside it shows (in
residency mode, the first-touch estimate of analysis/touches.py, said to be one)."""

from __future__ import annotations

import time

from common.endwords import oom_text

from ..units import human_bytes
from .findings import estimated, finding, held_bytes, where_text


def recording_end(meta: dict) -> dict | None:
    """meta.json's `end` as the report's `recording.end`, with `wall_s` (the end's wall-clock
    time); None for traces written before it (their `end_reason` still says it)."""
    end = meta.get("end")
    if not isinstance(end, dict):
        return None
    out = dict(end)
    wall0 = (meta.get("clock") or {}).get("wall_s")
    if isinstance(wall0, int | float) and isinstance(end.get("time"), int | float):
        out["wall_s"] = wall0 + end["time"]
    return out


def elapsed_text(s: float) -> str:
    """'+2h13m', '+4m05s', '+12.3s'."""
    if s >= 3600:
        return f"+{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    if s >= 60:
        return f"+{int(s // 60)}m{int(s % 60):02d}s"
    return f"+{s:.1f}s"


def end_text(end: dict | None, fallback: str | None = None) -> str:
    """The header's 'ended: ...' words: 'OOM-killed by the memory cgroup /x (limit 2.0 GiB)',
    'killed by SIGKILL', 'exited with code 3', or the older `end_reason`."""
    if not end:
        return fallback or "interrupted"
    reason = end.get("reason")
    if reason == "oom_killed":
        return oom_text(end.get("oom") or {})
    if reason == "killed":
        return f"killed by {end.get('signal') or 'a signal'}"
    if reason == "exited":
        code = end.get("exit_code")
        return f"exited with code {code}" if code is not None else "exited"
    if reason == "exec":
        return "the target exec'd another program"
    return f"stopped ({fallback})" if fallback and fallback != "target exited" else "stopped"


def closing_text(end: dict | None, end_reason: str) -> str:
    """What `top` says when its recording ends: how the target ended when it did ('exited with
    code 0', 'OOM-killed by the memory cgroup /x (limit 2.0 GiB)', 'killed by SIGKILL'), else
    why the recording stopped (SIGINT, quit, duration, N iterations)."""
    if end and end.get("reason") in ("exited", "killed", "oom_killed", "exec"):
        return end_text(end)
    return end_reason


def _rss_clause(doc: dict) -> str:
    dec = doc.get("rss_decomposition") or {}
    rss = int(dec.get("rss_bytes") or doc["totals"].get("rss_bytes") or 0)
    if not rss:
        return ""
    parts = [f"live heap {human_bytes(int(dec.get('live_heap_bytes') or 0))}"]
    retained = int(dec.get("retained_bytes") or 0) + int(dec.get("before_or_retained_bytes") or 0)
    if retained:
        parts.append(f"retained or from before the attach {human_bytes(retained)}")
    parts.append(f"other anon {human_bytes(int(dec.get('other_anon_bytes') or 0))}")
    if dec.get("file_bytes"):
        parts.append(f"file {human_bytes(int(dec['file_bytes']))}")
    text = f"RSS {human_bytes(rss)} = " + " + ".join(parts) if dec else f"RSS {human_bytes(rss)}"
    last = (doc["recording"].get("end") or {}).get("last_alive") or {}
    end_s = (doc["recording"].get("end") or {}).get("time")
    if last.get("elapsed_s") is not None and end_s is not None and end_s - last["elapsed_s"] >= 0.5:
        text += f" (RSS last read alive at +{last['elapsed_s']:.1f}s)"  # a dead process has none
    return text


def _scope_clause(end: dict) -> str:
    """Why an OOM kill is said to be the whole machine's: no memory cgroup of the target had
    reached its limit (tracer/process/cgroups.py at_limit); nothing for a cgroup's (the header
    names it and its limit) or where no cgroup could be read."""
    if end.get("reason") != "oom_killed" or (end.get("oom") or {}).get("scope") != "global":
        return ""
    return "none of its memory cgroups had reached its limit"


def _victim_clause(end: dict) -> str:
    """'the kernel counted anon-rss 47.2 MiB, file-rss 1.1 MiB, shmem-rss 0 B' when the OOM
    killer's mark of the target (oom:mark_victim) gave its memory at the kill (dmesg's figures)."""
    victim = (end.get("oom") or {}).get("victim") or {}
    if "anon_rss_bytes" not in victim:
        return ""
    parts = [
        f"{k.replace('_', '-')} {human_bytes(int(victim[f'{k}_bytes']))}" for k in ("anon_rss", "file_rss", "shmem_rss")
    ]
    return "the kernel counted " + ", ".join(parts)


def _held_at_end(doc: dict) -> tuple[str, dict] | None:
    """'hold_partitions restartd.c:36 held 300.0 MiB' for the location holding most at the end:
    its live bytes as its table row shows them (findings.held_bytes), in residency mode with the
    estimate its sampled first touches stand for (analysis/touches.py), said to be one."""
    rows = [(held_bytes(r, "live_bytes"), r) for r in doc.get("locations") or doc.get("sites") or []]
    rows = [(b, r) for b, r in rows if b > 0]
    if not rows:
        return None
    held, top = max(rows, key=lambda br: br[0])
    est = " (an estimate from sampled first touches)" if estimated(top, "live_bytes") else ""
    return f"{where_text(top)} held {human_bytes(held)}{est}", top | {"held_bytes": held}


def _waiting_at_end(doc: dict) -> str:
    """'3 threads blocked in send_to_gpu demo.c:40 held 50.0 MiB' from the last snapshot with
    blocked threads holding memory, when it is the last snapshot or the one before."""
    timeline = (doc.get("waits") or {}).get("timeline") or []
    if not timeline:
        return ""
    last = timeline[-1]
    seqs = doc.get("timeline_seq") or []
    if seqs and last.get("seq", 0) < seqs[-1] - 1:
        return ""
    held = [(k, v) for k, v in (last.get("by_location") or {}).items() if v.get("held_bytes")]
    if not held:
        return ""
    key, v = max(held, key=lambda kv: kv[1]["held_bytes"])
    if v["held_bytes"] > int(doc["totals"].get("live_bytes") or 0):
        return ""  # counts pages first touched (residency mode's faults), not memory held: not said
    func, _, rest = key.partition("|")
    where = func + (" " + rest.rsplit("|", 1)[-1] if "|" in rest else "")
    return f"{v['threads']} threads blocked in {where} held {human_bytes(int(v['held_bytes']))}"


def _exec_finding(end: dict) -> dict:
    """A target that exec'd another program: the trace is of the program before the exec only;
    never "no problem found" about a program that was not traced."""
    when = f" at {elapsed_text(float(end['time']))}" if end.get("time") is not None else ""
    return finding(
        "ended",
        f"The target exec'd another program{when}: this trace holds only what the program before "
        "the exec allocated (its allocator and blocks went with it); record the new program itself "
        "(-- CMD, or --pid once it runs).",
        "Totals",
        "header",
        reason="exec",
        signal=None,
        oom=None,
        location=None,
        live_bytes=0,
        rss_bytes=0,
    )


def end_finding(doc: dict) -> dict | None:
    """The first finding of a killed or OOM-killed target: how, when, and what it held then (the
    last measurement while it was alive); of one that exec'd another program, that the trace
    stops there (_exec_finding); None for any other end."""
    end = (doc.get("recording") or {}).get("end") or {}
    if end.get("reason") == "exec":
        return _exec_finding(end)
    if end.get("reason") not in ("killed", "oom_killed"):
        return None
    head = end_text(end)
    head = head[0].upper() + head[1:]
    when = []
    if end.get("wall_s"):
        when.append(time.strftime("%H:%M:%S", time.localtime(end["wall_s"])))
    if end.get("time") is not None:
        when.append(elapsed_text(float(end["time"])))
    text = head + (f" at {', '.join(when)}" if when else "")
    clauses = [c for c in (_scope_clause(end), _victim_clause(end), _rss_clause(doc)) if c]
    held = _held_at_end(doc)
    if held:
        clauses.append(held[0])
    wait = _waiting_at_end(doc)
    if wait:
        clauses.append(wait)
    if clauses:
        text += ": at the " + ("kill" if end["reason"] == "oom_killed" or end.get("signal") == "SIGKILL" else "end")
        text += ", " + "; ".join(clauses)
    return finding(
        "ended",
        text + ".",
        "Totals",
        "header",
        reason=end["reason"],
        signal=end.get("signal"),
        oom=end.get("oom"),
        location=held[1].get("location") if held else None,
        live_bytes=int(held[1]["held_bytes"]) if held else 0,
        rss_bytes=int((doc.get("rss_decomposition") or {}).get("rss_bytes") or doc["totals"].get("rss_bytes") or 0),
    )
