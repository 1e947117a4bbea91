"""The ranked sites table of a report document as CSV (RFC 4180 quoting, '\\n' line ends).

Columns: rank, live_bytes, live_count, peak_live_bytes, alloc_bytes, alloc_count, top_frame
(the site's innermost frame), frames (the site's frames, innermost first, joined by ' <- ':
"a <- b" reads "a, called from b"), full_frames (the same for the stack before allocator
wrappers were folded away), device_live_bytes, device_peak_bytes (the site's GPU memory, apart
from the host bytes of the other columns), location (the key of the site's location, see
reports.analysis.stacks.location_key: group the rows by it to sum a place reached by several stacks).
Frames are written as in the text report.
"""

from __future__ import annotations

import csv
import io

from .shared import frame_text

COLUMNS = [
    "rank",
    "live_bytes",
    "live_count",
    "peak_live_bytes",
    "alloc_bytes",
    "alloc_count",
    "top_frame",
    "frames",
    "full_frames",
    "device_live_bytes",
    "device_peak_bytes",
    "location",
]
FRAME_SEP = " <- "


def join_frames(frames: list[dict]) -> str:
    """Frames (report dicts, innermost first) as one ' <- '-separated string."""
    return FRAME_SEP.join(frame_text(f) for f in frames)


def to_csv(report_doc: dict) -> str:
    """One header line, then one line per site in rank order."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for site in report_doc.get("sites") or []:
        frames = site.get("frames") or []
        w.writerow(
            [
                site["rank"],
                site["live_bytes"],
                site["live_count"],
                site["peak_live_bytes"],
                site["alloc_bytes"],
                site["alloc_count"],
                frame_text(frames[0]) if frames else "",
                join_frames(frames),
                join_frames(site.get("full_frames") or frames),
                site.get("device_live_bytes", 0),
                site.get("device_peak_bytes", 0),
                site.get("location", ""),
            ]
        )
    return buf.getvalue()
