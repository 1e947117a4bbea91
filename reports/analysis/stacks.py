"""Frames and sites: symbolized stacks, the allocator and wrapper frames folded out of them,
and the location a folded stack belongs to.

A *site* is a symbolized call stack with allocator and allocator-wrapper frames folded away
(innermost first); the same code gives the same site in every run, whatever the addresses. A
*location* is the innermost frame of a site: the place in the code that asked for memory (see
`location_of`); the stacks that reach it are kept under it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import pandas as pd

from common.allocators import symbol_prefix_rx
from common.errors import UsageError
from common.tracefile.reader import Trace

# Frames folded out of a site (they stay in `full_frames`): allocator entry points and the
# wrappers languages put around them.
WRAPPER_PATTERNS = [
    r"^operator new",
    r"^operator delete",
    r"^__rust_alloc",
    r"^__rust_realloc",
    r"^__rust_alloc_zeroed",
    r"^__rdl_alloc",
    r"^__rdl_realloc",
    r"^__rg_alloc",
    r"^alloc::alloc::",
    r"^alloc::raw_vec::",
    r"^<alloc::alloc::Global as core::alloc::Allocator>",
    r"^std::allocator",
    r"^__gnu_cxx::new_allocator",
    r"^std::__new_allocator",
    r"^std::_Vector_base<.*>::_M_allocate",
    r"^std::allocator_traits",
    r"^(__libc_)?(malloc|calloc|realloc|reallocarray|free|posix_memalign|aligned_alloc|memalign|valloc|pvalloc)$",
    r"^(__)?(mmap|mmap64|munmap|mremap|brk|sbrk|__brk|__sbrk|madvise|syscall)$",
    r"^(strdup|strndup|__strdup|__strndup)$",
    # Rust's alloc crate (Vec, RawVec, Box, String, their trait impls) and C++ standard containers:
    # with DWARF unwinding and inlines their internals are on the stack; the caller is the site.
    r"^alloc::",
    r"^<alloc::",
    # rustc's allocator shims (1.8x+: `__rustc::__rust_alloc`...), a program's own #[global_allocator]
    # or Allocator impl (`<rustd::Jem as core::alloc::global::GlobalAlloc>::realloc`: it only forwards
    # to the allocator), and alloc's trait impls for other types (`vec![x; n]` is
    # `<u8 as alloc::vec::spec_from_elem::SpecFromElem>::from_elem`, `to_string`, `to_vec`...)
    r"^__rustc::",
    r"^<.* as core::alloc::(global::GlobalAlloc|Allocator)>::",
    r"^<.* as alloc::",
    # prefixed allocator entry points (jemalloc's je_/_rjem_, tcmalloc's tc_, mimalloc's mi_)
    (
        r"^(" + symbol_prefix_rx() + r")(malloc|calloc|realloc|free|mallocx|rallocx|xallocx|sdallocx|dallocx|nallocx|"
        r"posix_memalign|aligned_alloc|memalign|valloc|zalloc|zalloc_aligned|malloc_aligned|new|delete|"
        r"realloc_aligned|free_size)$"
    ),
    (
        r"^(void |\S+ )?std::(vector|_Vector_base|__cxx11::basic_string|basic_string|deque|_Deque_base|"
        r"__cxx11::list|list|_List_base|_Rb_tree|map|multimap|set|multiset|unordered_map|unordered_set|"
        r"_Hashtable|__detail::_Hashtable_alloc|__detail::_Map_base|__shared_count|__shared_ptr|shared_ptr|"
        r"make_shared|allocate_shared|unique_ptr|make_unique|__allocated_ptr)\b"
    ),
]

_WRAPPER_RX = re.compile("|".join(WRAPPER_PATTERNS))

from ..wrappers import APP_WRAPPERS, DEFAULT_FOLDING, NO_CALLER, USER_FOLD, Folding, parse_fold  # noqa: E402, F401 (their home: no pandas)


@dataclass(frozen=True)
class FrameInfo:
    function: str
    module: str
    file: str | None
    line: int | None
    # Inlined into the next (outer) frame, at the same address; not part of equality.
    inlined: bool = field(default=False, compare=False)
    # Only on the first frame of a site or location (fold_frames, group_of), part of its key: the
    # CUDA allocation call folded out of the stack (`call`: cudaMalloc — this frame called it);
    # the stripped module whose frames were inside this frame at the innermost end of the stack
    # (`inside`: the module's path — "inside libcuda.so.1, called from cuCtxCreate_v2").
    call: str | None = None
    inside: str | None = None

    def as_dict(self) -> dict:
        return {
            "function": self.function,
            "module": self.module,
            "file": self.file,
            "line": self.line,
            **located_extras(self),
        }


UNKNOWN_STACK = (FrameInfo("[stack lost]", "", None, None),)


def symbolize_stacks(trace: Trace, progress=None, python: bool = True) -> dict[int, tuple[FrameInfo, ...]]:
    """stack_id -> frames innermost first, every frame symbolized (offline, pyelftools). A frame
    whose address lies in inlined code expands to the inlined functions (`inlined=True`, innermost
    first) followed by the function they were inlined into. A stack with CPython frames (the
    trace's `pyframes`) has them merged where the eval loop stands (`merge_python`); `python`
    False (`report --no-python`) leaves them out: the native stacks as they were."""
    from ..symbolize import Symbolizer  # noqa: PLC0415
    from ..symbolize.embedded import load as embedded_symbols  # noqa: PLC0415

    if trace.stacks.empty:
        return {0: UNKNOWN_STACK}
    out = symbolize_stack_rows(trace.stacks, Symbolizer(progress=progress), lambda: embedded_symbols(trace))
    if python:
        out = with_python(out, trace)
    s = trace.sites
    cuda = s.loc[s["source"].isin(_CUDA_SOURCES), "stack_id"].unique() if not s.empty else ()
    return restore_cuda_calls(out, {int(x) for x in cuda})


def symbolize_stack_rows(
    st: pd.DataFrame,
    sym,
    embedded: Callable | None = None,
    resolved: dict[tuple[str, int], tuple[FrameInfo, ...]] | None = None,
) -> dict[int, tuple[FrameInfo, ...]]:
    """symbolize_stacks for rows of the `stacks` table (`st`), with the caller's `sym` (a
    reports.symbolize.Symbolizer: it keeps every module it parsed, so a caller that symbolizes
    stacks as they come — `allocscope top` — parses each ELF file once). `embedded`: returns the
    trace's embedded symbols (reports.symbolize.embedded), called only when a module file is missing.
    `resolved`: (module, offset) -> frames already looked up, kept by such a caller between
    calls (and filled here), so an address shared by many stacks is looked up once."""
    from ..symbolize import Frame, unknown_name  # noqa: PLC0415

    if st.empty:
        return {0: UNKNOWN_STACK}
    st = st.drop_duplicates(["stack_id", "idx"]).sort_values(["stack_id", "idx"])
    resolved = {} if resolved is None else resolved
    table = None  # the embedded symbols, read when needed
    todo = st[(st["offset"] >= 0) & st["function"].isna()]
    for (module, build_id), grp in todo.groupby(["module", "build_id"], sort=False, dropna=False):
        build_id = build_id if isinstance(build_id, str) else None
        offsets = sorted(o for o in {int(o) for o in grp["offset"]} if (module, o) not in resolved)
        if not offsets:
            continue
        res = sym.symbolize(module, offsets, build_id=build_id or None, return_addresses=True)
        for off in offsets:
            found = res.get(off) or []
            if found and found[-1].function == unknown_name(module, off):
                # not a call's return address: a signal handler returns to the first byte of
                # the trampoline (__restore_rt), whose ip - 1 is outside any function
                exact = sym.symbolize(module, [off], build_id=build_id or None, return_addresses=False)
                found = exact.get(off) or found
            if (not found or found[-1].function == unknown_name(module, off)) and embedded is not None:
                table = table if table is not None else embedded()  # module file missing
                name = table.lookup(build_id, module, off)
                found = [Frame(name, module, None, None, off)] if name else found
            resolved[(module, off)] = tuple(
                FrameInfo(f.function, module, f.file, f.line, inlined=f.inlined) for f in found
            ) or (FrameInfo(f"{os.path.basename(module)}+{off:#x}", module, None, None),)
    out: dict[int, tuple[FrameInfo, ...]] = {0: UNKNOWN_STACK}
    for sid, grp in st.groupby("stack_id", sort=False):
        frames = []
        for module, off, ip, fn, file, line in zip(
            grp["module"], grp["offset"], grp["ip"], grp["function"], grp["file"], grp["line"]
        ):
            if isinstance(fn, str):
                frames.append(
                    FrameInfo(fn, module, file if isinstance(file, str) else None, None if pd.isna(line) else int(line))
                )
            elif off >= 0:
                frames.extend(resolved[(module, int(off))])
            else:
                frames.append(FrameInfo(f"{module or '[anon]'}@{int(ip):#x}", module, None, None))
        out[int(sid)] = tuple(frames)
    return out


# --- CPython frames (docs/python.md) ---------------------------------------------------------

# The eval loop's C frame: each call of it ran a run of Python frames (3.11+: Python-to-Python
# calls stay in one call of it), the run that ends at a frame marked `entry`.
# (`_PyEval_EvalFrame`, inlined into its callers, is the call of it, not a run: it stays.)
EVAL_FUNCTIONS = frozenset({"_PyEval_EvalFrameDefault"})


def with_python(stacks: dict[int, tuple[FrameInfo, ...]], trace) -> dict[int, tuple[FrameInfo, ...]]:
    """`stacks` with the trace's CPython frames merged in (merge_python), changed in place."""
    return with_python_rows(
        stacks, getattr(trace, "pyframes", pd.DataFrame()), getattr(trace, "pycode", pd.DataFrame())
    )


