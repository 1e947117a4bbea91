"""Per-interval reads in proportion to what changed, not to what is live (issue 33).

The kernel side names each site that changes, once per generation (probes/changes.h); every
interval the tracer reads those names and looks only those sites up, so the `sites` step of a
snapshot costs the same with 100 live sites or 100k when ten of them change. The cumulative
maps beside it (releases, waits, flows) are read only when their per-CPU change counter moved.

Exactness: the `sites` table is the same as with whole-map reads (the rows that changed, with
their cumulative counters; rows in key order). A key is named after its counters are updated;
the names of a generation are read twice (at the interval that closes it and at the next one),
so a program that was between its update and its naming at the first read is seen at the
second. A whole-map read is made instead at the first snapshot, at the last one (the final
totals come from the whole map), when a generation named more keys than the buffer holds
(RecordOptions.site_changes, per generation), and when a slot is still unwritten at its second
read. Residency mode (its `fault_sites` are not named) and `site_changes` 0 read the whole maps
every interval, as before.

What the interval snapshot needs besides: the live bytes per heap source and the threads not
named yet are kept up to date from the changed rows, instead of a walk over every site.
"""

from __future__ import annotations

import ctypes as ct
import mmap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..allocators.retention import live_by_source
from ..base import layout as L
from .trace_tables import SiteKey, SiteTable, flow_part

KEY_FIELDS = ["stack_id", "tid", "source"]
DIRTY_RELEASES, DIRTY_WAITS, DIRTY_FLOWS = 0, 1, 2  # chg_dirty (probes/changes.h)


@dataclass
class SiteDelta:
    """Sites read at a peak wake: {raw key (stack, tid, source id): counters} of every site that
    changed since the last interval snapshot, as they were at the wake."""

    values: dict[tuple[int, int, int], tuple]


@dataclass
class ReadStats:
    """meta.json `interval_reads`: how the site reads went."""

    changed_reads: int = 0  # reads of the named keys only
    full_reads: int = 0  # whole-map reads (first, final, overflow, unwritten slot, off)
    overflows: int = 0  # generations that named more keys than the buffer holds
    unwritten: int = 0  # slots still unwritten at their second read
    many: int = 0  # whole-map reads because more than a quarter of the sites changed
    keys_looked_up: int = 0
    skipped_maps: dict[str, int] = field(default_factory=lambda: {"releases": 0, "waits": 0, "flows": 0})

    def as_dict(self) -> dict:
        return dict(self.__dict__.items())


