"""A cache of the compiled BPF programs, so a recording does not wait for clang.

BCC compiles probes/allocscope.c through clang and LLVM on every start (~4 s of CPU on this
project's machine: codegen of the program, not header parsing). Its Python `BPF()` has no way to
load a precompiled object, so the cache keeps, per compiled variant, what BCC would hand to the
kernel — each function's instructions, exactly as `bpf_function_start/size` return them — with
the two things that differ between runs taken out:

* map references: `ld_imm64 rX, MAP_FD` (src_reg BPF_PSEUDO_MAP_FD) hold this process's map fds;
  the cache records the table each one names and rewrites it with the new run's fd;
* the target's pid (AS_TGID): the program is compiled with a sentinel pid no process can have
  (above PID_MAX_LIMIT); every instruction whose immediate is the sentinel is rewritten with
  the real pid. Immediates next to the sentinel (sentinel +- 1) would mean LLVM folded the
  comparison into something else: such a compile is never cached.

On a hit the maps are still created by BCC, from the same source with its function
definitions removed (`maps_only`): a compile of declarations only, ~10x cheaper, giving the
same tables (names, types, sizes, flags; checked against the full compile when the entry is
made) and the BTF the task-storage maps need. Programs are then loaded from the cached
instructions through libbcc's own `bcc_func_load`, as BCC's `load_func` does.

The key is a digest of the source text, the cflags (the pid replaced by the sentinel, the
map sizes — SIZE_ONLY — by `*`), the kernel's release and build, and BCC's version: any other
change compiles afresh. The cache lives in
`$ALLOCSCOPE_CACHE_DIR/bpf` or `~/.cache/allocscope/bpf`; `ALLOCSCOPE_BPF_CACHE=0` turns it off.

This module does not import bcc (tracer/bpf/program.py does and passes it in).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import struct

from ..base.cachedir import cache_dir, read_private, write_private

CACHE_FORMAT = 1
TGID_SENTINEL = 0x7A110C5D  # > PID_MAX_LIMIT (4194304): no process has it
BPF_LD_IMM64 = 0x18
BPF_PSEUDO_MAP_FD = 1
AUTOLOADED = (b"kprobe__", b"kretprobe__", b"tracepoint__", b"raw_tracepoint__", b"kfunc__", b"kretfunc__", b"lsm__")
INSN = struct.Struct("<BBhi")  # code, dst:4|src:4, off, imm


_LIB = None


def libbcc():
    """libbcc's module-inspection calls, declared here (not through BCC's shared `lib`, whose
    declarations other code relies on)."""
    global _LIB
    if _LIB is None:
        import ctypes as ct  # noqa: PLC0415

        lib = ct.CDLL("libbcc.so.0", use_errno=True)
        vp, sz, cp = ct.c_void_p, ct.c_size_t, ct.c_char_p
        for name, res, args in [
            ("bpf_num_tables", sz, [vp]),
            ("bpf_table_name", cp, [vp, sz]),
            ("bpf_table_fd_id", ct.c_int, [vp, sz]),
            ("bpf_table_fd", ct.c_int, [vp, cp]),
            ("bpf_table_type_id", ct.c_int, [vp, sz]),
            ("bpf_table_key_size_id", sz, [vp, sz]),
            ("bpf_table_leaf_size_id", sz, [vp, sz]),
            ("bpf_table_max_entries_id", sz, [vp, sz]),
            ("bpf_table_flags_id", ct.c_int, [vp, sz]),
            ("bpf_table_key_desc_id", cp, [vp, sz]),
            ("bpf_table_leaf_desc_id", cp, [vp, sz]),
            ("bpf_num_functions", sz, [vp]),
            ("bpf_function_name", cp, [vp, sz]),
            ("bpf_function_start", vp, [vp, cp]),
            ("bpf_function_size", sz, [vp, cp]),
            ("bpf_module_license", cp, [vp]),
            ("bpf_module_kern_version", ct.c_uint, [vp]),
            (
                "bcc_func_load",
                ct.c_int,
                [vp, ct.c_int, cp, vp, sz, cp, ct.c_uint, ct.c_int, cp, ct.c_uint, cp, ct.c_int],
            ),
        ]:
            f = lib[name]  # a fresh function object: BCC's own declarations are left alone
            f.restype, f.argtypes = res, args
            setattr(lib, "as_" + name, f)
        _LIB = lib
    return _LIB


# Compile-time parameters that only size maps (BPF_*(..., SIZE) declarations in probes/): the
# instructions do not depend on them, so one cached compile serves every value; the maps are made
# from the maps-only source with the real values. tests/test_bpfcache.py checks that probes/ uses
# them nowhere else.
SIZE_ONLY = ("AS_MAX_LIVE", "AS_MAX_STACKS", "AS_MAX_SITES", "AS_MAX_REGIONS", "AS_RING_PAGES", "AS_UNWIND_ROWS")
_SIZE_FLAG = re.compile(r"^-D(" + "|".join(SIZE_ONLY) + r")=.*$")
MAX_ENTRIES = 4  # index of max entries in a table_signature row


def key_flags(cflags: list[str]) -> list[str]:
    """`cflags` as the cache key sees them: the size-only parameters without their values."""
    return [_SIZE_FLAG.sub(r"-D\1=*", f) for f in cflags]


def same_tables(a: list[list], b: list[list]) -> bool:
    """Two table signatures equal but for the maps' sizes (SIZE_ONLY)."""

    def strip(sig):
        return [[v for i, v in enumerate(row) if i != MAX_ENTRIES] for row in sig]

    return strip(a) == strip(b)


