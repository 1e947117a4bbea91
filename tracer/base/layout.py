"""ctypes mirror of probes/allocscope.h — the one header shared with the BPF program.

Enum values are read from the header itself, so they cannot drift; struct layouts are mirrored
by hand and tests/test_layout.py checks them against the classes BCC derives from the header.
"""

from __future__ import annotations

import ctypes as ct
import re
from functools import lru_cache
from pathlib import Path

from common.tracefile.names import TLB_REASONS  # noqa: F401 (the index of tlb_flushes, read as layout.TLB_REASONS)

PROBES_DIR = Path(__file__).resolve().parents[2] / "probes"
HEADER = PROBES_DIR / "allocscope.h"
SOURCE = PROBES_DIR / "allocscope.c"

MAX_DEPTH = 64


@lru_cache(maxsize=1)
def _enums() -> dict[str, int]:
    """Parse `NAME = value,` and implicit increments inside the header's enums."""
    text = HEADER.read_text()
    values: dict[str, int] = {}
    for body in re.findall(r"enum\s+\w+\s*\{(.*?)\};", text, re.S):
        nxt = 0
        for line in body.splitlines():
            line = re.sub(r"/\*.*?\*/", "", line).strip().rstrip(",").strip()
            if not line:
                continue
            m = re.fullmatch(r"(\w+)\s*(?:=\s*(\w+))?", line)
            if not m:
                continue
            name, val = m.group(1), m.group(2)
            if val is not None:
                nxt = values[val] if val in values else int(val, 0)
            values[name] = nxt
            nxt += 1
    return values


def enum(name: str) -> int:
    return _enums()[name]


def _names(prefix: str, stop: str | None = None) -> dict[int, str]:
    out = {}
    for k, v in _enums().items():
        if k.startswith(prefix) and k != stop and not k.endswith("_MAX"):
            out[v] = k[len(prefix) :].lower()
    return out


API_NAMES: dict[int, str] = _names("AS_API_")
EVENT_NAMES: dict[int, str] = _names("AS_EV_")
SOURCE_NAMES: dict[int, str] = {k: v.replace("_", "-") for k, v in _names("AS_SRC_").items()}


def counter_names() -> dict[int, str]:
    """Index -> column name: losses are `lost_*`, the others `n_*`."""
    out = {}
    for k, v in _enums().items():
        if k.startswith("AS_LOST_") and k != "AS_LOST_COUNT":
            out[v] = "lost_" + k[len("AS_LOST_") :].lower()
        elif k.startswith("AS_CNT_") and k != "AS_CNT_MAX":
            out[v] = "n_" + k[len("AS_CNT_") :].lower()
    return out


STACK_SYSCALL = 1


class Stack(ct.Structure):
    _fields_ = [
        ("depth", ct.c_uint32),
        ("flags", ct.c_uint32),
        ("extra", ct.c_uint64),
        ("ips", ct.c_uint64 * MAX_DEPTH),
    ]


class Live(ct.Structure):
    _fields_ = [
        ("size", ct.c_uint64),
        ("stack_id", ct.c_uint64),
        ("ts_ns", ct.c_uint64),
        ("tid", ct.c_uint32),
        ("api", ct.c_uint16),
        ("source", ct.c_uint16),
    ]


class SiteKey(ct.Structure):
    _fields_ = [("stack_id", ct.c_uint64), ("tid", ct.c_uint32), ("source", ct.c_uint32)]


class Site(ct.Structure):
    _fields_ = [
        ("alloc_bytes", ct.c_uint64),
        ("alloc_count", ct.c_uint64),
        ("free_bytes", ct.c_uint64),
        ("free_count", ct.c_uint64),
        ("peak_live_bytes", ct.c_uint64),
        ("gen", ct.c_uint64),
    ]


SITE_COUNTERS = ("alloc_bytes", "alloc_count", "free_bytes", "free_count", "peak_live_bytes")  # not `gen`


class Change(ct.Structure):  # probes/changes.h: a site key named in a generation
    _fields_ = [("stack_id", ct.c_uint64), ("tid", ct.c_uint32), ("source", ct.c_uint32), ("gen", ct.c_uint64)]


class DevKey(ct.Structure):
    _fields_ = [("value", ct.c_uint64), ("kind", ct.c_uint32), ("pad", ct.c_uint32)]


class FlowKey(ct.Structure):
    _fields_ = [("alloc_tid", ct.c_uint32), ("free_tid", ct.c_uint32)]


class Flow(ct.Structure):
    _fields_ = [
        ("bytes", ct.c_uint64),
        ("count", ct.c_uint64),
        ("wait_ns_sum", ct.c_uint64),
        ("wait_ns_max", ct.c_uint64),
    ]


