"""Reading the program's maps and its event ring: everything returned is plain Python or numpy,
copied out of BCC's ctypes buffers at once (BCC reuses them); and the few entries the tracer
writes back (the peak wake, regions it takes over, bytes it freed itself)."""

from __future__ import annotations

import ctypes as ct
import errno
import os
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from common.errors import AllocscopeError

from ..base import layout as L
from .program import Program


class MapReader:
    """The maps of one loaded program (`program`)."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.options = program.options
        self._events_cb: Callable | None = None  # kept alive while BCC holds it

    @property
    def bpf(self):
        return self.program.bpf

    def open_events(self, callback) -> None:
        """callback(Event copy) for every ring event, called from poll_events()."""

        def _cb(_ctx, data, _size):
            ev = L.Event()
            ct.memmove(ct.byref(ev), data, ct.sizeof(L.Event))
            callback(ev)
            return 0

        self._events_cb = _cb
        self.bpf[b"events"].open_ring_buffer(_cb)

    def poll_events(self, timeout_ms: int) -> None:
        self.bpf.ring_buffer_poll(timeout_ms)

    def drain_events(self) -> None:
        self.bpf.ring_buffer_consume()

    # --- map reads ---------------------------------------------------------------------------

    def iter_batches(self, name: str, key_type, val_type, chunk: int = 1 << 18, prefetch: bool = False):
        """Every entry of a hash map, read with BPF_MAP_LOOKUP_BATCH straight into preallocated
        numpy structured arrays of `chunk` entries (one syscall per chunk, not per key). Yields
        (keys, values) views of those buffers, valid until the next item is asked for: a caller
        copies what it keeps. With `prefetch`, a thread reads the next chunks (into two more
        buffers) while the caller works on this one: the kernel's copy-out (~0.4 µs an entry)
        and the caller's encoding overlap. Memory: 1 (3 with prefetch) x chunk x (key + value
        size), whatever the map holds."""
        table = self.bpf[name.encode()]
        kd, vd = np.dtype(key_type), np.dtype(val_type)
        fd = table.map_fd
        lookup = self.program.lib.lookup_batch

        def chunks(get_buf, stop=lambda: False):
            """(buffer pair, n) per chunk; get_buf() hands out a free pair."""
            in_batch, out_batch = ct.c_uint64(0), ct.c_uint64(0)
            first = True
            bufs = get_buf()
            while not stop():
                kbuf, vbuf = bufs
                cnt = ct.c_uint32(len(kbuf))
                res = lookup(
                    fd,
                    None if first else ct.byref(in_batch),
                    ct.byref(out_batch),
                    kbuf.ctypes.data,
                    vbuf.ctypes.data,
                    ct.byref(cnt),
                )
                err = ct.get_errno()
                n = cnt.value
                if res != 0 and err == errno.ENOSPC and n == 0:
                    # one bucket holds more entries than the buffer: a larger one, same position
                    bufs = (np.empty(len(kbuf) * 4, dtype=kd), np.empty(len(vbuf) * 4, dtype=vd))
                    continue
                if res != 0 and err != errno.ENOENT:
                    raise AllocscopeError(f"reading BPF map {name}: {os.strerror(err)}")
                if n:
                    yield bufs, n
                    if res == 0:
                        bufs = get_buf()
                if res != 0:
                    return
                first = False
                in_batch.value = out_batch.value

        def new_pair():
            return np.empty(chunk, dtype=kd), np.empty(chunk, dtype=vd)

        if not prefetch:
            pair = new_pair()
            for (k, v), n in chunks(lambda: pair):
                yield k[:n], v[:n]
            return

        free: queue.Queue = queue.Queue()
        for _ in range(3):
            free.put(new_pair())
        full: queue.Queue = queue.Queue()
        stop = threading.Event()

        def get_buf():
            while not stop.is_set():
                try:
                    return free.get(timeout=0.1)
                except queue.Empty:
                    continue
            return new_pair()  # stopping: never used

        def reader():
            try:
                for item in chunks(get_buf, stop.is_set):
                    full.put(item)
                full.put(None)
            except BaseException as e:  # noqa: BLE001 (handed to the consumer)
                full.put(e)

        th = threading.Thread(target=reader, name=f"read-{name}", daemon=True)
        th.start()
        try:
            while True:
                item = full.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                (k, v), n = item
                yield k[:n], v[:n]
                free.put((k, v))
        finally:
            stop.set()
            th.join()

    def _read_batch(self, name: str, key_type, val_type, chunk: int = 65536) -> tuple[np.ndarray, np.ndarray]:
        """All entries of a hash map as two numpy structured arrays (see iter_batches)."""
        keys_out, vals_out = [], []
        for k, v in self.iter_batches(name, key_type, val_type, chunk):
            keys_out.append(k.copy())
            vals_out.append(v.copy())
        if not keys_out:
            return np.empty(0, dtype=np.dtype(key_type)), np.empty(0, dtype=np.dtype(val_type))
        return np.concatenate(keys_out), np.concatenate(vals_out)

    def read_sites(self) -> tuple[np.ndarray, np.ndarray]:
        keys, vals = self._read_batch("sites", L.SiteKey, L.Site)
        return keys, vals[list(L.SITE_COUNTERS)]  # as_site.gen is no counter (changes.h)

    def read_live(self) -> tuple[np.ndarray, np.ndarray]:
        return self._read_batch("live", ct.c_uint64, L.Live)

    def read_dev_live(self) -> tuple[np.ndarray, np.ndarray]:
        """GPU allocations and pinned registrations outstanding: (DevKey, Live) arrays."""
        return self._read_batch("dev_live", L.DevKey, L.Live)

    def iter_live(self, chunk: int = 1 << 16):
        """The live map in chunks of at most `chunk` blocks (views, see iter_batches): the
        final snapshot streams them to the trace without holding the whole map."""
        return self.iter_batches("live", ct.c_uint64, L.Live, chunk, prefetch=True)

    def read_fault_sites(self) -> tuple[np.ndarray, np.ndarray]:
        """Residency mode: sampled first touches per (stack, thread), as `sites`."""
        if self.options.mode != "residency":
            return np.empty(0, dtype=np.dtype(L.SiteKey)), np.empty(0, dtype=np.dtype(L.Site))
        keys, vals = self._read_batch("fault_sites", L.SiteKey, L.Site)
        return keys, vals[list(L.SITE_COUNTERS)]

    def read_flows(self) -> tuple[np.ndarray, np.ndarray]:
        return self._read_batch("flows", L.FlowKey, L.Flow)

    def read_stacks(self, ids) -> dict[int, tuple[int, int, list[int]]]:
        """stack id -> (flags, extra, ips) for the ids given (missing ids are left out)."""
        table = self.bpf[b"stacks"]
        out = {}
        for sid in ids:
            try:
                st = table[table.Key(sid)]
            except KeyError:
                continue
            ips = []
            for i in range(min(st.depth, L.MAX_DEPTH)):
                ip = int(st.ips[i])
                if ip == 0:  # end of the frame chain
                    break
                ips.append(ip)
            out[int(sid)] = (int(st.flags), int(st.extra), ips)
        return out

    def read_counters(self) -> dict[str, int]:
        table = self.bpf[b"counters"]
        names = L.counter_names()
        out = {}
        # frees first: a free counted is of an allocation counted before it, so allocations read
        # after them are never fewer (read the other way round while threads churn, the live
        # count came out at -1 block)
        for idx, name in sorted(names.items(), key=lambda kv: kv[1] != "n_frees"):
            out[name] = int(sum(table[table.Key(idx)]))
        return out

    def read_totals(self) -> tuple[int, ...]:
        """From the kernel, exact: (live bytes, peak live bytes) of allocator-API memory;
        (bytes, count) of the regions the kernel side holds; CUDA host memory (pinned, managed)
        live; GPU memory live and its peak."""
        t = self.bpf[b"totals"]
        return tuple(int(t[t.Key(i)].value) for i in range(7))

    def set_peak_wake(self, threshold: int) -> None:
        """The live total past which the kernel side wakes the tracer for a peak snapshot
        (totals[7]; accounting.h peak_watch, tracer/record/peaks.py); 0: off."""
        t = self.bpf[b"totals"]
        t[t.Key(7)] = t.Leaf(threshold)

    def read_regions(self) -> tuple[np.ndarray, np.ndarray]:
        """Every region the kernel side holds: (starts, Region values)."""
        return self._read_batch("regions", ct.c_uint64, L.Region)

    def read_untracked(self) -> dict[int, int]:
        """The mappings the kernel side knows to be untracked: start -> end."""
        keys, vals = self._read_batch("untracked", ct.c_uint64, ct.c_uint64)
        return dict(zip(keys.tolist(), vals.tolist()))

    def forget_untracked(self, start: int) -> None:
        t = self.bpf[b"untracked"]
        try:
            del t[t.Key(start)]
        except KeyError:
            pass

    def take_region(self, start: int) -> bool:
        """Delete the region at `start` from the kernel side (the tracer takes it over); False
        when it is no longer there (the probes freed or moved it meanwhile)."""
        t = self.bpf[b"regions"]
        try:
            del t[t.Key(start)]
        except KeyError:
            return False
        return True

    def set_site_ext(self, sid: int, tid: int, source: int, freed: int) -> None:
        """Bytes of a region site the tracer freed itself (see site_ext in probes/allocscope.c)."""
        t = self.bpf[b"site_ext"]
        k = t.Key()
        k.stack_id, k.tid, k.source = sid, tid, source
        t[k] = t.Leaf(freed)

    def read_releases(self) -> tuple[np.ndarray, np.ndarray]:
        return self._read_batch("releases", L.ReleaseKey, L.Release)

    def read_waits(self) -> tuple[np.ndarray, np.ndarray]:
        """Waits at least --wait-min long, summed per (stack, thread): (WaitKey, Wait) arrays."""
        return self._read_batch("waits", L.WaitKey, L.Wait)

    def read_tlb(self) -> dict[str, int]:
        """TLB flushes on the target's threads, summed over CPUs: tlb_<reason>_flushes, _pages,
        _full (tlb:tlb_flush; reasons: layout.TLB_REASONS)."""
        table = self.bpf[b"tlb_flushes"]
        out = {}
        for i, name in enumerate(L.TLB_REASONS):
            vals = table[table.Key(i)]
            for f in ("flushes", "pages", "full"):
                out[f"tlb_{name}_{f}"] = int(sum(getattr(v, f) for v in vals))
        return out

    def read_offcpu(self) -> tuple[np.ndarray, np.ndarray]:
        """The target's threads blocked now: (tids, Offcpu values: since when, at which stack)."""
        return self._read_batch("offcpu", ct.c_uint32, L.Offcpu)

    def target_gone(self) -> bool:
        """The probes saw the target exec another program or its last thread exit: from then on
        nothing of its pid is counted, and /proc/PID describes something else."""
        t = self.bpf[b"gone"]
        return bool(t[t.Key(0)].value)

    def go_live(self, brk: int | None) -> int:
        """Every probe is attached: the mmap family's exits count from now on (probes/syscalls.h
        `sys_live`); a call that entered before is memory from before the attach, never a region.
        `brk`: the break read now (/proc/PID/maps' [heap] end; None: not known), so that the first
        growth is measured from where the break is, not from where it was when the recording
        began. Returns the time written (time.monotonic_ns, bpf_ktime_get_ns's clock)."""
        if brk:
            t = self.bpf[b"brk_state"]
            t[t.Key(0)] = t.Leaf(brk)
        now = time.monotonic_ns()
        t = self.bpf[b"sys_live"]
        t[t.Key(0)] = t.Leaf(now)
        return now

    def take_forks(self) -> tuple[list[int], int]:
        """The processes the target forked since the last call (probes/lifetime.bpf.c `forks`,
        deleted as read) and how many it forked in all (`fork_count`)."""
        t = self.bpf[b"forks"]
        pids = [int(k.value) for k, _ in t.items()]
        for pid in pids:
            try:
                del t[t.Key(pid)]
            except KeyError:
                pass
        c = self.bpf[b"fork_count"]
        return pids, int(c[c.Key(0)].value)