def cache_key(text: bytes, cflags: list[str], bcc_version: str) -> str:
    u = os.uname()
    h = hashlib.sha256()
    for part in (
        f"format={CACHE_FORMAT}",
        f"kernel={u.release} {u.version} {u.machine}",
        f"bcc={bcc_version}",
        *key_flags(cflags),
    ):
        h.update(part.encode() + b"\0")
    h.update(text)
    return h.hexdigest()[:40]


# --------------------------------------------------------------------------- the maps-only source

_TYPE_DEF = re.compile(r"^\s*(typedef\s+)?(struct|union|enum)\b")


def _skip(s: str, i: int) -> int | None:
    """Where the comment or string/character literal starting at s[i] ends (the index after
    it, len(s) when unterminated); None when none starts there."""
    n = len(s)
    if s.startswith("//", i):
        j = s.find("\n", i)
        return n if j < 0 else j
    if s.startswith("/*", i):
        j = s.find("*/", i + 2)
        return n if j < 0 else j + 2
    if s[i] in "\"'":
        j = i + 1
        while j < n and s[j] != s[i]:
            j += 2 if s[j] == "\\" else 1
        return min(j + 1, n)
    return None


def maps_only(text: bytes) -> bytes:
    """`text` without its top-level function definitions (TRACEPOINT_PROBE(...) { ... } included):
    preprocessor lines, declarations, type definitions and the BPF_* map declarations stay.
    A small scanner of C's top level: comments, strings and character literals are skipped, a
    `{` at depth 0 opens a function body when the text since the previous top-level item has a
    `(` and is not a struct/union/enum definition; the body is dropped with its header."""
    s = text.decode()
    out: list[str] = []
    i, n = 0, len(s)
    item = 0  # where the current top-level item began (in s)
    kept = 0  # s[kept:item] is already decided
    depth = 0
    code_since_item: list[str] = []  # the item's text without comments (to classify it)

    while i < n:
        c = s[i]
        j = _skip(s, i)
        if j is not None:  # a comment (dropped from the classification) or a literal (kept)
            if c in "\"'":
                code_since_item.append(s[i:j])
            i = j
            continue
        if c == "#" and depth == 0 and (i == 0 or s[s.rfind("\n", 0, i) + 1 : i].strip() == ""):
            # a preprocessor line (with its continuations): kept as it is, ends the item
            j = i
            while True:
                e = s.find("\n", j)
                if e < 0:
                    e = n
                    break
                if s[e - 1] == "\\":
                    j = e + 1
                    continue
                break
            i = e
            item = i
            code_since_item = []
            continue
        if depth == 0:
            if c == ";":
                i += 1
                item = i
                code_since_item = []
                continue
            if c == "{":
                head = "".join(code_since_item)
                if "(" in head and not _TYPE_DEF.match(head) and "=" not in head:
                    # a function definition: drop from the item's start to the matching brace
                    j, d = i, 0
                    while j < n:
                        k = _skip(s, j)
                        if k is not None:
                            j = k
                            continue
                        if s[j] == "{":
                            d += 1
                        elif s[j] == "}":
                            d -= 1
                            if d == 0:
                                break
                        j += 1
                    start = item
                    while start < i and s[start] in " \t\r\n":
                        start += 1
                    out.append(s[kept:start])
                    out.append("\n")
                    i = j + 1
                    kept = item = i
                    code_since_item = []
                    continue
                depth = 1
                i += 1
                continue
            code_since_item.append(c)
            i += 1
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        i += 1
    out.append(s[kept:])
    # linux/sched.h is there for the bodies (struct task_struct): half of what is left to parse
    text_out = "".join(out).replace("#include <linux/sched.h>", "struct task_struct; /* maps only */")
    # BCC gives a map its BTF key and value types only when code uses the map: task storage
    # cannot be created without them. One tiny function (never loaded) right after each
    # task-storage declaration, so it sits in the same #if branch.
    text_out = re.sub(
        r"^([ \t]*BPF_TASK_STORAGE\((\w+),[^;]*\);)",
        r"\1 int as_maps_only_\2(struct pt_regs *ctx) { return \2.task_storage_get("
        r"(struct task_struct *)bpf_get_current_task_btf(), 0, 0) != 0; }",
        text_out,
        flags=re.M,
    )
    return text_out.encode()


