"""Export a trace as a pprof profile (gzipped profile.proto), for `go tool pprof`, Pyroscope,
Grafana and anything else that reads Go's heap profiles.

    >>> open("heap.pb.gz", "wb").write(to_pprof(load_trace("pw12.allocscope")))
    $ go tool pprof -top -sample_index=inuse_space heap.pb.gz

The profile has the four sample types of a Go heap profile, in Go's order (alloc_objects,
alloc_space, inuse_objects, inuse_space; inuse_space is the default), one sample per
(site, allocating thread) with `thread` (name) and `tid` labels. Stacks are the report's
sites: allocator entry points and wrappers are folded away, as in `allocscope report`, so the
inuse_space total equals the report's site live bytes and `-top` lists the code that allocated.
Host memory only: GPU memory (CUDA device memory) is not in the profile.

Locations carry the captured instruction address and one line (function, file, line) each;
mappings are the modules (path and GNU build id), with an address range chosen so that
`address - memory_start + file_offset` is the frame's file offset, as pprof expects. Every
mapping claims functions, files and lines so pprof does not try to symbolize it again.

The profile.proto message classes are built at import from a descriptor written out in this
module (field numbers as in github.com/google/pprof's proto/profile.proto); the protobuf
runtime does the encoding. No generated code, so no protoc/runtime version coupling.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from ..analysis import Folding, FrameInfo, site_table, symbolize_stacks
from ..trace import Trace

# (name, unit) in Go's heap-profile order; the report columns they come from.
SAMPLE_TYPES: list[tuple[str, str, str]] = [
    ("alloc_objects", "count", "alloc_count"),
    ("alloc_space", "bytes", "alloc_bytes"),
    ("inuse_objects", "count", "live_count"),
    ("inuse_space", "bytes", "live_bytes"),
]
DEFAULT_SAMPLE_TYPE = "inuse_space"

# ---------------------------------------------------------------------------------------------
# profile.proto, as a descriptor: message -> [(field name, number, type, repeated, message type)]
_T = descriptor_pb2.FieldDescriptorProto
_I64, _U64, _STR, _BOOL, _MSG = _T.TYPE_INT64, _T.TYPE_UINT64, _T.TYPE_STRING, _T.TYPE_BOOL, _T.TYPE_MESSAGE
_PROTO_MESSAGES: dict[str, list[tuple[str, int, int, bool, str | None]]] = {
    "Profile": [
        ("sample_type", 1, _MSG, True, "ValueType"),
        ("sample", 2, _MSG, True, "Sample"),
        ("mapping", 3, _MSG, True, "Mapping"),
        ("location", 4, _MSG, True, "Location"),
        ("function", 5, _MSG, True, "Function"),
        ("string_table", 6, _STR, True, None),
        ("drop_frames", 7, _I64, False, None),
        ("keep_frames", 8, _I64, False, None),
        ("time_nanos", 9, _I64, False, None),
        ("duration_nanos", 10, _I64, False, None),
        ("period_type", 11, _MSG, False, "ValueType"),
        ("period", 12, _I64, False, None),
        ("comment", 13, _I64, True, None),
        ("default_sample_type", 14, _I64, False, None),
    ],
    "ValueType": [("type", 1, _I64, False, None), ("unit", 2, _I64, False, None)],
    "Sample": [
        ("location_id", 1, _U64, True, None),
        ("value", 2, _I64, True, None),
        ("label", 3, _MSG, True, "Label"),
    ],
    "Label": [
        ("key", 1, _I64, False, None),
        ("str", 2, _I64, False, None),
        ("num", 3, _I64, False, None),
        ("num_unit", 4, _I64, False, None),
    ],
    "Mapping": [
        ("id", 1, _U64, False, None),
        ("memory_start", 2, _U64, False, None),
        ("memory_limit", 3, _U64, False, None),
        ("file_offset", 4, _U64, False, None),
        ("filename", 5, _I64, False, None),
        ("build_id", 6, _I64, False, None),
        ("has_functions", 7, _BOOL, False, None),
        ("has_filenames", 8, _BOOL, False, None),
        ("has_line_numbers", 9, _BOOL, False, None),
        ("has_inline_frames", 10, _BOOL, False, None),
    ],
    "Location": [
        ("id", 1, _U64, False, None),
        ("mapping_id", 2, _U64, False, None),
        ("address", 3, _U64, False, None),
        ("line", 4, _MSG, True, "Line"),
        ("is_folded", 5, _BOOL, False, None),
    ],
    "Line": [("function_id", 1, _U64, False, None), ("line", 2, _I64, False, None)],
    "Function": [
        ("id", 1, _U64, False, None),
        ("name", 2, _I64, False, None),
        ("system_name", 3, _I64, False, None),
        ("filename", 4, _I64, False, None),
        ("start_line", 5, _I64, False, None),
    ],
}
PROTO_PACKAGE = "perftools.profiles"


def _build_classes() -> dict[str, type[Message]]:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="allocscope/pprof/profile.proto", package=PROTO_PACKAGE, syntax="proto3"
    )
    for msg, fields in _PROTO_MESSAGES.items():
        m = fdp.message_type.add(name=msg)
        for name, number, typ, repeated, type_name in fields:
            f = m.field.add(
                name=name, number=number, type=typ, label=_T.LABEL_REPEATED if repeated else _T.LABEL_OPTIONAL
            )
            if type_name:
                f.type_name = f".{PROTO_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()  # private: never clashes with another copy of the schema
    fd = pool.Add(fdp)
    return {msg: message_factory.GetMessageClass(fd.message_types_by_name[msg]) for msg in _PROTO_MESSAGES}


_CLASSES = _build_classes()
Profile: type[Message] = _CLASSES["Profile"]


def parse_pprof(data: bytes) -> Message:
    """Parse a (gzipped or plain) profile.proto into a Profile message."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    prof = Profile()
    prof.ParseFromString(data)
    return prof


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Frame:
    """A symbolized frame with where it was captured: what a pprof Location needs."""

    info: FrameInfo
    ip: int
    offset: int  # file offset in `info.module`; -1 when the frame has no file
    build_id: str