def with_python_rows(
    stacks: dict[int, tuple[FrameInfo, ...]], pyframes: pd.DataFrame, pycode: pd.DataFrame
) -> dict[int, tuple[FrameInfo, ...]]:
    """with_python from rows of the `pyframes` and `pycode` tables (the live view's: `top`)."""
    from ..symbolize.python import python_frames  # noqa: PLC0415

    for sid, frames in python_frames(pyframes, pycode).items():
        if sid in stacks:
            stacks[sid] = merge_python(stacks[sid], frames)
    return stacks


def merge_python(native: tuple[FrameInfo, ...], py: list) -> tuple[FrameInfo, ...]:
    """A native stack with its Python frames (`py`: reports.symbolize.python.PyFrame, innermost
    first) in place of the eval loop's C frames: the k-th `_PyEval_EvalFrameDefault` from the
    innermost end stands for the k-th run of Python frames (a run ends at an `entry` frame).
    Runs left over (a native stack cut short) go at the outermost end; so do all of them when no
    eval frame is known (stripped). Python frames have module PY_MODULE."""
    from ..symbolize.python import PY_MODULE  # noqa: PLC0415

    runs: list[list[FrameInfo]] = [[]]
    for f in py:
        runs[-1].append(FrameInfo(f.function, PY_MODULE, f.file or None, f.line))
        if f.entry:
            runs.append([])
    runs = [r for r in runs if r]
    out: list[FrameInfo] = []
    k = 0
    for f in native:
        if f.function in EVAL_FUNCTIONS and k < len(runs):
            out.extend(runs[k])
            k += 1
        else:
            out.append(f)
    for r in runs[k:]:
        out.extend(r)
    return tuple(out)