# --------------------------------------------------------------------------- entries


def table_signature(module) -> list[list]:
    """What identifies the module's tables: name, type, key and leaf sizes, max entries, flags,
    key and leaf descriptions (BCC's JSON), in the module's order."""
    lib = libbcc()
    sig = []
    for i in range(lib.as_bpf_num_tables(module)):
        name = lib.as_bpf_table_name(module, i)
        sig.append(
            [
                name.decode(),
                lib.as_bpf_table_type_id(module, i),
                lib.as_bpf_table_key_size_id(module, i),
                lib.as_bpf_table_leaf_size_id(module, i),
                lib.as_bpf_table_max_entries_id(module, i),
                lib.as_bpf_table_flags_id(module, i),
                (lib.as_bpf_table_key_desc_id(module, i) or b"").decode(),
                (lib.as_bpf_table_leaf_desc_id(module, i) or b"").decode(),
            ]
        )
    return sig


def extract(module) -> dict | None:
    """The cache entry of a module compiled with AS_TGID = TGID_SENTINEL (its maps created, its
    functions not necessarily loaded); None when an instruction cannot be relocated."""
    lib = libbcc()
    fds = {
        lib.as_bpf_table_fd_id(module, i): lib.as_bpf_table_name(module, i).decode()
        for i in range(lib.as_bpf_num_tables(module))
    }
    funcs = {}
    for k in range(lib.as_bpf_num_functions(module)):
        name = lib.as_bpf_function_name(module, k)
        if name.startswith(AUTOLOADED) and not name.startswith((b"tracepoint__", b"raw_tracepoint__")):
            return None  # BCC would attach it at load: only tracepoints are attached from the cache
        start, size = lib.as_bpf_function_start(module, name), lib.as_bpf_function_size(module, name)
        if not start or size % 8:
            return None
        code = _read(start, size)
        maps, tgid = [], []
        for idx in range(size // 8):
            op, regs, _off, imm = INSN.unpack_from(code, idx * 8)
            if op == BPF_LD_IMM64 and (regs >> 4) != 0:
                if (regs >> 4) != BPF_PSEUDO_MAP_FD or imm not in fds:
                    return None  # a map value or an fd we cannot name: not cacheable
                maps.append([idx, fds[imm]])
            elif imm == TGID_SENTINEL:
                tgid.append(idx)
            elif imm in (TGID_SENTINEL - 1, TGID_SENTINEL + 1):
                return None  # the pid folded into another constant: not cacheable
        funcs[name.decode()] = {"code": base64.b64encode(code).decode(), "maps": maps, "tgid": tgid}
    if not any(f["tgid"] for f in funcs.values()):
        return None
    return {
        "format": CACHE_FORMAT,
        "license": (lib.as_bpf_module_license(module) or b"").decode(),
        "kern_version": lib.as_bpf_module_kern_version(module),
        "funcs": funcs,
        "tables": table_signature(module),
    }


def _read(addr: int, size: int) -> bytes:
    import ctypes  # noqa: PLC0415

    return ctypes.string_at(addr, size)


def relocate(entry: dict, name: str, pid: int, table_fd) -> bytes:
    """The instructions of function `name` for this run: map fds (`table_fd(name)`) and pid."""
    f = entry["funcs"][name]
    code = bytearray(base64.b64decode(f["code"]))
    for idx, table in f["maps"]:
        op, regs, off, _imm = INSN.unpack_from(code, idx * 8)
        INSN.pack_into(code, idx * 8, op, regs, off, table_fd(table))
    for idx in f["tgid"]:
        op, regs, off, _imm = INSN.unpack_from(code, idx * 8)
        INSN.pack_into(code, idx * 8, op, regs, off, pid)
    return bytes(code)


def load(key: str) -> dict | None:
    entry = read_private(cache_dir("bpf") / f"{key}.json")
    return entry if isinstance(entry, dict) and entry.get("format") == CACHE_FORMAT else None


def save(key: str, entry: dict) -> None:
    write_private(cache_dir("bpf"), f"{key}.json", json.dumps(entry))
