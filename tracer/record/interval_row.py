"""The columns an `intervals` row takes from the recording, for the regular snapshots and the
peak ones alike (snapshot.py, peak_snapshot.py): the memory figures and the counters. `rec` is
the Recorder (tracer/record/recorder.py)."""

from __future__ import annotations


def memory_columns(
    mem: dict, heap_live: int, heap_peak: int, mm_live: int, cuda_host: int, dev_live: int, dev_peak: int
) -> dict:
    """An interval row's memory columns, in the schema's order: the RSS figures of
    procfs.rss (-1 where not read) and the probes' totals."""
    return {
        **{
            k: mem.get(k, -1) for k in ("rss_bytes", "rss_anon_bytes", "rss_file_bytes", "rss_shmem_bytes", "hwm_bytes")
        },
        "heap_live_bytes": heap_live,
        "heap_peak_bytes": heap_peak,
        "mmap_live_bytes": mm_live,
        "cuda_host_live_bytes": cuda_host,
        "device_live_bytes": dev_live,
        "device_peak_bytes": dev_peak,
        "live_bytes": heap_live + mm_live + cuda_host,
    }


def interval_counters(rec, counters: dict[str, int]) -> dict[str, int]:
    """The `intervals` counters from the kernel's (read_counters), completed in place."""
    counters.update(rec.probes.maps.read_tlb())
    counters["n_attach_window_returns"] = rec.attach_window_returns
    counters["lost_unmatched_ret"] -= rec.attach_window_returns
    if rec.opts.mode == "residency":
        counters["n_faults"] = rec.probes.faults.count()
    return counters