def is_python(f: FrameInfo) -> bool:
    return f.module == "python"  # reports.symbolize.python.PY_MODULE


_PREFIX_RX = re.compile(r"^(__GI_|__libc_|__)+")


def is_wrapper(function: str) -> bool:
    """An allocator entry point, syscall wrapper or language allocation shim."""
    return bool(_WRAPPER_RX.search(function) or _WRAPPER_RX.search(_PREFIX_RX.sub("", function)))


_ENTRY_RX = re.compile(
    r"^(malloc|calloc|realloc|reallocarray|free|posix_memalign|aligned_alloc|memalign|"
    r"valloc|pvalloc|malloc_trim|mmap|mmap64|munmap|mremap|brk|sbrk|madvise)$"
)


def is_allocator_entry(function: str) -> bool:
    """An allocator's public entry point or a libc memory syscall wrapper (after glibc's
    __GI_/__libc_ prefixes): the frames inside one of these are the allocator's internals."""
    return bool(_ENTRY_RX.match(_PREFIX_RX.sub("", function)))


# The --inject agent's file (tracer/inject/agent.py AGENT_NAME): its hooks stand in for the
# allocator entry points they hooked. A DWARF stack starts at a hook's caller; a frame-pointer
# one (--unwind fp) holds the hook's frames too (`as_h_calloc`, `call_sampled`).
AGENT_MODULE = "allocscope-agent.so"


def is_agent_frame(f: FrameInfo) -> bool:
    return os.path.basename(f.module or "") == AGENT_MODULE