class _Strings:
    """The profile's string table; index 0 is ''."""

    def __init__(self) -> None:
        self.table: list[str] = [""]
        self._idx: dict[str, int] = {"": 0}

    def __call__(self, s: str | None) -> int:
        s = s or ""
        i = self._idx.get(s)
        if i is None:
            i = self._idx[s] = len(self.table)
            self.table.append(s)
        return i


def captured_frames(trace: Trace, stacks: Mapping[int, tuple[FrameInfo, ...]]) -> dict[int, tuple[_Frame, ...]]:
    """stack_id -> frames (innermost first) joined with their ip, offset and build id. Rows are
    ordered as symbolize_stacks orders them (one per (stack_id, idx), by idx); inlined frames
    share the row (address) of the frame they were inlined into."""
    st = trace.stacks.drop_duplicates(["stack_id", "idx"]).sort_values(["stack_id", "idx"])
    out: dict[int, tuple[_Frame, ...]] = {}
    for sid, g in st.groupby("stack_id", sort=False):
        infos = stacks.get(int(sid))
        if infos is None:
            continue
        groups: list[list[FrameInfo]] = [[]]
        for fi in infos:
            groups[-1].append(fi)
            if not getattr(fi, "inlined", False):
                groups.append([])
        groups = [grp for grp in groups if grp]
        if len(groups) != len(g):
            continue
        out[int(sid)] = tuple(
            _Frame(fi, int(ip), int(off), bid if isinstance(bid, str) else "")
            for grp, ip, off, bid in zip(groups, g["ip"], g["offset"], g["build_id"])
            for fi in grp
        )
    return out


