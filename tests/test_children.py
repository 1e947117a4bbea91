"""When the report says the work is in forked children (reports/analysis/children.py), from
meta.json's `children` as tracer/record/children.py writes it; the recording itself:
tests/test_children_bpf.py."""

from __future__ import annotations

from reports.analysis.children import children_summary, children_warnings


def kids(seen: int, cpu: float, own: float, pids: list[int] | None = None) -> dict:
    listed = [
        {"pid": p, "comm": "w", "exe": "/x", "cpu_s": cpu / max(1, seen), "rss_max_bytes": 3 << 20} for p in pids or []
    ]
    return {
        "children": {
            "seen": seen,
            "alive": 0,
            "polls": 5,
            "target_cpu_s": own,
            "cpu_s": cpu,
            "rss_max_bytes": (50 << 20) * seen,  # shared buffers counted in each
            "anon_max_bytes": (3 << 20) * seen,
            "listed": listed,
        }
    }


def test_no_children_no_word():
    assert children_summary({}) is None  # a trace written before the recorder looked
    assert children_summary(kids(0, 0.0, 1.0)) is None
    assert children_warnings(None) == []


def test_busy_children_said_with_their_pids():
    pids = list(range(100, 111))
    s = children_summary(kids(11, 2.5, 0.02, pids))
    assert s is not None and s["work_in_children"] is True and s["seen"] == 11
    (w,) = children_warnings(s)
    assert w.startswith("the work is in 11 forked children (pids 100, 101, 102, 103, 104, 105, 106, 107 and 3 more)")
    assert "2.50s of CPU against 0.02s in the target" in w and "their own memory up to 33.0 MiB (anonymous RSS)" in w
    assert "allocscope follows one process: record a child with --pid 100" in w


def test_children_the_target_outworks_are_not_the_work():
    s = children_summary(kids(2, 1.0, 2.0, [7, 8]))
    assert s is not None and s["work_in_children"] is False
    assert children_warnings(s) == []
    s = children_summary(kids(1, 0.01, 0.0, [7]))  # an idle helper
    assert s is not None and s["work_in_children"] is False


def test_children_gone_between_reads_known_by_the_cpu_reaped():
    s = children_summary(kids(0, 0.8, 0.1))
    assert s is not None and s["work_in_children"] is True
    (w,) = children_warnings(s)
    assert w.startswith("the work is in forked children, each gone within an interval (0.80s of CPU against 0.10s")
