"""CPython's interpreter frames in a recording (docs/python.md): the interpreter found in the
target, its layout, the probe's maps kept current, the code objects read while the process runs.

* **Which interpreter**: a `libpython3.X.so` or a `python3.X` executable in the target's maps
  that defines `_PyRuntime`; its version from `Py_Version` (3.11+), read from the process.
* **Its layout** (`LAYOUTS`): the offsets the frame walk (probes/python.h) and the readers here
  need, per minor version, taken with offsetof() against each version's own internal headers
  (pyenv's 3.11.7, 3.12.1, 3.13.0 and Debian's 3.11.2 agree within a minor version; the test
  tests/test_python_layout.py compiles the same program and compares). 3.13 publishes its own
  in `_Py_DebugOffsets` at the start of `_PyRuntime` (cookie ``xdebugpy``): read from there when
  present. A version outside the table is said once; its stacks stay native.
* **Which thread runs which PyThreadState**: walked from outside, `_PyRuntime.interpreters.head
  -> threads.head -> next`, each tstate's `native_thread_id` (the kernel's tid), into the
  `pythreads` map (tid -> tstate): at the attach, at every tick (a new thread is named within
  REFRESH_S) and before each snapshot. Chosen over the thread's TLS (`_Py_tss_tstate`, 3.12+):
  it is the same for every version (3.11 has no such TLS variable), needs no fsbase or TLS
  offset per build, and costs the probe one hash lookup.
* **The code objects** the frames name: read from /proc/PID/mem when a stack first names them
  (cached by address), kept in the trace's `pycode` table (name, qualname, file, first line,
  location table), and each stack's frames (code, instruction index) in `pyframes`: reports
  map the index to a line offline (reports/symbolize/python.py), the process may be gone.
"""

from __future__ import annotations

import os
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

from common.elf import open_elf, segments

from ..process.procfs import Mapping
from .python_layout import DEBUG_WORDS, LAYOUTS, Layout, debug_layout

REFRESH_S = 0.25  # the thread walk at most this often from tick()
MAX_THREADS = 4096  # PyThreadStates walked per interpreter
MAX_INTERPRETERS = 64
MAX_CODES = 1 << 16  # code objects cached
MAX_PENDING = 1 << 14  # stacks whose code objects wait for the next tick (AS_PY_STACKS)
MAX_LINETABLE = 1 << 20
MAX_NAME = 4096
FRAME_BYTES = 80  # what the probe reads of a frame (AS_PY_FRAME_BYTES)
ENTRY_CUT = 2  # pyframes.entry's bit: the stack's outer Python frames were cut after this one
USER_END = 1 << 47  # x86-64 user addresses lie below
_FILE_RX = re.compile(r"(?:^|/)(?:lib)?python(\d+)\.(\d+)[a-z]*(?:\.so[.\d]*)?$")


class ProcMem:
    """/proc/PID/mem, read at addresses (None where the process has nothing readable)."""

    def __init__(self, pid: int) -> None:
        self.fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)

    def read(self, addr: int, n: int) -> bytes | None:
        if addr <= 0 or n <= 0 or addr + n > USER_END:  # a stray pointer (a frame half set up)
            return None
        try:
            b = os.pread(self.fd, n, addr)
        except OSError:
            return None
        return b if len(b) == n else None

    def u64(self, addr: int) -> int | None:
        b = self.read(addr, 8)
        return None if b is None else int.from_bytes(b, "little")

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class Interpreter:
    path: str
    version: tuple[int, int, int]
    runtime: int  # the address of _PyRuntime in the process
    layout: Layout | None  # None: a version not known here
    source: str  # "debug offsets" | "table" | ""

    @property
    def label(self) -> str:
        return f"CPython {'.'.join(str(v) for v in self.version if v >= 0)} ({os.path.basename(self.path)})"


