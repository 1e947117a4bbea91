"""CPython's interpreter layouts (docs/python.md): the offsets the frame walk (probes/python.h)
and the readers of tracer/runtimes/python.py need, per minor version, taken with offsetof()
against each version's own internal headers (tests/targets/python/offsets.c; pyenv's 3.11.7,
3.12.1, 3.13.0 and Debian's 3.11.2 agree within a minor version, tests/test_python_layout.py),
and 3.13's own `_Py_DebugOffsets` read from the start of `_PyRuntime` when present."""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Layout:
    """Offsets (bytes) into CPython's structures; -1 where the version has no such field."""

    runtime_interpreters_head: int
    interp_next: int
    interp_threads_head: int
    tstate_next: int
    tstate_native_thread_id: int
    tstate_current_frame: int  # -> current frame (3.13) or -> cframe (3.11, 3.12)
    cframe_current_frame: int
    frame_code: int
    frame_instr: int
    frame_previous: int
    frame_owner: int
    frame_is_entry: int
    owner_cstack: int
    code_filename: int
    code_name: int
    code_qualname: int
    code_firstlineno: int
    code_linetable: int
    code_adaptive: int
    bytes_size: int
    bytes_sval: int
    unicode_length: int
    unicode_state: int
    unicode_ascii_data: int  # sizeof(PyASCIIObject)
    unicode_compact_data: int  # sizeof(PyCompactUnicodeObject)
    # the main thread's PyThreadState, allocated inside _PyRuntime (3.11+): known before the
    # interpreter runs (launch mode), so its first frames are walked before any thread walk
    runtime_main_interp: int = -1  # _PyRuntime._main_interpreter
    interp_initial_thread: int = -1  # PyInterpreterState._initial_thread


# offsetof() against each version's headers (Py_BUILD_CORE; tests/test_python_layout.py).
LAYOUTS: dict[tuple[int, int], Layout] = {
    (3, 11): Layout(
        40,
        0,
        16,
        8,
        160,
        56,
        8,
        32,
        56,
        48,
        69,
        68,
        -1,
        112,
        120,
        128,
        72,
        136,
        184,
        16,
        32,
        16,
        32,
        48,
        72,
        58936,
        107392,
    ),
    (3, 12): Layout(
        40,
        0,
        72,
        8,
        144,
        56,
        0,
        0,
        56,
        8,
        70,
        -1,
        3,
        112,
        120,
        128,
        68,
        136,
        192,
        16,
        32,
        16,
        32,
        40,
        56,
        76392,
        383264,
    ),
    (3, 13): Layout(
        632,
        7264,
        7344,
        8,
        160,
        72,
        -1,
        0,
        56,
        8,
        70,
        -1,
        3,
        112,
        120,
        128,
        68,
        136,
        200,
        16,
        32,
        16,
        32,
        40,
        56,
        88352,
        194624,
    ),
}
DEBUG_COOKIE = b"xdebugpy"
# _Py_DebugOffsets (3.13), the u64 word of each field we take: 5 runtime_state.interpreters_head,
# 8/9 interpreter_state.next/threads_head, 21 thread_state.next, 23 current_frame, 25
# native_thread_id, 29-31 and 33 interpreter_frame previous/executable/instr_ptr/owner, 35-39
# and 43 code_object filename/name/qualname/linetable/firstlineno/co_code_adaptive, 65/66
# bytes_object ob_size/ob_sval, 68-70 unicode_object state/length/asciiobject_size.
DEBUG_WORDS = 71
_DEBUG_FIELDS = {
    "runtime_interpreters_head": 5,
    "interp_next": 8,
    "interp_threads_head": 9,
    "tstate_next": 21,
    "tstate_current_frame": 23,
    "tstate_native_thread_id": 25,
    "frame_previous": 29,
    "frame_code": 30,
    "frame_instr": 31,
    "frame_owner": 33,
    "code_filename": 35,
    "code_name": 36,
    "code_qualname": 37,
    "code_linetable": 38,
    "code_firstlineno": 39,
    "code_adaptive": 43,
    "bytes_size": 65,
    "bytes_sval": 66,
    "unicode_state": 68,
    "unicode_length": 69,
    "unicode_ascii_data": 70,
}


def debug_layout(blob: bytes, version: tuple[int, int]) -> Layout | None:
    """The layout 3.13 publishes at the start of _PyRuntime (`blob`: its first DEBUG_WORDS
    words), None without the cookie or for another version (3.14 changed the struct)."""
    if version != (3, 13) or len(blob) < 8 * DEBUG_WORDS or blob[:8] != DEBUG_COOKIE:
        return None
    words = struct.unpack_from(f"<{DEBUG_WORDS}Q", blob)
    if words[1] >> 16 != 0x030D:  # PY_VERSION_HEX
        return None
    base = LAYOUTS[version]
    got = {name: int(words[i]) for name, i in _DEBUG_FIELDS.items()}
    got["unicode_compact_data"] = got["unicode_ascii_data"] + 16  # utf8_length, utf8
    return replace(base, **got)