class _Lookup:
    """BPF_MAP_LOOKUP_ELEM of many keys into numpy arrays (one system call per key, no Python
    objects per call but the loop's)."""

    def __init__(self) -> None:
        lib = ct.CDLL("libbcc.so.0", use_errno=True)
        self.fn = lib["bpf_lookup_elem"]
        self.fn.restype = ct.c_int
        self.fn.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p]

    def many(self, fd: int, keys: np.ndarray, val_dtype) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, values) of `keys` (a structured array of the map's key type)."""
        vals = np.zeros(len(keys), dtype=val_dtype)
        found = np.zeros(len(keys), dtype=bool)
        if not len(keys):
            return found, vals
        keys = np.ascontiguousarray(keys)
        kp, vp = keys.ctypes.data, vals.ctypes.data
        ks, vs = keys.dtype.itemsize, vals.dtype.itemsize
        fn = self.fn
        for i in range(len(keys)):
            found[i] = fn(fd, kp + i * ks, vp + i * vs) == 0
        return found, vals


class SiteReader:
    """The tracer's half of probes/changes.h, and the interval reads it makes cheaper."""

    def __init__(self, capacity: int, enabled: bool = True) -> None:
        self.capacity = max(0, capacity)
        self.enabled = enabled and self.capacity > 0
        self.probes: Any = None  # tracer/bpf/map_reads.py MapReader, from start()
        self.stats = ReadStats()
        self.gen = 0
        self.must_full = True  # the next read reads the whole map (the first one does)
        self.pending: set[tuple[int, int, int]] = set()  # raw keys changed since the last interval apply
        self.live_src: dict[str, int] = {}  # live bytes per heap source (live_by_source of the table)
        self.unnamed: set[int] = set()  # allocating threads not named yet
        self.dirty_seen: dict[int, int] = {}  # chg_dirty sums last read
        self.tracker_flows: dict = {}
        self._lookup: _Lookup | None = None
        self.n_sites = 0  # rows of the site table, as last applied
        self._maps: list[mmap.mmap] = []
        self.ctl: Any = None  # chg_ctl and site_chg, mapped (start())
        self.slots: Any = None

    # --- set-up ---------------------------------------------------------------------------------

    def start(self, probes, peaks=None) -> None:
        """Open the kernel side's arrays and start generation 1 (before the first snapshot:
        that one reads the whole map). `peaks` (tracer/record/peaks.py PeakWatch): its reads go
        through here too."""
        self.probes = probes
        try:
            ctl_t, slot_t = probes.bpf[b"chg_ctl"], probes.bpf[b"site_chg"]
        except KeyError:
            self.enabled = False
        if not self.enabled:
            return
        self.slots_per_gen = len(slot_t) // 2
        self.cap = min(self.capacity, self.slots_per_gen)
        page = mmap.PAGESIZE
        size = -(-len(slot_t) * ct.sizeof(L.Change) // page) * page
        m_ctl = mmap.mmap(ctl_t.map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        m_slots = mmap.mmap(slot_t.map_fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        self._maps = [m_ctl, m_slots]
        self.ctl = np.frombuffer(m_ctl, dtype=np.uint64, count=4)
        self.slots = np.frombuffer(m_slots, dtype=np.dtype(L.Change), count=len(slot_t))
        self.sites_fd = probes.bpf[b"sites"].map_fd
        self._lookup = _Lookup()
        self.ctl[3] = self.cap
        self.ctl[1] = self.ctl[2] = 0
        self.gen = 1
        self.ctl[0] = 1
        if peaks is not None:
            peaks.read_sites = self.peak_read

    def close(self) -> None:
        self.ctl = self.slots = None
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                pass
        self._maps = []

    # --- the changed keys -----------------------------------------------------------------------

    def _named(self, g: int, first: bool) -> np.ndarray | None:
        """The keys named in generation `g` (SiteKey array, may repeat); None: read the whole map."""
        p = g & 1
        n = int(self.ctl[1 + p])
        if n > self.cap:
            self.stats.overflows += first
            return None
        s = self.slots[p * self.slots_per_gen : p * self.slots_per_gen + n]
        ok = s["gen"] == g
        if not ok.all():
            if not first:
                self.stats.unwritten += 1
                return None  # still being written an interval later: read everything
            s = s[ok]  # being written now: read again at the next interval
        out = np.zeros(len(s), dtype=np.dtype(L.SiteKey))
        for f in KEY_FIELDS:
            out[f] = s[f]
        return out

    def _drain(self) -> np.ndarray | None:
        """Close the generation now: the keys named in it and in the one before (a SiteKey
        array, may repeat), or None when the whole map must be read."""
        h = self.gen
        prev = self._named(h - 1, False) if h > 1 else np.zeros(0, dtype=np.dtype(L.SiteKey))
        self.ctl[1 + ((h + 1) & 1)] = 0  # the buffer of h + 1: held h - 1, read twice now
        self.gen = h + 1
        self.ctl[0] = h + 1
        now = self._named(h, True)
        if prev is None or now is None:
            return None
        return np.concatenate([prev, now])

    def _look_up(self, raw: set[tuple[int, int, int]]) -> dict[tuple[int, int, int], tuple]:
        keys = np.array(sorted(raw), dtype=np.dtype(L.SiteKey))
        assert self._lookup is not None  # start() opened it
        found, vals = self._lookup.many(self.sites_fd, keys, np.dtype(L.Site))
        self.stats.keys_looked_up += len(keys)
        return dict(zip(keys[found].tolist(), vals[found][list(L.SITE_COUNTERS)].tolist()))

    def _changed_keys(self, live: int) -> bool:
        """Drain the named keys into `pending`; False: the whole map must be read (also when
        the keys to look up are more than a quarter of the `live` sites: one batch read of the
        whole map costs less then, ~0.5 µs a site against ~4 µs a key looked up)."""
        if self.must_full:
            self._drain()  # the generations move on; what they named is covered by the whole read
            return False
        keys = self._drain()
        if keys is None:
            self.must_full = True
            return False
        self.pending.update(keys.tolist())
        if len(self.pending) > live // 4 + 64:
            self.stats.many += 1
            return False
        return True

    # --- the site table -----------------------------------------------------------------------

    def update(self, table: SiteTable, tracker, names: dict[int, str], final: bool) -> list[SiteKey]:
        """The interval snapshot's `sites` step: merge what changed into `table`; the keys that
        changed (as SiteTable.update)."""
        probes = self.probes
        if not self.enabled or final or not self._changed_keys(len(table.current)):
            changed = table.update([probes.read_sites(), probes.read_fault_sites()], tracker, names)
            self._after_full(table)
            return changed
        self.stats.changed_reads += 1
        values = self._look_up(self.pending)
        self.pending = set()
        return self._apply(table, values, tracker, names)

    def peak_read(self):
        """PeakWatch.read's `sites`: what changed since the last interval snapshot (SiteDelta),
        or the whole map (arrays) when the changed keys cannot say."""
        if not self._changed_keys(self.n_sites):
            return self.probes.read_sites()
        return SiteDelta(self._look_up(self.pending))

    def apply_peak(self, table: SiteTable, sites, tracker, names: dict[int, str]) -> list[SiteKey]:
        """A peak snapshot's `sites` step (peak_snapshot.py PeakSnapshots.write)."""
        if not isinstance(sites, SiteDelta):
            changed = table.update([sites], tracker, names)
            self._after_full(table)
            return changed
        return self._apply(table, sites.values, tracker, names)

    def _after_full(self, table: SiteTable) -> None:
        self.stats.full_reads += 1
        self.must_full = False
        self.pending = set()
        self.live_src = live_by_source(table.current)
        self.unnamed = {k[1] for k in table.current}
        self.n_sites = len(table.current)

    def _apply(self, table: SiteTable, kernel: dict, tracker, names: dict[int, str]) -> list[SiteKey]:
        """SiteTable.update for the keys in `kernel` (raw key -> counters) and the tracker's."""
        now: dict[SiteKey, tuple] = {(k[0], k[1], names.get(k[2], str(k[2]))): v for k, v in kernel.items()}
        if tracker.sites:
            # the tracker's sites add to the kernel's: their kernel part is needed too
            rev = {v: k for k, v in names.items()}
            missing = {key for key in tracker.sites if key not in now}
            raw = {(key[0], key[1], rev[key[2]]) for key in missing if key[2] in rev}
            extra = self._look_up(raw) if raw else {}
            for k, v in extra.items():
                now[(k[0], k[1], names.get(k[2], str(k[2])))] = v
            for key, st in tracker.sites.items():
                mine = st.as_tuple()
                kv = now.get(key)
                if kv is None:
                    now[key] = mine
                else:
                    live = kv[0] + mine[0] - kv[2] - mine[2]
                    now[key] = (
                        kv[0] + mine[0],
                        kv[1] + mine[1],
                        kv[2] + mine[2],
                        kv[3] + mine[3],
                        max(kv[4], mine[4], live),
                    )
        cur = table.current
        changed = []
        for key in sorted(now):
            v, old = now[key], cur.get(key)
            if old == v:
                continue
            changed.append(key)
            src = key[2]
            if src == "heap" or src.startswith("heap:"):
                self.live_src[src] = self.live_src.get(src, 0) + v[0] - v[2] - (old[0] - old[2] if old else 0)
            if old is None:
                self.unnamed.add(key[1])
            cur[key] = v
        self.n_sites = len(cur)
        return changed

    def live_by_source(self, sites: dict) -> dict[str, int]:
        """retention.live_by_source(table.current), kept up to date."""
        if not self.enabled:
            return live_by_source(sites)
        return dict(self.live_src.items())

    def tids(self, sites: dict, names: dict[int, str]) -> set[int]:
        """The allocating threads not named yet ({k[1] for k in table.current} less `names`)."""
        if not self.enabled:
            return {k[1] for k in sites}
        self.unnamed = {t for t in self.unnamed if t not in names}
        return set(self.unnamed)

    # --- the other cumulative maps ---------------------------------------------------------------

    def _dirty(self, idx: int, final: bool) -> bool:
        """Whether the map behind chg_dirty[idx] changed since it was last read (True: read it)."""
        if not self.enabled:
            return True
        t = self.probes.bpf[b"chg_dirty"]
        now = int(sum(t[t.Key(idx)]))
        if final or self.dirty_seen.get(idx) != now:
            self.dirty_seen[idx] = now
            return True
        return False

    def releases(self, final: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Probes.read_releases, or no rows when the map has not changed (ReleaseTable writes
        the rows that changed: none)."""
        if self._dirty(DIRTY_RELEASES, final):
            return self.probes.read_releases()
        self.stats.skipped_maps["releases"] += 1
        return np.empty(0, dtype=np.dtype(L.ReleaseKey)), np.empty(0, dtype=np.dtype(L.Release))

    def waits(self, final: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Probes.read_waits, or no rows when the map has not changed (as releases)."""
        if self._dirty(DIRTY_WAITS, final):
            return self.probes.read_waits()
        self.stats.skipped_maps["waits"] += 1
        return np.empty(0, dtype=np.dtype(L.WaitKey)), np.empty(0, dtype=np.dtype(L.Wait))

    def flows(self, seq: int, tracker, final: bool = False):
        """tables.flow_part (the cumulative flows, kernel + tracker), or None when neither
        changed since the last part written: the last part says the same."""
        changed = self._dirty(DIRTY_FLOWS, final) or tracker.flows != self.tracker_flows
        if not changed:
            self.stats.skipped_maps["flows"] += 1
            return None
        self.tracker_flows = {k: list(v) for k, v in tracker.flows.items()}
        return flow_part(seq, self.probes.read_flows(), tracker)