def _symbols(path: str, names: tuple[str, ...]) -> tuple[dict[str, int], int]:
    """{name: st_value} of `names` in .dynsym/.symtab, and the first PT_LOAD's vaddr (page down)."""
    opened = open_elf(path)
    if opened is None:
        return {}, 0
    out: dict[str, int] = {}
    with opened:
        try:
            for sec_name in (".dynsym", ".symtab"):
                sec = opened.elf.get_section_by_name(sec_name)
                if sec is None or not hasattr(sec, "get_symbol_by_name"):
                    continue
                for n in names:
                    if n not in out:
                        syms = sec.get_symbol_by_name(n)
                        if syms and syms[0]["st_shndx"] != "SHN_UNDEF":
                            out[n] = int(syms[0]["st_value"])
            segs = segments(opened.elf)
        except Exception:  # noqa: BLE001 - a malformed file defines nothing
            return {}, 0
    first = min((s.vaddr for s in segs), default=0) & ~0xFFF
    return out, first


def candidates(maps: list[Mapping]) -> list[Mapping]:
    """The first mapping of each file that could be CPython (libpython3.X.so, python3.X)."""
    seen: dict[str, Mapping] = {}
    for m in maps:
        if m.is_file and m.offset == 0 and _FILE_RX.search(m.path) and m.path not in seen:
            seen[m.path] = m
    return list(seen.values())


def find_interpreter(mem: ProcMem, maps: list[Mapping]) -> Interpreter | None:
    """The CPython of the process (its `_PyRuntime` found and its version read), None when none."""
    for m in candidates(maps):
        syms, first = _symbols(m.path, ("_PyRuntime", "Py_Version"))
        if "_PyRuntime" not in syms:
            continue
        bias = m.start - first  # 0 for a fixed-address executable
        runtime = bias + syms["_PyRuntime"]
        hexv = None
        if "Py_Version" in syms:
            b = mem.read(bias + syms["Py_Version"], 4)
            hexv = int.from_bytes(b, "little") if b else None
        if hexv:
            version = (hexv >> 24, (hexv >> 16) & 0xFF, (hexv >> 8) & 0xFF)
        else:  # before 3.11 (no Py_Version): the file name
            fm = _FILE_RX.search(m.path)
            version = (int(fm.group(1)), int(fm.group(2)), -1) if fm else (0, 0, -1)  # -1: not known
        minor = version[:2]
        blob = mem.read(runtime, 8 * DEBUG_WORDS) or b""
        layout = debug_layout(blob, minor)  # type: ignore[arg-type]
        if layout is not None:
            return Interpreter(m.path, version, runtime, layout, "debug offsets")
        if minor in LAYOUTS:
            return Interpreter(m.path, version, runtime, LAYOUTS[minor], "table")  # type: ignore[index]
        return Interpreter(m.path, version, runtime, None, "")
    return None


def thread_states(mem: ProcMem, interp: Interpreter) -> dict[int, int]:
    """native thread id -> PyThreadState address, every interpreter's threads (a thread with a
    state in several: the main interpreter's, the last walked)."""
    return {tid: states[-1] for tid, states in thread_states_all(mem, interp).items()}


def thread_states_all(mem: ProcMem, interp: Interpreter) -> dict[int, list[int]]:
    """native thread id -> its PyThreadStates, one per interpreter it has one in, newest
    interpreter first (`interpreters.head`; the main interpreter last)."""
    lay = interp.layout
    assert lay is not None
    out: dict[int, list[int]] = {}
    head = mem.u64(interp.runtime + lay.runtime_interpreters_head)
    seen_i = 0
    while head and seen_i < MAX_INTERPRETERS:
        seen_i += 1
        ts = mem.u64(head + lay.interp_threads_head)
        n = 0
        while ts and n < MAX_THREADS:
            n += 1
            tid = mem.u64(ts + lay.tstate_native_thread_id)
            if tid is not None and 0 < tid < 1 << 32 and ts not in out.get(int(tid), ()):
                out.setdefault(int(tid), []).append(ts)
            ts = mem.u64(ts + lay.tstate_next)
        head = mem.u64(head + lay.interp_next)
    return out