def to_pprof(
    trace: Trace,
    stacks: Mapping[int, tuple[FrameInfo, ...]] | None = None,
    fold: Folding | None = None,
    at_seq: int | None = None,
) -> bytes:
    """The trace's final state as a gzipped pprof heap profile (see the module docstring).
    `stacks` is symbolize_stacks(trace) when the caller already has it; `fold` adds wrappers
    to fold out of the stacks (analysis.parse_fold); `at_seq`: the state at the end of that
    interval instead (`report --at peak`: analysis.peak_seq, the moment of the live peak, so
    that `go tool pprof -diff_base A.pb.gz B.pb.gz` compares the two runs' peaks)."""
    if stacks is None:
        stacks = symbolize_stacks(trace)
    sites = site_table(trace, dict(stacks), fold=fold, at_seq=at_seq)
    sites = sites[~sites["device"]]  # a heap profile of host memory: GPU memory is not in it
    captured = captured_frames(trace, stacks)
    names = trace.thread_names()
    s = _Strings()
    prof = Profile()
    for name, unit, _ in SAMPLE_TYPES:
        prof.sample_type.add(type=s(name), unit=s(unit))
    prof.default_sample_type = s(DEFAULT_SAMPLE_TYPE)
    prof.period_type.type, prof.period_type.unit = s("space"), s("bytes")
    prof.period = 1  # every allocation is counted: nothing is sampled

    # Mappings: one per (module, build id); address range from the frames seen in it.
    frames_by_key: dict[tuple, list[_Frame]] = {}
    for frames in captured.values():
        for fr in frames:
            if fr.info.module and fr.offset >= 0:
                frames_by_key.setdefault((fr.info.module, fr.build_id), []).append(fr)
    mapping_ids: dict[tuple, int] = {}
    for key, frs in frames_by_key.items():
        low = min(frs, key=lambda f: f.ip)
        mapping_ids[key] = len(mapping_ids) + 1
        prof.mapping.add(
            id=mapping_ids[key],
            memory_start=low.ip,
            memory_limit=max(f.ip for f in frs) + 1,
            file_offset=low.offset,
            filename=s(key[0]),
            build_id=s(key[1]),
            has_functions=True,
            has_filenames=True,
            has_line_numbers=True,
        )

    function_ids: dict[tuple, int] = {}
    location_ids: dict[tuple, int] = {}

    def location(fi: FrameInfo, fr: _Frame | None) -> int:
        key = (fi, fr.ip if fr else 0, fr.build_id if fr else "")
        lid = location_ids.get(key)
        if lid is not None:
            return lid
        fkey = (fi.function, fi.file)
        fid = function_ids.get(fkey)
        if fid is None:
            fid = function_ids[fkey] = len(function_ids) + 1
            prof.function.add(id=fid, name=s(fi.function), system_name=s(fi.function), filename=s(fi.file))
        lid = location_ids[key] = len(location_ids) + 1
        mid = mapping_ids.get((fi.module, fr.build_id)) if fr and fr.offset >= 0 else None
        loc = prof.location.add(id=lid, mapping_id=mid or 0, address=fr.ip if fr else 0)
        loc.line.add(function_id=fid, line=fi.line or 0)
        return lid

    # One sample per (site, allocating thread): rows of site_table summed over stacks and sources.
    value_cols = [col for _, _, col in SAMPLE_TYPES]
    samples: dict[tuple[tuple[int, ...], int], list[int]] = {}
    for row in sites.itertuples(index=False):
        site: tuple[FrameInfo, ...] = row.site
        full = captured.get(int(row.stack_id))
        kept = full[len(full) - len(site) :] if full else (None,) * len(site)
        loc_ids = tuple(location(fi, fr) for fi, fr in zip(site, kept))
        acc = samples.setdefault((loc_ids, int(row.tid)), [0] * len(value_cols))
        for i, col in enumerate(value_cols):
            acc[i] += int(getattr(row, col))
    for (loc_ids, tid), values in samples.items():
        if not any(values):
            continue
        smp = prof.sample.add(location_id=loc_ids, value=values)
        smp.label.add(key=s("thread"), str=s(names.get(tid, "?")))
        smp.label.add(key=s("tid"), num=tid)

    _set_header(prof, trace, s)
    prof.string_table.extend(s.table)
    return gzip.compress(prof.SerializeToString(), mtime=0)


def _set_header(prof: Message, trace: Trace, s: _Strings) -> None:
    """Time, duration and comments (target, labels) from the trace's meta and intervals."""
    wall = (trace.meta.get("clock") or {}).get("wall_s")
    if wall:
        prof.time_nanos = int(float(wall) * 1e9)
    if not trace.intervals.empty and "elapsed_s" in trace.intervals:
        el = trace.intervals["elapsed_s"].iloc[-1]
        if not pd.isna(el):
            prof.duration_nanos = int(float(el) * 1e9)
    tgt = trace.meta.get("target") or {}
    comments = [f"allocscope: pid {tgt.get('pid')} {tgt.get('exe') or tgt.get('comm') or ''}".rstrip()]
    comments += [f"{k}={v}" for k, v in trace.labels.items()]
    prof.comment.extend(s(c) for c in comments)