class Inflight(ct.Structure):
    _fields_ = [
        ("sp", ct.c_uint64),
        ("size", ct.c_uint64),
        ("arg", ct.c_uint64),
        ("arg2", ct.c_uint64),
        ("ts_ns", ct.c_uint64),
        ("api", ct.c_uint32),
        ("nest", ct.c_uint16),
        ("tail", ct.c_uint16),
        ("source", ct.c_uint32),
        ("unsampled", ct.c_uint32),
        ("ra", ct.c_uint64),
    ]


class Custom(ct.Structure):
    _fields_ = [
        ("source", ct.c_uint32),
        ("size_arg", ct.c_uint8),
        ("count_arg", ct.c_uint8),
        ("out_arg", ct.c_uint8),
        ("ptr_arg", ct.c_uint8),
    ]


class Event(ct.Structure):
    _fields_ = [
        ("type", ct.c_uint32),
        ("tid", ct.c_uint32),
        ("ts_ns", ct.c_uint64),
        ("addr", ct.c_uint64),
        ("len", ct.c_uint64),
        ("addr2", ct.c_uint64),
        ("len2", ct.c_uint64),
        ("stack_id", ct.c_uint64),
        ("ret", ct.c_int64),
        ("flags", ct.c_uint32),
        ("prot", ct.c_uint32),
        ("fd", ct.c_int32),
        ("in_api", ct.c_uint32),
        ("source", ct.c_uint32),
        ("pad", ct.c_uint32),
        ("comm", ct.c_char * 16),
    ]


class Sysargs(ct.Structure):
    _fields_ = [
        ("a0", ct.c_uint64),
        ("a1", ct.c_uint64),
        ("a2", ct.c_uint64),
        ("a3", ct.c_uint64),
        ("a4", ct.c_uint64),
        ("ts_ns", ct.c_uint64),
        ("rss", ct.c_int64),
        ("nr", ct.c_uint32),
        ("pad", ct.c_uint32),
    ]


class Region(ct.Structure):
    _fields_ = [
        ("end", ct.c_uint64),
        ("stack_id", ct.c_uint64),
        ("ts_ns", ct.c_uint64),
        ("tid", ct.c_uint32),
        ("source", ct.c_uint32),
    ]


class ReleaseKey(ct.Structure):
    _fields_ = [("tid", ct.c_uint32), ("kind", ct.c_uint16), ("api", ct.c_uint16), ("stack_id", ct.c_uint64)]


class Release(ct.Structure):
    _fields_ = [
        ("calls", ct.c_uint64),
        ("requested_bytes", ct.c_uint64),
        ("released_bytes", ct.c_int64),
        ("ns", ct.c_uint64),
    ]


class Offcpu(ct.Structure):
    _fields_ = [("ts_ns", ct.c_uint64), ("stack_id", ct.c_uint64), ("state", ct.c_uint32), ("pad", ct.c_uint32)]


class WaitKey(ct.Structure):
    _fields_ = [("stack_id", ct.c_uint64), ("tid", ct.c_uint32), ("pad", ct.c_uint32)]


class Wait(ct.Structure):
    _fields_ = [("count", ct.c_uint64), ("total_ns", ct.c_uint64), ("max_ns", ct.c_uint64)]


class Tlb(ct.Structure):
    _fields_ = [("flushes", ct.c_uint64), ("pages", ct.c_uint64), ("full", ct.c_uint64)]


class WaitWay(ct.Structure):
    _fields_ = [("ip", ct.c_uint64), ("sp", ct.c_uint64), ("bp", ct.c_uint64), ("stack_id", ct.c_uint64)]


class WaitMemo(ct.Structure):
    _fields_ = [("way", WaitWay * 4), ("next", ct.c_uint32), ("pad", ct.c_uint32)]


# map name -> (key class, value class): what tests compare against BCC's classes.
MAP_LAYOUTS = {
    "live": (ct.c_uint64, Live),
    "stacks": (ct.c_uint64, Stack),
    "sites": (SiteKey, Site),
    "site_chg": (ct.c_uint32, Change),
    "flows": (FlowKey, Flow),
    "sysargs": (ct.c_uint32, Sysargs),
    "regions": (ct.c_uint64, Region),
    "site_ext": (SiteKey, ct.c_uint64),
    "releases": (ReleaseKey, Release),
    "offcpu": (ct.c_uint32, Offcpu),
    "waits": (WaitKey, Wait),
    "wait_memo": (ct.c_uint32, WaitMemo),
    "dev_live": (DevKey, Live),
    "custom_fns": (ct.c_uint64, Custom),
    "probe_src": (ct.c_uint64, ct.c_uint32),
}  # (Inflight is the value of task storage `inflight`, which BCC's Python cannot open; its
# layout is checked against gcc in tests/test_layout.py)