# The CUDA runtime's and driver's allocation calls (and their frees): allocator entry points like
# malloc. The runtime and the driver are stripped in the vendor's builds: the frames inside a call
# are `libcudart.so.13+0x41b5e`, `libcuda.so.580.159.04+0x…`, with whatever the driver called
# (its mallocs, its mmaps) inside them.
_CUDA_ENTRY_RX = re.compile(
    r"^(cudaMalloc\w*|cudaHostAlloc|cudaHostRegister|cudaFree\w*|cudaHostUnregister|"
    r"cuMemAlloc\w*|cuMemHostAlloc|cuMemHostRegister\w*|cuMemHostUnregister|cuMemCreate|cuMemMap|"
    r"cuMemAddressReserve|cuMemFree\w*|cuMemRelease|cuMemUnmap|cuMemAddressFree|cuArrayCreate\w*|"
    r"cuArray3DCreate\w*|cuMipmappedArrayCreate)$"
)
# the modules of the CUDA runtime and driver (a call's internals may cross from one to the other)
_CUDA_MODULE_RX = re.compile(r"^lib(cudart|cuda|nvidia-[\w-]+)\.so")


def _in_cuda(g: FrameInfo, entry: FrameInfo) -> bool:
    """Frame `g`, inside the CUDA call `entry`, is the runtime's or the driver's: of the call's own
    module (a runtime linked statically), of a CUDA library, or an allocator's entry or wrapper
    (the driver's own mallocs)."""
    return (
        g.module == entry.module
        or is_wrapper(g.function)
        or bool(_CUDA_MODULE_RX.match(os.path.basename(g.module or "")))
    )


_CUDA_FREE_RX = re.compile(r"Free|Release|Unregister|Unmap")  # the calls that give CUDA memory back
_CUDA_SOURCES = ("cuda-device", "cuda-pinned", "cuda-managed")  # sources.CUDA_SOURCES (no import: a cycle)


def restore_cuda_calls(stacks: dict[int, tuple[FrameInfo, ...]], cuda_ids: Iterable[int]) -> dict[int, tuple]:
    """The CUDA call's own frame put back on the stacks of its allocations (`cuda_ids`: stacks of
    CUDA memory, taken at the call's return, so the call is not on them): a stack of the
    driver's own host mallocs inside that call holds the call's frame (`cuMemAlloc_v2`, a
    .dynsym name) followed by exactly the frames of the CUDA memory's stack — the same return
    addresses — so the call is known, and the CUDA memory and the driver's mallocs inside the
    call fold to one site (`device_weights via cuMemAlloc_v2`), not two. A stack matched by two
    different calls (two calls on one source line) is left as it is. Returns `stacks` (changed
    in place)."""
    want: dict[tuple[FrameInfo, ...], list[int]] = {}  # stacks of one symbolized shape: several ids
    for i in cuda_ids:
        st = stacks.get(i)
        if st and not any(g.function.startswith("cu") and _CUDA_ENTRY_RX.match(g.function) for g in st):
            want.setdefault(st, []).append(i)
    if not want:
        return stacks
    found: dict[tuple[FrameInfo, ...], set[tuple[str, str]]] = {}
    for frames in stacks.values():
        for j, f in enumerate(frames[:-1]):
            if (
                f.function.startswith("cu")
                and _CUDA_ENTRY_RX.match(f.function)
                and not _CUDA_FREE_RX.search(f.function)
            ):
                tail = frames[j + 1 :]
                if tail in want:
                    found.setdefault(tail, set()).add((f.function, f.module))
    for tail, calls in found.items():
        if len({fn for fn, _ in calls}) == 1:
            fn, module = min(calls)
            for d in want[tail]:
                stacks[d] = (FrameInfo(fn, module, None, None), *tail)
    return stacks


