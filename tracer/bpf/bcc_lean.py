"""BCC modules without the "rw engine": half of a compile's time, none of its use to us.

libbcc's `bpf_module_create_c_from_string` (what `bcc.BPF(text=...)` calls) always builds
ebpf::BPFModule with `rw_engine_enabled = true`: for every table it generates C functions that
print and parse keys and values as strings, and compiles them to native code with LLVM's
MCJIT — about 0.3 s of the 0.55 s a maps-only compile takes here (tracer/bpf/cache.py), more
with the whole program. BCC's Python never calls them (tables are read through ctypes types
built from the JSON descriptions, which the module keeps either way). `light()` makes BPF(...)
inside it build the module as that function does, but with the engine off.

It calls the C++ constructor and `load_string` by their mangled names with std::string
arguments laid out as libstdc++'s (the C++11 ABI: pointer, length, 16-byte local buffer or
capacity). Where libbcc lacks those symbols, or the layout check fails, BCC's own function is
used: the result is the same module, only slower to build.
"""

from __future__ import annotations

import ctypes as ct
import os
import threading
from contextlib import contextmanager

_CTOR = "_ZN4ebpf9BPFModuleC1EjPNS_12TableStorageEbRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEbPKc"
_LOAD = "_ZN4ebpf9BPFModule11load_stringERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEPPKci"
_MODULE_BYTES = 1 << 16  # room for an ebpf::BPFModule (a few hundred bytes in 0.26), zeroed


class _StdString(ct.Structure):  # std::__cxx11::basic_string<char> (libstdc++)
    _fields_ = [("ptr", ct.c_void_p), ("len", ct.c_size_t), ("buf", ct.c_char * 16)]


def _std_string(b: bytes) -> tuple[_StdString, object]:
    """A const std::string& argument holding `b` (and what must stay alive with it)."""
    s = _StdString()
    keep = ct.create_string_buffer(b, len(b) + 1)
    if len(b) < 16:  # the short-string form: the characters in the local buffer
        ct.memmove(ct.addressof(s) + _StdString.buf.offset, keep, len(b) + 1)
        s.ptr = ct.addressof(s) + _StdString.buf.offset
    else:  # the long form: a heap buffer (ours, only read), the capacity where the buffer was
        s.ptr = ct.addressof(keep)
        ct.c_size_t.from_address(ct.addressof(s) + _StdString.buf.offset).value = len(b)
    s.len = len(b)
    return s, keep


class _Light:
    def __init__(self) -> None:
        lib = ct.CDLL("libbcc.so.0", use_errno=True)
        cxx = ct.CDLL("libstdc++.so.6")
        self.new = cxx["_Znwm"]  # operator new: bpf_module_destroy deletes the module
        self.new.restype, self.new.argtypes = ct.c_void_p, [ct.c_size_t]
        self.ctor = lib[_CTOR]
        self.ctor.restype = None
        self.ctor.argtypes = [ct.c_void_p, ct.c_uint, ct.c_void_p, ct.c_bool, ct.c_void_p, ct.c_bool, ct.c_char_p]
        self.load = lib[_LOAD]
        self.load.restype, self.load.argtypes = ct.c_int, [ct.c_void_p, ct.c_void_p, ct.c_void_p, ct.c_int]
        self.destroy = lib["bpf_module_destroy"]
        self.destroy.restype, self.destroy.argtypes = None, [ct.c_void_p]

    def create(self, text, flags, cflags, ncflags, allow_rlimit, device):
        """bpf_module_create_c_from_string's body with rw_engine_enabled = false."""
        mod = self.new(_MODULE_BYTES)
        ct.memset(mod, 0, _MODULE_BYTES)
        ns, _k1 = _std_string(b"")
        self.ctor(
            mod,
            flags,
            None,
            False,
            ct.addressof(ns),
            bool(allow_rlimit),
            device if isinstance(device, bytes | None) else None,
        )
        src, _k2 = _std_string(text if isinstance(text, bytes) else bytes(text))
        if self.load(mod, ct.addressof(src), cflags, ncflags) != 0:
            return None  # not destroyed: a module that failed halfway frees what it never made
        return mod


_light: _Light | None = None
_failed = False
# One BPF module built at a time in this process: libbcc's front end is not thread-safe (two
# recordings of `watch` attaching at once crashed in it), and light() swaps a process-wide pointer.
BUILDING = threading.RLock()


def _get() -> _Light | None:
    global _light, _failed
    if _light is None and not _failed:
        try:
            _light = _Light()
        except (OSError, AttributeError):
            _failed = True  # another libbcc or libstdc++: BCC's own function serves
    return _light


@contextmanager
def light(bcc):
    """Within: bcc.BPF(text=...) builds its module without the rw engine
    (ALLOCSCOPE_BCC_RW=1 keeps BCC's own function)."""
    with BUILDING:
        lt = None if os.environ.get("ALLOCSCOPE_BCC_RW") == "1" else _get()
        if lt is None:
            yield
            return
        lib = bcc.libbcc.lib
        orig = lib.bpf_module_create_c_from_string
        lib.bpf_module_create_c_from_string = lt.create
        try:
            yield
        finally:
            lib.bpf_module_create_c_from_string = orig
