"""The probes compiled once, at `make setup` / `make bundle`, loaded on any kernel with BTF.

BCC compiles probes/allocscope.c with clang against kernel headers on every new box and for
every option variant (6-10 s each here, 11 s on the GPU box). Here the program is compiled once
per *variant* — what still changes the C: DWARF or frame-pointer unwinding, the kmem:rss_stat
program, which kernel offsets exist, the page size — into `probes/prebuilt/allocscope-bpf.json`,
and every recording loads from it:

* what depends on the recording or the kernel reaches the program as a load-time constant
  (probes/common.h AS_K: the target's pid, launch mode, the trap floor, --sample-bytes,
  --fault-sample, the nvidia-uvm major, every kernel-struct offset from the running kernel's
  BTF). The build gives each a marker value; the one `mov` of each marker is recorded and
  rewritten at load (the verifier sees the real value, as if compiled in). An instruction whose
  immediate is near a marker but is not that move fails the build: a folded constant is never
  shipped;
* map references (`ld_imm64 rX, MAP_FD`) are recorded by table name and rewritten with this
  run's map fds; the maps are created here through bpf(2) from the stored table signature
  (names, types, sizes, flags; the sizes that options set — SIZE_ONLY — from the options; the
  task-storage map's BTF written here), no compile at all;
* the tracepoint programs were compiled against the build box's tracefs formats: each format's
  fields are stored and compared with the running kernel's before use (a difference: not used).

Programs are loaded with BPF_PROG_LOAD and handed to BCC's Python as its own `Function`s; the
object `load()` returns is a `bcc.BPF` without a module, so tables, the ring buffer and the
attach calls of the rest of the tracer work unchanged. Where the store lacks the variant (a
kernel without BTF, an older kernel's raw tracepoint shape, a changed source) the tracer
compiles with BCC as before (tracer/bpf/cache.py); `allocscope doctor` says which applies.

Built by tracer/bpf/prebuilt_build.py (`python -m tracer.bpf.prebuilt_build [OUT]`; make setup does
it when probes/ changed).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import threading
from pathlib import Path

from ..base import layout as L
from .autoload import verify_and_attach
from .cache import BPF_LD_IMM64, INSN, SIZE_ONLY
from .source import bpf_text
from .syscall import MAP_TYPE_RINGBUF, create_map, load_prog

FORMAT = 3  # 2: the watch's gate beside the variants (`watch`); 3: the OOM victims' program (`oom`)
STORE = L.PROBES_DIR / "prebuilt" / "allocscope-bpf.json"
WATCH_SOURCE = L.PROBES_DIR / "watch.bpf.c"  # the night watch's exec gate (tracer/watch/gate.py)
OOM_SOURCE = L.PROBES_DIR / "oom.bpf.c"  # the OOM killer's victims (tracer/bpf/oom.py)
MARKER_BASE = 0x5A000000  # markers: MARKER_BASE + 0x100 * k, far above any offset, pid or size here
MARKER_SPAN = 0x01000000
# (unwind, rss_tracepoint): what the store holds, every option of the CLI loading from these
VARIANTS = (("dwarf", False), ("fp", False), ("dwarf", True), ("fp", True))
# Marker sizes for the maps sized by options: a table whose max_entries is one of them is sized
# by that option at load (the ring buffer: AS_RING_PAGES pages).
SIZE_MARKERS = {
    "AS_MAX_LIVE": 10007,
    "AS_MAX_STACKS": 10009,
    "AS_MAX_SITES": 10037,
    "AS_MAX_REGIONS": 10039,
    "AS_RING_PAGES": 64,
    "AS_UNWIND_ROWS": 10061,
}
TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


class NotPrebuilt(Exception):
    """The store cannot serve this recording (the reason is the message)."""


# --------------------------------------------------------------------------- keys


def source_digest() -> str:
    """What the store was built from: the programs' text and this loader's format."""
    text = b"format=%d\0" % FORMAT + bpf_text() + b"\0" + WATCH_SOURCE.read_bytes() + b"\0" + OOM_SOURCE.read_bytes()
    return hashlib.sha256(text).hexdigest()[:32]


def variant_key(flags: list[str], consts: dict[str, int]) -> str:
    """The compile-time flags (the map sizes without their values) and the names of the constants."""
    parts = []
    for f in flags:
        name = f[2:].partition("=")[0]
        parts.append(f"-D{name}=*" if name in SIZE_ONLY else f)
    return " ".join(sorted(parts)) + " | " + " ".join(sorted(consts))


def tracepoint_fields(category: str, name: str) -> str | None:
    """The field lines of a tracepoint's format (what BCC's args struct is made of), or None."""
    for root in TRACEFS:
        try:
            text = Path(root, "events", category, name, "format").read_text()
        except OSError:
            continue
        return "\n".join(line.strip() for line in text.splitlines() if line.strip().startswith("field:"))
    return None


def tracepoint_of(func: str) -> tuple[str, str] | None:
    if not func.startswith("tracepoint__"):
        return None
    cat, _, name = func[len("tracepoint__") :].partition("__")
    return cat, name


# --------------------------------------------------------------------------- the store at run time

_STORE: dict | None = None
_STORE_LOCK = threading.Lock()


def load_store(path: Path = STORE) -> dict:
    """The store (read once per process); NotPrebuilt when missing or built from other source."""
    global _STORE
    with _STORE_LOCK:
        if _STORE is None or path != STORE:
            try:
                store = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise NotPrebuilt(
                    f"no prebuilt programs ({path}: {getattr(e, 'strerror', None) or e}); run 'make setup'"
                ) from None
            if store.get("format") != FORMAT or store.get("source") != source_digest():
                raise NotPrebuilt(f"{path} was built from other probe sources; run 'make setup'")
            if path != STORE:
                return store
            _STORE = store
        return _STORE


def find(flags: list[str], consts: dict[str, int], store: dict | None = None) -> dict:
    """The store's entry for a recording's parameters (probe_config), its tracepoint formats
    checked against this kernel's; NotPrebuilt says why not."""
    store = store if store is not None else load_store()
    entry = store["variants"].get(variant_key(flags, consts))
    if entry is None:
        raise NotPrebuilt("no prebuilt variant for this kernel and these options (compiled here instead)")
    for name, value in consts.items():
        if not -(1 << 31) <= value < (1 << 31):
            raise NotPrebuilt(f"{name}={value} does not fit an instruction's immediate (compiled here instead)")
    check_formats(entry)
    return entry