def fold_frames(frames: tuple[FrameInfo, ...], fold: Folding | None = None) -> tuple[FrameInfo, ...]:
    """Drop the innermost frames that belong to the allocator: its internals (sysmalloc,
    _int_malloc... — frames of the same module inside an allocator entry point), the entry
    point itself (malloc, libc's mmap wrapper...), and the wrappers right around it: language
    ones (operator new, __rust_alloc, alloc::raw_vec::*, std::vector internals...) and the
    application wrappers of `fold` (built-in: zmalloc, PyObject_Malloc, g_malloc...; plus the
    user's --fold). Only an exact entry-point name swallows the frames inside it, and wrappers
    fold only as an unbroken run from the allocator's side, so a wrapper-looking frame far up
    a statically linked program (one module) never folds the program away. At least the
    outermost frame is kept.

    A CUDA allocation call (_CUDA_ENTRY_RX: cudaMalloc, cuMemAlloc_v2...) is an entry point too:
    it swallows the runtime's and driver's frames inside it (of its module or a CUDA library,
    stripped or not, with the allocator calls they made), and the site's first frame — its
    caller — names the outermost such call (`FrameInfo.call`), so the same code is one site
    per call it makes."""
    fold = fold or DEFAULT_FOLDING
    cut, call = 0, None
    for j, f in enumerate(frames[:-1]):
        if is_allocator_entry(f.function) or is_agent_frame(f):
            if all(g.module == f.module or is_wrapper(g.function) for g in frames[:j]):
                cut, call = j + 1, None
        elif (
            f.function.startswith("cu")
            and _CUDA_ENTRY_RX.match(f.function)
            and all(_in_cuda(g, f) for g in frames[cut:j])
        ):
            cut, call = j + 1, f.function
    while cut < len(frames) - 1 and (is_wrapper(frames[cut].function) or fold.match(frames[cut].function)):
        cut += 1
    site = frames[cut:]
    return (replace(site[0], call=call), *site[1:]) if call else site


def folded_wrappers(stacks: Iterable[tuple[FrameInfo, ...]], fold: Folding | None = None) -> list[dict]:
    """What the application-wrapper patterns folded out of these stacks (full frames, e.g.
    `symbolize_stacks(...).values()`), for the report's
    `folded`: one entry per pattern that folded a frame, and per user pattern even when it
    folded none — {"pattern", "from" (library of a built-in, or '--fold'), "functions" (the
    names it folded, sorted)}, built-ins in APP_WRAPPERS order, then the user's."""
    fold = fold or DEFAULT_FOLDING
    hits: dict[tuple[str, str], set[str]] = {(USER_FOLD, p): set() for p in fold.user}
    seen: set[tuple[FrameInfo, ...]] = set()
    for frames in stacks:
        if frames in seen:
            continue
        seen.add(frames)
        for f in frames[: len(frames) - len(fold_frames(frames, fold))]:
            m = None if is_wrapper(f.function) else fold.match(f.function)
            if m is not None:
                hits.setdefault(m, set()).add(f.function)
    return [
        {"pattern": p, "from": src, "functions": sorted(hits[(src, p)])} for src, p in fold.patterns if (src, p) in hits
    ]


SiteKey = tuple[FrameInfo, ...]


def frame_key_text(site: SiteKey) -> str:
    """A stable one-line text of a site, for deterministic tie-breaking and messages."""
    return " < ".join(f"{f.function}@{os.path.basename(f.file or '')}:{f.line or ''}" for f in site)


# --- locations -------------------------------------------------------------------------------

GROUPINGS = ("location", "function", "stack")  # what a people-facing table's rows are (--by)
_UNKNOWN_RX = re.compile(r"(\+0x[0-9a-f]+|@0x[0-9a-f]+)$")


def key_quality(frame: FrameInfo) -> str:
    """How precise a location key built on `frame` is: ``line`` (function and file:line),
    ``function`` (a symbol without line information: every call site in that function is one
    location), ``address`` (no symbol: `module+0xOFFSET`, one location per return address, so
    unrelated code is never merged — but a function reached at two addresses is two
    locations), ``inside`` (a stripped module's frames under the innermost frame with a
    symbol that called into them, `FrameInfo.inside`: one location per module and caller)."""
    if frame.inside:
        return "inside"
    if frame.function.startswith("[") or _UNKNOWN_RX.search(frame.function):
        return "address"
    return "line" if frame.file and frame.line else "function"


_NO_SYMBOL_RX = re.compile(r"\+0x[0-9a-f]+$")  # a frame of a module file without a symbol there
_SHARED_LIB_RX = re.compile(r"\.so(\.|$)")  # libcuda.so.1, libfoo.so, x.cpython-312-x86_64-linux-gnu.so