MAX_REFCNT = 1 << 40  # a live object's count (immortal ones included, 3.12+: 2**30 - 1 or so)


def alive(head: bytes) -> bool:
    """The object whose first bytes are `head` looks alive: a freed block's first word is the
    allocator's free-list link (an address, or 0), never a small positive count."""
    return 0 < int.from_bytes(head[:8], "little") < MAX_REFCNT


def read_unicode(mem: ProcMem, lay: Layout, addr: int) -> str | None:
    """A str object's text (compact strings: every name and file name of a code object)."""
    head = mem.read(addr, lay.unicode_compact_data)
    if head is None or not alive(head):
        return None
    length = int.from_bytes(head[lay.unicode_length : lay.unicode_length + 8], "little")
    state = int.from_bytes(head[lay.unicode_state : lay.unicode_state + 4], "little")
    kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
    if not compact or length > MAX_NAME or kind not in (1, 2, 4):
        return None
    if ascii_:
        data = mem.read(addr + lay.unicode_ascii_data, length) if length else b""
        return None if data is None else data.decode("ascii", "replace")
    data = mem.read(addr + lay.unicode_compact_data, length * kind) if length else b""
    if data is None:
        return None
    return data.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], "replace")


def read_bytes(mem: ProcMem, lay: Layout, addr: int) -> bytes | None:
    head = mem.read(addr, lay.bytes_size + 8)
    if head is None or not alive(head):
        return None
    size = int.from_bytes(head[lay.bytes_size :], "little")
    if size > MAX_LINETABLE:
        return None
    return mem.read(addr + lay.bytes_sval, size) if size else b""


@dataclass(frozen=True)
class Code:
    name: str
    qualname: str
    file: str
    firstlineno: int
    linetable: bytes


def read_code(mem: ProcMem, lay: Layout, addr: int) -> Code | None:
    """A PyCodeObject's names, file, first line and location table, None when unreadable."""
    head = mem.read(addr, lay.code_adaptive)
    if head is None or not alive(head):  # freed (a module body once run, an interpreter exiting)
        return None

    def ptr(off: int) -> int:
        return int.from_bytes(head[off : off + 8], "little")

    name = read_unicode(mem, lay, ptr(lay.code_name))
    qualname = read_unicode(mem, lay, ptr(lay.code_qualname))
    file = read_unicode(mem, lay, ptr(lay.code_filename))
    table = read_bytes(mem, lay, ptr(lay.code_linetable))
    if name is None or file is None or table is None:
        return None
    first = struct.unpack_from("<i", head, lay.code_firstlineno)[0]
    return Code(name, qualname or name, file, first, table)


MASK64 = (1 << 64) - 1


def tag_offsets(lay: Layout) -> tuple[int, int, int]:
    """(where a code object's identity words start, co_filename's and co_name's word from there):
    what probes/python.h py_tags reads, 64 bytes."""
    base = lay.code_firstlineno & ~7
    return base, (lay.code_filename - base) // 8, (lay.code_name - base) // 8


def code_tag(words: bytes, lay: Layout) -> int:
    """py_tags of probes/python.h, from the 64 bytes at the code object + tag_offsets()[0]."""
    _, fi, ni = tag_offsets(lay)
    w = struct.unpack("<8Q", words)
    return (w[0] ^ (w[fi] * 0x9E3779B97F4A7C15 & MASK64) ^ (w[ni] * 0xBF58476D1CE4E5B9 & MASK64)) & MASK64


def code_key(addr: int, tag: int) -> int:
    """A code object's key in the trace (`pyframes.code`, `pycode.code`): its address, hashed with
    its identity tag, so an address another code object took later is another key."""
    return (addr ^ (tag * 0xFF51AFD7ED558CCD)) & MASK64


