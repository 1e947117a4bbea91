"""`reports.trace.load_trace(path)`: the documented way to read a trace into pandas. The reader
itself is common.tracefile.reader (the tracer's tests and reports share it); this module only
names it here."""

from __future__ import annotations

from common.tracefile.reader import Trace, load_trace, read_meta

__all__ = ["Trace", "load_trace", "read_meta"]