def located(site: SiteKey) -> FrameInfo:
    """The frame a folded stack's location is keyed on: its innermost frame — or, when that is a
    frame of a module without a symbol there (a stripped vendor library: `libcuda.so.1+0x1f2e0`),
    the innermost frame that has one, with the stripped module said (`inside`: its path): the
    stripped frames stay under the code that called into them, never merged with other code
    (the key is that frame's own), and never one location per return address.

    That frame must be the stripped module's own (an exported call: cuCtxCreate_v2), or the
    stripped module a shared library (its threads: under start_thread). The CUDA driver's and
    runtime's stripped frames with no symbol anywhere outside them (a stack cut short inside
    the driver) are one location for the library (`NO_CALLER`: "inside libcuda.so.1, no caller
    with a symbol"): their bare return addresses never stand alone as locations; another
    library's keep one location per address (unrelated code never merged). A stripped executable's
    frames under libc's __libc_start_call_main or start_thread would be the whole program in one
    row: they keep their addresses, as a stack without any symbol does."""
    f = site[0] if site else UNKNOWN_STACK[0]
    for g in site:  # through Python: the innermost Python line, what the native frames did under it
        if is_python(g):
            return replace(g, call=f.call) if f.call else g
    if f.module and not f.inside and _NO_SYMBOL_RX.search(f.function):
        shared = bool(_SHARED_LIB_RX.search(os.path.basename(f.module)))
        for g in site[1:]:
            if key_quality(g) != "address":
                if g.module == f.module or shared:
                    return FrameInfo(
                        g.function, g.module, g.file, g.line, inlined=g.inlined, call=f.call, inside=f.module
                    )
                break
        else:
            if _CUDA_MODULE_RX.match(os.path.basename(f.module)):  # no symbol anywhere: the driver's one row
                return FrameInfo(NO_CALLER, f.module, None, None, call=f.call, inside=f.module)
    return f


def group_of(site: SiteKey, by: str = "location") -> SiteKey:
    """The row a folded stack (`site`) belongs to in a table grouped `by`:

    - ``stack``: the folded stack itself (every distinct stack is a row);
    - ``location``: its innermost frame (`located`: a stripped module's frames under the code
      that called into them) — function, module, file and line (inlined frames resolved: an
      inlined callee's own line when the allocation is inside inlined code), the CUDA call it
      made (fold_frames) — the place in the code that asked for memory, whatever the path that
      reached it;
    - ``function``: that frame's function and module (the lines of one function merged).

    Returned as a frames tuple (one frame for location and function), so every table and
    renderer takes sites and locations alike."""
    if by == "stack":
        return site
    f = located(site)
    if by == "location":
        return (FrameInfo(f.function, f.module, f.file, f.line, inlined=f.inlined, call=f.call, inside=f.inside),)
    if by == "function":
        return (FrameInfo(f.function, f.module, None, None, call=f.call, inside=f.inside),)
    raise UsageError(f"unknown grouping {by!r}; choose one of {', '.join(GROUPINGS)}")


def located_extras(f: FrameInfo) -> dict:
    """The keys a location's (or a frame's) dict has beyond function, module, file and line:
    `call` and `inside` (FrameInfo), each when it has one."""
    return {k: v for k, v in (("call", f.call), ("inside", f.inside)) if v}


def location_key(group: SiteKey) -> str:
    """A stable one-line key of a location or function row (`group_of`): the same code gives
    the same key in every run and build directory — `function|module basename|file
    basename:line`, then `|call=CALL` when it names a CUDA call and `|inside=MODULE basename`
    when it holds a stripped module's frames."""
    f = group[0] if group else UNKNOWN_STACK[0]
    where = f"{os.path.basename(f.file)}:{f.line or ''}" if f.file else ""
    key = f"{f.function}|{os.path.basename(f.module or '')}|{where}"
    if f.call:
        key += f"|call={f.call}"
    if f.inside:
        key += f"|inside={os.path.basename(f.inside)}"
    return key


def collapse_recursion(frames: tuple[FrameInfo, ...] | list, max_run: int = 8) -> list[tuple[list, int]]:
    """Frames with recursion collapsed, for showing a stack: a run of frames repeated back to
    back (f < g < f < g < ...) becomes one entry ([f, g], N). Greedy from the innermost frame,
    at each point the run (of at most `max_run` frames) covering most frames wins; frames not
    in a repeat come as ([frame], 1)."""
    frames = list(frames)
    out: list[tuple[list, int]] = []
    i, n = 0, len(frames)
    while i < n:
        best_len, best_reps = 1, 1
        for size in range(1, min(max_run, (n - i) // 2) + 1):
            reps = 1
            while frames[i + reps * size : i + (reps + 1) * size] == frames[i : i + size]:
                reps += 1
            if reps > 1 and size * reps > best_len * best_reps:
                best_len, best_reps = size, reps
        out.append((frames[i : i + best_len], best_reps))
        i += best_len * best_reps
    return out
