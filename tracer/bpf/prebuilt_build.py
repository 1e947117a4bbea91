"""The prebuilt store (tracer/bpf/prebuilt.py, its format) built, at `make setup` / `make bundle`:
every variant of probes/allocscope.c (prebuilt.VARIANTS), the watch's exec gate and the OOM
victims' program compiled by BCC, each function's instructions kept with the places of its map
references and of its load-time constants' markers (an immediate near a marker that is not its
one `mov` fails the build), the tables' signature and the tracepoints' formats.

`python -m tracer.bpf.prebuilt_build [OUT]` (make setup does it when probes/ changed).
"""

from __future__ import annotations

import base64
import ctypes as ct
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..base import layout as L
from ..base.options import RecordOptions
from .cache import BPF_LD_IMM64, BPF_PSEUDO_MAP_FD, INSN
from .prebuilt import (
    FORMAT,
    MARKER_BASE,
    MARKER_SPAN,
    OOM_SOURCE,
    SIZE_MARKERS,
    STORE,
    VARIANTS,
    WATCH_SOURCE,
    NotPrebuilt,
    source_digest,
    tracepoint_fields,
    tracepoint_of,
    variant_key,
)
from .source import bpf_text, const_flags, probe_config
from .syscall import MAP_TYPE_RINGBUF

BPF_CALL, BPF_PSEUDO_KFUNC_CALL = 0x85, 2
MOV_IMM = (0xB7, 0xB4)  # BPF_ALU64|BPF_MOV|BPF_K, BPF_ALU|BPF_MOV|BPF_K


def _compile_variant(unwind: str, rss_tracepoint: bool) -> dict:
    """One variant compiled by BCC with marker values, as a store entry (raises when the
    instructions cannot be relocated)."""
    opts = RecordOptions()
    flags, consts = probe_config(opts, False, unwind, rss_tracepoint)
    sized = []
    for f in flags:
        name = f[2:].partition("=")[0]
        sized.append(f"-D{name}={SIZE_MARKERS[name]}" if name in SIZE_MARKERS else f)
    markers = {name: MARKER_BASE + 0x100 * (k + 1) for k, name in enumerate(sorted(consts))}
    cflags = [f"-I{L.PROBES_DIR}", f"-DAS_MAX_DEPTH={L.MAX_DEPTH}", "-Wno-macro-redefined", *sized]
    cflags += const_flags(markers)

    entry = _compile(bpf_text(), cflags, markers)
    return {"variant": variant_key(flags, consts), "unwind": unwind, "rss_tracepoint": rss_tracepoint, **entry}


def _compile_watch() -> dict:
    """The watch's exec gate (probes/watch.bpf.c): no constants, fixed sizes."""
    return {"variant": "watch", **_compile(WATCH_SOURCE.read_bytes(), [], {}, sized=False)}


def _compile_oom() -> dict:
    """The OOM victims' program (probes/oom.bpf.c), with the tracepoint's memory fields where the
    build box's kernel has them (a kernel whose format differs compiles its own, tracer/bpf/oom.py)."""
    rss = "anon_rss" in (tracepoint_fields("oom", "mark_victim") or "")
    return {"variant": "oom", **_compile(OOM_SOURCE.read_bytes(), ["-DAS_OOM_RSS"] if rss else [], {}, sized=False)}


