"""The trace's names that code outside the format needs without importing pyarrow (the CLI
checks an output path before anything heavy is imported): the format tag and the file names,
and what the intervals' lost_* counters mean."""

from __future__ import annotations

from collections.abc import Mapping

FORMAT = "allocscope.trace"
META = "meta.json"
PARTS = "parts"
# The reasons of tlb:tlb_flush in the kernel's order (enum tlb_flush_reason: the BPF map's index):
# the intervals' columns tlb_<reason>_flushes, tlb_<reason>_pages and tlb_<reason>_full.
TLB_REASONS = (
    "task_switch",
    "remote_shootdown",
    "local_shootdown",
    "local_mm_shootdown",
    "remote_ipi_send",
    "remote_wrong_cpu",
)

# A stack cut short, while its module's unwind table was being built or past 64 frames or a frame
# the unwinder cannot follow: the event and its bytes are counted (at its innermost frames),
# nothing lost. Said beside the losses ("N stacks cut short"), never as one.
NOT_LOST = frozenset({"lost_stack_pending", "lost_stack_truncated"})


def lost_events(counters: Mapping[str, int | float]) -> int:
    """Events the probes could not record, from an intervals row's cumulative lost_* counters:
    those that count events (not the *_bytes beside them, nor NOT_LOST). One definition for the
    record's summary line, the live views and the report's `totals.lost_events`."""
    return int(
        sum(
            int(v)
            for k, v in counters.items()
            if k.startswith("lost_") and not k.endswith("_bytes") and k not in NOT_LOST
        )
    )