def check_formats(entry: dict) -> None:
    """NotPrebuilt when a tracepoint of `entry` has other fields on this kernel than on the
    build box (BCC built the program's view of its arguments from the build box's format)."""
    for fname, fields in entry["formats"].items():
        tp = tracepoint_of(fname)
        assert tp is not None
        if tracepoint_fields(*tp) != fields:
            raise NotPrebuilt(f"tracepoint {tp[0]}:{tp[1]} differs from the build box's")


def load_watch(bcc):
    """The watch's exec gate from the store, its tracepoints attached (NotPrebuilt: compile it)."""
    return load_apart(bcc, "watch", "watch gate")


def load_apart(bcc, key: str, what: str):
    """A program of its own from the store (`watch`: the watch's exec gate, `oom`: the OOM
    victims'), its tracepoints attached (NotPrebuilt: compile it)."""
    if os.environ.get("ALLOCSCOPE_PREBUILT") == "0":
        raise NotPrebuilt("ALLOCSCOPE_PREBUILT=0")
    entry = load_store().get(key)
    if entry is None:
        raise NotPrebuilt(f"the store has no {what}; run 'make setup'")
    check_formats(entry)
    return load(bcc, entry, [], {})


def relocate(entry: dict, name: str, consts: dict[str, int], table_fd) -> bytes:
    """The instructions of `name` with this run's map fds and constants."""
    f = entry["funcs"][name]
    code = bytearray(base64.b64decode(f["code"]))
    for idx, table in f["maps"]:
        op, regs, off, _imm = INSN.unpack_from(code, idx * 8)
        INSN.pack_into(code, idx * 8, op, regs, off, table_fd(table))
    for idx, cname in f["consts"]:
        value = consts[cname]
        op, regs, off, _imm = INSN.unpack_from(code, idx * 8)
        if op == BPF_LD_IMM64:
            INSN.pack_into(code, idx * 8, op, regs, off, value & 0xFFFFFFFF)
            op2, regs2, off2, _ = INSN.unpack_from(code, idx * 8 + 8)
            INSN.pack_into(code, idx * 8 + 8, op2, regs2, off2, struct.unpack("<i", struct.pack("<I", value >> 32))[0])
        else:
            if not -(1 << 31) <= value < (1 << 31):
                raise NotPrebuilt(f"{cname}={value} does not fit the instruction's immediate")
            INSN.pack_into(code, idx * 8, op, regs, off, value)
    return bytes(code)


# --------------------------------------------------------------------------- the BCC object


class _Module:
    """What BCC's table classes ask a module for (bcc.table reads type, flags and max entries
    through libbcc): answered from the store's table signature by `_TableLib`."""

    def __init__(self, rows: list[list], sizes: dict[str, int]) -> None:
        self.rows = rows
        self.sizes = sizes


class _TableLib:
    """bcc.table's `lib`, answering the three questions its table classes ask a module for when
    the module is a _Module; every other call goes to libbcc unchanged."""

    def __init__(self, lib) -> None:
        self._lib = lib

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def bpf_table_type_id(self, module, map_id):
        return module.rows[map_id][1] if isinstance(module, _Module) else self._lib.bpf_table_type_id(module, map_id)

    def bpf_table_flags_id(self, module, map_id):
        return module.rows[map_id][5] if isinstance(module, _Module) else self._lib.bpf_table_flags_id(module, map_id)

    def bpf_table_max_entries_id(self, module, map_id):
        if isinstance(module, _Module):
            return module.sizes[module.rows[map_id][0]]
        return self._lib.bpf_table_max_entries_id(module, map_id)


