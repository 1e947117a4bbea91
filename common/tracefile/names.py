"""The trace's names that code outside the format needs without importing pyarrow (the CLI
checks an output path before anything heavy is imported): the format tag and the file names."""

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