def conf_values(lay: Layout, runtime: int = 0) -> dict[str, int]:
    """The fields of `struct as_pyconf` (probes/python.h) for a layout; `runtime`: the address of
    `_PyRuntime` (the probe looks for a thread the tracer has not named from there; 0: it does not)."""
    base, fi, ni = tag_offsets(lay)
    return {
        "runtime": runtime if lay.runtime_main_interp >= 0 else 0,
        "rt_main_interp": max(lay.runtime_main_interp, 0),
        "interp_threads": lay.interp_threads_head,
        "tstate_next": lay.tstate_next,
        "tstate_native_tid": lay.tstate_native_thread_id,
        "rt_interp_head": lay.runtime_interpreters_head,
        "multi": 0,
        "code_tag": base,
        "tag_file": fi,
        "tag_name": ni,
        "on": 1,
        "tstate_frame": lay.tstate_current_frame,
        "cframe_frame": lay.cframe_current_frame,
        "frame_code": lay.frame_code,
        "frame_instr": lay.frame_instr,
        "frame_previous": lay.frame_previous,
        "frame_owner": lay.frame_owner,
        "frame_is_entry": lay.frame_is_entry,
        "owner_cstack": lay.owner_cstack,
    }


def _fits(lay: Layout) -> bool:
    """Every frame field the probe reads lies in the FRAME_BYTES it reads."""
    offs = (
        lay.frame_code + 8,
        lay.frame_instr + 8,
        lay.frame_previous + 8,
        lay.frame_owner + 1,
        lay.frame_is_entry + 1,
    )
    base, fi, ni = tag_offsets(lay)
    return max(offs) <= FRAME_BYTES and min(fi, ni) >= 0 and max(fi, ni) < 8 and lay.code_firstlineno - base < 8