def _install_table_lib(bcc) -> None:
    import bcc.table as bt  # noqa: PLC0415

    if not isinstance(bt.lib, _TableLib):
        bt.lib = _TableLib(bt.lib)


def table_sizes(entry: dict, flags: list[str]) -> dict[str, int]:
    """max_entries of every table: the build's, or the option's for the maps options size."""
    values = {}
    for f in flags:
        name, _, v = f[2:].partition("=")
        if name in SIZE_ONLY:
            values[name] = int(v)
    page = os.sysconf("SC_PAGE_SIZE")
    sizes = {}
    for row in entry["tables"]:
        size_flag = row[8]
        if size_flag is None:
            sizes[row[0]] = row[4]
        elif row[1] == MAP_TYPE_RINGBUF:
            sizes[row[0]] = values[size_flag] * page
        else:
            sizes[row[0]] = values[size_flag]
    return sizes


def load(bcc, entry: dict, flags: list[str], consts: dict[str, int], preload=(), skip_sys: bool = False):
    """A bcc.BPF of the store's `entry` for a recording: maps created, the tracepoint programs
    and those in `preload` loaded (verified in parallel), the tracepoints attached."""
    _install_table_lib(bcc)
    sizes = table_sizes(entry, flags)
    rows = entry["tables"]
    names = {row[0]: i for i, row in enumerate(rows)}

    class PrebuiltBPF(bcc.BPF):
        def __init__(self) -> None:  # bcc.BPF.__init__ without its compile
            import atexit  # noqa: PLC0415

            self.kprobe_fds: dict = {}
            self.uprobe_fds: dict = {}
            self.tracepoint_fds: dict = {}
            self.raw_tracepoint_fds: dict = {}
            self.kfunc_entry_fds: dict = {}
            self.kfunc_exit_fds: dict = {}
            self.lsm_fds: dict = {}
            self.perf_buffers: dict = {}
            self.open_perf_events: dict = {}
            self._ringbuf_manager = None
            self.tracefile = None
            self.debug = 0
            self.funcs: dict = {}
            self.tables: dict = {}
            self.module = None
            self.map_fds: dict[str, int] = {}
            self._lock = threading.Lock()
            atexit.register(self.cleanup)
            try:
                for row in rows:
                    self.map_fds[row[0]] = create_map(row, sizes[row[0]])
            except Exception:
                self.close()
                raise
            self.module = _Module(rows, sizes)

        def _trace_autoload(self) -> None:
            pass

        def get_table(self, name, keytype=None, leaftype=None, reducer=None):
            name_s = name.decode() if isinstance(name, bytes) else name
            if name_s not in names:
                raise KeyError(name)
            row = rows[names[name_s]]
            if keytype is None and row[6]:
                keytype = bcc.BPF._decode_table_type(json.loads(row[6]))
            if leaftype is None:
                leaftype = bcc.BPF._decode_table_type(json.loads(row[7]))
            return bcc.table.Table(
                self, names[name_s], self.map_fds[name_s], keytype, leaftype, name_s.encode(), reducer=reducer
            )

        def load_func(self, func_name, prog_type, device=None, attach_type=-1):
            func_name = func_name.encode() if isinstance(func_name, str) else func_name
            with self._lock:
                if func_name in self.funcs:
                    return self.funcs[func_name]
            fname = func_name.decode()
            if fname not in entry["funcs"]:
                raise Exception(f"Unknown program {func_name}")
            code = relocate(entry, fname, consts, lambda t: self.map_fds[t])
            fd = load_prog(fname, code, prog_type, entry["license"], attach_type)
            fn = bcc.BPF.Function(self, func_name, fd)
            with self._lock:
                if func_name in self.funcs:  # loaded meanwhile by another thread
                    os.close(fd)
                    return self.funcs[func_name]
                self.funcs[func_name] = fn
            return fn

        def close(self) -> None:
            for name, fn in list(self.funcs.items()):
                os.close(fn.fd)
                del self.funcs[name]
            for name, fd in list(getattr(self, "map_fds", {}).items()):
                os.close(fd)
                del self.map_fds[name]
            self.module = None

    bpf = PrebuiltBPF()
    try:
        # the verifier runs in the loading thread with the GIL released: up to four at a time
        # (two on two cores)
        verify_and_attach(bcc, bpf, entry["funcs"], preload, skip_sys, workers=max(2, min(4, os.cpu_count() or 2)))
    except BaseException:
        bpf.cleanup()
        raise
    return bpf
