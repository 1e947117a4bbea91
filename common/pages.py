"""The page size allocscope counts memory in, and rounding to it. x86-64 only: 4 KiB base pages
(a huge page is counted as the base pages it spans, as /proc/PID/pagemap reports it)."""

from __future__ import annotations

PAGE = 4096


def page_up(n: int) -> int:
    """`n` rounded up to a page boundary."""
    return (n + PAGE - 1) & ~(PAGE - 1)


def page_down(n: int) -> int:
    """`n` rounded down to a page boundary."""
    return n & ~(PAGE - 1)
