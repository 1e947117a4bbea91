"""The fleet's metrics (`--metrics`, docs/fleet.md): what a Prometheus scrape of a recording shows,
computed snapshot by snapshot from what the recorder hands its observer, through the live model
(model.py) — locations named as `top` and the report name them. Pure data: prometheus.py
serves it with prometheus_client.

`FleetMetrics` follows one target across its incarnations (`allocscope watch`): `started` begins an
incarnation (a new live model; its per-incarnation gauges start empty), `update` takes each
snapshot, `ended` closes it (its gauges disappear, the counters stay). `families()` is what a
scrape shows, recomputed after each change (never during a scrape).

The label set is bounded: a location or a wait outside the top `top_k` (by live bytes, by bytes
held) has no series; sources, allocators and loss kinds are few and fixed by the recording.
Series: 1 up + 1 RSS + 1 cgroup limit + sources + 4 per allocator + 2 * top_k + losses (~20)
+ 5 end reasons + 1 restarts + 1 info.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from common.tracefile.names import NOT_LOST

from ..analysis import FrameInfo
from .model import LiveModel
from .text import site_text

END_REASONS = ("exited", "killed", "oom_killed", "exec", "stopped")  # recording.end.reason's values
# Our own label names: a --label may not take one (the series would be ambiguous).
FAULT_SOURCE = "fault"  # residency mode's sampled first touches: a counter of their own, never live bytes
OWN_LABELS = ("source", "allocator", "kind", "location", "wait", "reason", "pid", "comm", "trace")
CENSUS_TRIES = 120  # snapshots during which the attach census (glibc) is looked for in the trace


@dataclass(frozen=True)
class Family:
    """One metric family: `name` (a counter's without `_total`; an info metric's without `_info`),
    `kind` gauge | counter | info, `help`, and its samples: (labels, value) — the target's labels
    are added by whoever serves it."""

    name: str
    kind: str
    help: str
    samples: tuple[tuple[tuple[tuple[str, str], ...], float], ...]


def location_name(frames: tuple[FrameInfo, ...]) -> str:
    """A location as `top` prints it: 'function file:line' (the CUDA call or stripped module it
    stands for included)."""
    return site_text(frames)


def wait_name(w: dict) -> str:
    """Where threads wait (a LiveModel.waiting group), as a location."""
    return site_text(
        (
            FrameInfo(
                w["function"],
                w.get("module") or "",
                w.get("file"),
                w.get("line"),
                call=w.get("call"),
                inside=w.get("inside"),
            ),
        )
    )


def top_by(values: dict[str, int], k: int) -> list[tuple[str, int]]:
    """The `k` largest positive values, largest first (ties by name: a stable set)."""
    pos = [(n, v) for n, v in values.items() if v > 0]
    pos.sort(key=lambda nv: (-nv[1], nv[0]))
    return pos[:k]


def census_before_attach(trace_dir: str | None) -> int | None:
    """glibc's chunks in use at the attach (the `census` parts taken 'attach', summed over the
    arenas: tracer/allocators/census.py), read from the trace being written; None while there is
    none (not written yet, another allocator, no trace)."""
    if not trace_dir:
        return None
    paths = glob.glob(os.path.join(trace_dir, "parts", "census-*.parquet"))
    if not paths:
        return None
    import pyarrow.parquet as pq  # noqa: PLC0415

    total, seen = 0, False
    for p in paths:
        try:
            t = pq.read_table(p, columns=["when", "in_use_bytes"]).to_pydict()
        except (OSError, ValueError, KeyError):
            continue
        for when, used in zip(t["when"], t["in_use_bytes"]):
            if when == "attach" and used is not None:
                total, seen = total + int(used), True
    return total if seen else None


class FleetMetrics:
    """The metrics of one watched target over its incarnations (see the module's docstring).
    Not thread-safe: one thread calls started/update/ended; `families()` returns an immutable
    list another thread may read at any time."""

    def __init__(self, top_k: int = 10, fold=None, symbolizer=None) -> None:
        self.top_k = max(1, int(top_k))
        self.fold = fold
        self.sym = symbolizer  # one Symbolizer for every incarnation: a restart parses no ELF file again
        self.model: LiveModel | None = None
        self.up = 0
        self.incarnations = 0
        self.ends = dict.fromkeys(END_REASONS, 0)
        self.lost_before: dict[str, int] = {}  # loss counters of the incarnations that ended
        self.lost_now: dict[str, int] = {}
        self.info: dict[str, str] | None = None
        self.trace_path: str | None = None
        self.launched = False  # a launched command: nothing predates the attach
        self.cgroup_limit: int | None = None
        self.names: dict[int, str] = {}  # the model's site index -> its location's name
        self._reset()
        self._families: list[Family] = []
        self._publish()

    def _reset(self) -> None:
        self.row: dict = {}
        self.source_live: dict[str, int] = {}
        self.counters: dict[tuple, int] = {}  # site key -> its live bytes (every source, GPU included)
        self.allocators: tuple = ()
        self.resident_at_attach: dict[str, int] | None = None
        self.before_attach: int | None = None
        self.census_tries = 0

    # --- input ----------------------------------------------------------------------------

    def started(self, pid: int, comm: str, trace_path: str | None, launched: bool = False) -> None:
        """A new incarnation is traced: up, its info; from the second one on, a restart."""
        self._fold_lost()
        self.incarnations += 1
        self.up = 1
        self.launched = launched
        self.trace_path = trace_path
        self.info = {"pid": str(pid), "comm": comm or "", "trace": trace_path or ""}
        self.model = LiveModel(self.fold, symbolizer=self._symbolizer(), by="location")
        self.names = {}
        self._reset()
        self._publish()

    def ended(self, reason: str) -> None:
        """The incarnation ended (`reason`: one of END_REASONS): its gauges go, the counters stay."""
        self.ends[reason if reason in self.ends else "stopped"] += 1
        self.up = 0
        self._fold_lost()
        self.model = None
        self._reset()
        self._publish()

    def _fold_lost(self) -> None:
        for k, v in self.lost_now.items():
            self.lost_before[k] = self.lost_before.get(k, 0) + v
        self.lost_now = {}

    def _symbolizer(self):
        if self.sym is None:
            from ..symbolize import Symbolizer  # noqa: PLC0415 (pyelftools: only when watching)

            self.sym = Symbolizer()
        return self.sym

    def update(self, snap) -> None:
        """One snapshot of the current incarnation (every one, in order)."""
        if self.model is None:
            self.started(0, "", None)
        assert self.model is not None
        self.model.update(snap)
        for key in snap.changed:
            new = snap.sites[key]
            live = int(new[0]) - int(new[2])
            old = self.counters.get(key, 0)
            self.counters[key] = live
            src = str(key[2])
            self.source_live[src] = self.source_live.get(src, 0) + live - old
        self.row = snap.row
        self.lost_now = {
            k.removeprefix("lost_"): int(v)
            for k, v in snap.row.items()
            if k.startswith("lost_") and not k.endswith("_bytes") and k not in NOT_LOST and v is not None
        }  # stacks cut short are no loss (common/tracefile/names.py), as in the report's lost_events
        rows = getattr(snap, "allocators", ()) or ()
        if rows:
            self.allocators = tuple(rows)
            if self.resident_at_attach is None:  # several snapshots handled as one: the first's rows
                first = getattr(snap, "first_allocators", ()) or rows
                self.resident_at_attach = {str(r[0]): int(r[3]) for r in first}
        if self.before_attach is None and not self.launched and self.census_tries < CENSUS_TRIES:
            self.census_tries += 1
            self.before_attach = census_before_attach(self.trace_path)
        self._publish()

    # --- output ---------------------------------------------------------------------------

    def families(self) -> list[Family]:
        return self._families

    def _allocator_samples(self) -> list[tuple[tuple[tuple[str, str], ...], float]]:
        """Per allocator: live (its sites' live bytes), retained (free and resident in its own
        mappings), before_attach (glibc serving malloc, with the census at the attach), or,
        attached without a census, before_or_retained (what its mappings held at the attach:
        blocks from before the attach or free memory, not separable) — as the report's RSS split
        (reports/analysis/allocator_memory.py). They sum to its resident bytes."""
        out: list[tuple[tuple[tuple[str, str], ...], float]] = []
        at_attach = self.resident_at_attach or {}
        for r in self.allocators:
            src, name, res, live = str(r[0]), str(r[1]), int(r[3]), int(r[4])
            free = max(0, res - live)
            kinds = {"live": live}
            if self.launched:
                kinds.update(retained=free, before_attach=0)
            elif src == "heap" and self.before_attach is not None:
                before = min(free, self.before_attach)
                kinds.update(retained=free - before, before_attach=before)
            else:
                unsure = min(free, at_attach.get(src, 0))
                kinds.update(retained=free - unsure, before_or_retained=unsure)
            for kind, v in kinds.items():
                out.append(((("allocator", name), ("kind", kind)), float(v)))
        return out

    def _first_touches_by_site(self) -> dict[int, int]:
        """{the model's site index: its first touches (source fault, residency mode)}: taken off
        its location's live bytes, as they are kept out of allocscope_live_bytes."""
        out: dict[int, int] = {}
        if FAULT_SOURCE not in self.source_live or self.model is None:
            return out
        for key, v in self.counters.items():
            if str(key[2]) == FAULT_SOURCE:
                site = self.model.site_of_stack.get(int(key[0]))
                if site is not None:
                    out[site.index] = out.get(site.index, 0) + v
        return out

    def _publish(self) -> None:
        fam: list[Family] = [
            Family(
                "allocscope_up",
                "gauge",
                "1 while the target is traced, 0 between incarnations",
                (((), float(self.up)),),
            )
        ]
        if self.model is not None and self.row:
            rss = int(self.row.get("rss_bytes", -1))
            if rss >= 0:
                fam.append(
                    Family("allocscope_rss_bytes", "gauge", "The target's resident set size", (((), float(rss)),))
                )
            fam.append(
                Family(
                    "allocscope_live_bytes",
                    "gauge",
                    "Bytes allocated since the attach and not freed, by source (heap, mmap, cuda-device...); "
                    "the sources sum to the live total",
                    tuple(
                        ((("source", s),), float(v)) for s, v in sorted(self.source_live.items()) if s != FAULT_SOURCE
                    ),
                )
            )
            if FAULT_SOURCE in self.source_live:
                fam.append(
                    Family(
                        "allocscope_first_touched_bytes",
                        "gauge",
                        "Residency mode: pages first touched since this incarnation's attach (sampled page "
                        "faults, each standing for N pages), cumulative: a page freed and touched again counts "
                        "again; it overlaps the mmap and brk rows of allocscope_live_bytes and is never added to them",
                        (((), float(self.source_live[FAULT_SOURCE])),),
                    )
                )
            if self.allocators:
                fam.append(
                    Family(
                        "allocscope_allocator_bytes",
                        "gauge",
                        "Each allocator's resident memory split: live, retained (free and resident), "
                        "before_attach (census), before_or_retained (attached without a census)",
                        tuple(self._allocator_samples()),
                    )
                )
            locs: dict[str, int] = {}
            names = self.names
            touched = self._first_touches_by_site()
            for s in self.model.sites:
                live = s.live - touched.get(s.index, 0)  # first touches are no live bytes
                if live > 0:
                    name = names.get(s.index)
                    if name is None:
                        name = names[s.index] = location_name(s.frames)
                    locs[name] = locs.get(name, 0) + live
            fam.append(
                Family(
                    "allocscope_location_live_bytes",
                    "gauge",
                    f"Live bytes of the top {self.top_k} locations (function file:line)",
                    tuple(((("location", n),), float(v)) for n, v in top_by(locs, self.top_k)),
                )
            )
            waits: dict[str, int] = {}
            for w in self.model.waiting:
                name = wait_name(w)
                waits[name] = waits.get(name, 0) + int(w["held_bytes"])
            fam.append(
                Family(
                    "allocscope_waiting_held_bytes",
                    "gauge",
                    f"Bytes held by threads blocked now, by where they wait (top {self.top_k})",
                    tuple(((("wait", n),), float(v)) for n, v in top_by(waits, self.top_k)),
                )
            )
        if self.up and self.cgroup_limit is not None:
            fam.append(
                Family(
                    "allocscope_cgroup_memory_limit_bytes",
                    "gauge",
                    "The tightest memory.max over the target's cgroups (absent: no limit)",
                    (((), float(self.cgroup_limit)),),
                )
            )
        lost = dict(self.lost_before)
        for k, v in self.lost_now.items():
            lost[k] = lost.get(k, 0) + v
        fam += [
            Family(
                "allocscope_lost_events",
                "counter",
                "Events the probes could not record, by kind (a full map, a lost stack...), every incarnation",
                tuple(((("kind", k),), float(v)) for k, v in sorted(lost.items())),
            ),
            Family(
                "allocscope_target_restarts",
                "counter",
                "Incarnations of the target traced after the first",
                (((), float(max(0, self.incarnations - 1))),),
            ),
            Family(
                "allocscope_target_ends",
                "counter",
                "Incarnations that ended, by how (recording.end.reason)",
                tuple(((("reason", r),), float(n)) for r, n in self.ends.items()),
            ),
        ]
        if self.info is not None:
            fam.append(
                Family(
                    "allocscope_target",
                    "info",
                    "The incarnation traced now (or last): pid, comm, the trace it writes",
                    ((tuple(self.info.items()), 1.0),),
                )
            )
        self._families = fam


__all__ = ["END_REASONS", "OWN_LABELS", "Family", "FleetMetrics", "census_before_attach", "location_name"]