class PythonFrames:
    """CPython's frames for one recording: `tables(name)` gives the probe's BCC tables
    (pyconf, pythreads, pystacks); `say` prints a line once."""

    def __init__(self, pid: int, tables: Callable[[str], object], say: Callable[[str], None]) -> None:
        self.pid = pid
        self.tables = tables
        self.say = say
        self.mem = ProcMem(pid)
        self.interp: Interpreter | None = None
        self.unknown_said = False
        self.looked: set[str] = set()  # candidate files already looked at
        self.tids: dict[int, int] = {}
        self.multi = False  # pyconf.multi written (subinterpreters seen)
        self.last_refresh = 0.0
        self.codes: dict[int, Code | None] = {}
        self.written_codes: set[int] = set()
        self.adaptive = 0
        self.pending: list[int] = []  # stacks stored since the last tick (stored())

    # --- discovery -----------------------------------------------------------------------

    def update(self, maps: list[Mapping]) -> None:
        """Look for the interpreter in `maps` (the attach, and each time the maps change until found)."""
        if self.interp is not None:
            return
        fresh = [m for m in candidates(maps) if m.path not in self.looked]
        if not fresh:
            return
        self.mem.close()  # opened before an exec (launch mode), it would read the old program
        self.mem = ProcMem(self.pid)
        found = find_interpreter(self.mem, fresh)
        self.looked.update(m.path for m in fresh)
        if found is None:
            return
        if found.layout is None or not _fits(found.layout):
            if not self.unknown_said:
                self.unknown_said = True
                self.say(
                    f"python: {found.label}: its interpreter layout is not known to allocscope "
                    f"(CPython {', '.join(f'{a}.{b}' for a, b in LAYOUTS)}); its stacks stay native"
                )
            return
        self.interp = found
        self.adaptive = found.layout.code_adaptive
        conf = self.tables("pyconf")
        leaf = conf.Leaf()  # type: ignore[attr-defined]
        find = os.environ.get("ALLOCSCOPE_PYTHON_FIND") != "0"  # 0: bench/python_native_threads.py's baseline
        for k, v in conf_values(found.layout, found.runtime if find else 0).items():
            setattr(leaf, k, v)
        conf[conf.Key(0)] = leaf  # type: ignore[attr-defined,index]
        self.refresh()
        self.say(f"python: {found.label}, layout from the {found.source}; Python frames in the stacks")

    # --- threads -------------------------------------------------------------------------

    def refresh(self) -> None:
        """`pythreads` made equal to the process's thread states now (a thread with states in a
        subinterpreter and the main one: the main one's; the probe looks in the newest
        subinterpreter itself once pyconf.multi is set)."""
        if self.interp is None:
            return
        self.last_refresh = time.monotonic()
        now = thread_states(self.mem, self.interp)
        lay = self.interp.layout
        if not self.multi and lay is not None and self.several_interpreters():
            self.multi = True
            conf = self.tables("pyconf")
            leaf = conf[conf.Key(0)]  # type: ignore[attr-defined,index]
            leaf.multi = 1
            conf[conf.Key(0)] = leaf  # type: ignore[attr-defined,index]
        if lay is not None and lay.runtime_main_interp >= 0 and self.pid not in now:  # not started yet
            now[self.pid] = self.interp.runtime + lay.runtime_main_interp + lay.interp_initial_thread
        if now == self.tids:
            return
        t = self.tables("pythreads")
        for tid in self.tids.keys() - now.keys():
            try:
                del t[t.Key(tid)]  # type: ignore[attr-defined,attr-defined]
            except KeyError:
                pass
        for tid, ts in now.items():
            if self.tids.get(tid) != ts:
                t[t.Key(tid)] = t.Leaf(ts)  # type: ignore[attr-defined,index]
        self.tids = now

    def several_interpreters(self) -> bool:
        """Subinterpreters exist (the interpreters list's head is not the main one): the probe
        then looks for a thread's state in the newest too (probes/python.h py_sub_tstate)."""
        assert self.interp is not None and self.interp.layout is not None
        lay = self.interp.layout
        head = self.mem.u64(self.interp.runtime + lay.runtime_interpreters_head)
        return bool(head) and lay.runtime_main_interp >= 0 and head != self.interp.runtime + lay.runtime_main_interp

    def thread_found(self, tid: int, tstate: int) -> None:
        """The probe found thread `tid`'s PyThreadState itself (AS_EV_PYTHREAD, a thread started
        since the last walk) and put it in `pythreads`: the walk owns that entry from now on (it
        is removed when the thread is gone)."""
        if self.interp is not None:
            self.tids[tid] = tstate

    def tick(self) -> None:
        if self.interp is not None and time.monotonic() - self.last_refresh >= REFRESH_S:
            self.refresh()
        if self.pending:
            self.read_pending()

    def stored(self, sid: int) -> None:
        """The probe stored stack `sid` (its AS_EV_PYSTACK event): read its code objects at the
        next tick, right after the poll that brought the event."""
        if len(self.pending) < MAX_PENDING:
            self.pending.append(sid)

    def read_pending(self) -> None:
        """The code objects of the stacks stored since the last tick, read now into the cache the
        snapshot's columns() takes them from: a module body (run once at import) or `exec`'d code
        is freed as soon as it has run, long before the next snapshot."""
        ids, self.pending = self.pending, []
        if self.interp is None:
            return
        for _native, frames in self.frames_of(ids).values():
            for code, _lasti, _entry, tag in frames:
                self.code(code, tag)

    # --- stacks and code objects ---------------------------------------------------------

    def code(self, addr: int, tag: int) -> Code | None:
        """The code object at `addr` if it still is the one the probe saw (its identity `tag`);
        None when it was freed and its address reused, or does not read as a code object."""
        key = code_key(addr, tag)
        if key not in self.codes:
            if len(self.codes) >= MAX_CODES:
                self.codes.clear()
                self.written_codes.clear()
            lay = self.interp.layout if self.interp is not None else None
            assert lay is not None
            words = self.mem.read(addr + tag_offsets(lay)[0], 64)
            try:
                same = words is not None and code_tag(words, lay) == tag
                self.codes[key] = read_code(self.mem, lay, addr) if same else None
            except (ValueError, OverflowError, struct.error, UnicodeError):  # not a code object
                self.codes[key] = None
        return self.codes[key]

    def frames_of(self, ids) -> dict[int, tuple[int, list[tuple[int, int, int, int]]]]:
        """stack id -> (native id, [(code address, instruction index, entry, code tag)]) of the
        ids that have Python frames; entry: 1 on an eval loop's first frame, | ENTRY_CUT on the
        last frame the probe kept of a stack whose outer frames it cut (deeper than AS_PY_DEPTH)."""
        if self.interp is None:
            return {}
        t = self.tables("pystacks")
        out = {}
        for sid in ids:
            try:
                v = t[t.Key(sid)]  # type: ignore[attr-defined,index]
            except KeyError:
                continue
            frames = []
            n = min(int(v.n), len(v.f))
            cut = int(getattr(v, "cut", 0)) != 0  # frames beyond the last one not read (AS_PY_DEPTH)
            for i in range(n):
                code, instr = int(v.f[i].code), int(v.f[i].instr)
                lasti = (instr - code - self.adaptive) // 2
                entry = (int(v.entry) >> i & 1) | (ENTRY_CUT if cut and i == n - 1 else 0)
                frames.append((code, lasti, entry, int(v.f[i].tag)))
            out[int(sid)] = (int(v.native), frames)
        return out

    def columns(self, seq: int, ids) -> tuple[dict[str, list], dict[str, list]]:
        """The `pyframes` and `pycode` columns of the stacks `ids` first seen in interval `seq`."""
        fr: dict[str, list] = {k: [] for k in ("stack_id", "idx", "code", "lasti", "entry")}
        co: dict[str, list] = {k: [] for k in ("seq", "code", "name", "qualname", "file", "firstlineno", "linetable")}
        if self.interp is None:
            return fr, co
        self.refresh()
        for sid, (_native, frames) in self.frames_of(ids).items():
            for i, (code, lasti, entry, tag) in enumerate(frames):
                key = code_key(code, tag)
                fr["stack_id"].append(sid)
                fr["idx"].append(i)
                fr["code"].append(key)
                fr["lasti"].append(lasti)
                fr["entry"].append(int(entry))
                c = self.code(code, tag)
                if c is not None and key not in self.written_codes:
                    self.written_codes.add(key)
                    for k, v in (
                        ("seq", seq),
                        ("code", key),
                        ("name", c.name),
                        ("qualname", c.qualname),
                        ("file", c.file),
                        ("firstlineno", c.firstlineno),
                        ("linetable", c.linetable),
                    ):
                        co[k].append(v)
        return fr, co

    def meta(self) -> dict | None:
        """meta.json `python`: the interpreter and its layout's source, None without one."""
        i = self.interp
        if i is None:
            return None
        return {"version": ".".join(str(v) for v in i.version if v >= 0), "path": i.path, "layout": i.source}

    def close(self) -> None:
        self.mem.close()