def _compile(text: bytes, cflags: list[str], markers: dict[str, int], sized: bool = True) -> dict:
    """`text` compiled by BCC: each function's instructions with the places of its map
    references and marker constants, the tables' signature (`sized`: with the options that size
    them, SIZE_MARKERS), the tracepoints' formats."""
    import bcc  # noqa: PLC0415 (only the build needs it for compiling)

    from . import bcc_lean  # noqa: PLC0415
    from .cache import libbcc, table_signature  # noqa: PLC0415

    class Compiled(bcc.BPF):
        def _trace_autoload(self) -> None:
            pass  # nothing is loaded from this module

    with bcc_lean.light(bcc):
        mod = Compiled(text=text, cflags=cflags)
    try:
        lib = libbcc()
        module = mod.module
        n_tables = lib.as_bpf_num_tables(module)
        fds = {lib.as_bpf_table_fd_id(module, i): lib.as_bpf_table_name(module, i).decode() for i in range(n_tables)}
        by_marker = {v: k for k, v in markers.items()}
        funcs: dict[str, Any] = {}
        formats: dict[str, str] = {}
        for k in range(lib.as_bpf_num_functions(module)):
            fname = lib.as_bpf_function_name(module, k).decode()
            start, size = (
                lib.as_bpf_function_start(module, fname.encode()),
                lib.as_bpf_function_size(module, fname.encode()),
            )
            if not start or size % 8:
                raise NotPrebuilt(f"{fname}: no instructions")
            code = ct.string_at(start, size)
            maps, cref = [], []
            idx, n = 0, size // 8
            while idx < n:
                op, regs, _off, imm = INSN.unpack_from(code, idx * 8)
                src = regs >> 4
                if op == BPF_LD_IMM64:
                    hi = INSN.unpack_from(code, idx * 8 + 8)[3] if idx + 1 < n else 0
                    if src == BPF_PSEUDO_MAP_FD and imm in fds:
                        maps.append([idx, fds[imm]])
                    elif src != 0:
                        raise NotPrebuilt(f"{fname}: ld_imm64 src {src} at {idx}")
                    elif imm in by_marker and hi == 0:
                        cref.append([idx, by_marker[imm]])
                    elif MARKER_BASE <= imm < MARKER_BASE + MARKER_SPAN:
                        raise NotPrebuilt(f"{fname}: a folded constant at {idx} ({imm:#x})")
                    idx += 2
                    continue
                if op == BPF_CALL and src == BPF_PSEUDO_KFUNC_CALL:
                    raise NotPrebuilt(f"{fname}: a kfunc call at {idx}")
                if imm in by_marker and op in MOV_IMM:
                    cref.append([idx, by_marker[imm]])
                elif MARKER_BASE <= imm < MARKER_BASE + MARKER_SPAN:
                    raise NotPrebuilt(f"{fname}: a folded constant at {idx} ({imm:#x}, op {op:#x})")
                idx += 1
            funcs[fname] = {"code": base64.b64encode(code).decode(), "maps": maps, "consts": cref}
            tp = tracepoint_of(fname)
            if tp is not None:
                fields = tracepoint_fields(*tp)
                if fields is None:
                    raise NotPrebuilt(f"no tracefs format for {tp[0]}:{tp[1]}")
                formats[fname] = fields
        tables = table_signature(module)
        # a table whose size is a marker is sized by that option at load (none in the watch's)
        marker_sizes = {v: k for k, v in SIZE_MARKERS.items() if k != "AS_RING_PAGES"} if sized else {}
        ring_marker = SIZE_MARKERS["AS_RING_PAGES"] * os.sysconf("SC_PAGE_SIZE") if sized else -1
        for row in tables:
            if row[1] == MAP_TYPE_RINGBUF:
                row.append("AS_RING_PAGES" if row[4] == ring_marker else None)
            else:
                row.append(marker_sizes.get(row[4]))
        return {
            "license": (lib.as_bpf_module_license(module) or b"").decode(),
            "funcs": funcs,
            "tables": tables,
            "formats": formats,
        }
    finally:
        mod.cleanup()


def _compile_in_child(args) -> dict:
    if args == "watch":
        return _compile_watch()
    if args == "oom":
        return _compile_oom()
    return _compile_variant(*args)


def build(out: Path = STORE) -> dict:
    """Compile every variant (in a process each, two at a time at most per core) into `out`."""
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415
    from multiprocessing import get_context  # noqa: PLC0415

    workers = max(1, min(len(VARIANTS), os.cpu_count() or 1))
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        entries = list(pool.map(_compile_in_child, [*VARIANTS, "watch", "oom"]))
    oom, watch = entries.pop(), entries.pop()
    u = os.uname()
    store = {
        "format": FORMAT,
        "source": source_digest(),
        "built_on": f"{u.release} {u.machine}",
        "variants": {e["variant"]: e for e in entries},
        "watch": watch,
        "oom": oom,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(store))
    os.replace(tmp, out)
    return store


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else STORE
    import time  # noqa: PLC0415

    t = time.perf_counter()
    try:
        store = build(out)
    except Exception as e:  # noqa: BLE001 (NotPrebuilt, or BCC's bare Exception when clang fails)
        print(f"allocscope: prebuilt probes not built: {str(e).splitlines()[0] if str(e) else e!r}", file=sys.stderr)
        return 1
    size = out.stat().st_size
    print(
        f"allocscope: prebuilt probes: {len(store['variants'])} variants in {out} "
        f"({size // 1024} KiB, {time.perf_counter() - t:.1f} s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