def layout_fields() -> list[str]:
    return [f.name for f in fields(Layout)]


def start_python(pid: int, probes, say: Callable[[str], None], maps: list[Mapping]) -> PythonFrames | None:
    """The recording's CPython frames (Recorder, before the attach, unless --no-python-frames):
    None when the program has no `pyconf` map (an older store) or /proc/PID/mem cannot be opened."""
    try:
        tables = probes.bpf
        tables[b"pyconf"]
        py = PythonFrames(pid, lambda name: tables[name.encode()], say)
    except (KeyError, OSError):
        return None
    py.update(maps)
    return py


def write_parts(py: PythonFrames, writer, seq: int, ids) -> tuple[dict, dict]:
    """The `pyframes` and `pycode` parts of the stacks `ids` first written in interval `seq`;
    their columns (for the live view: Snapshot.python)."""
    import pyarrow as pa  # noqa: PLC0415

    from common.tracefile import format as F  # noqa: PLC0415

    fr, co = py.columns(seq, ids)
    if fr["stack_id"]:
        writer.write_part("pyframes", seq, pa.table(fr, schema=F.SCHEMAS["pyframes"]))
    if co["code"]:
        writer.write_part("pycode", seq, pa.table(co, schema=F.SCHEMAS["pycode"]))
    return fr, co
