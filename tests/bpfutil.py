"""List loaded BPF programs by name (bpf(2) PROG_GET_NEXT_ID / GET_FD_BY_ID / OBJ_GET_INFO_BY_FD),
so tests can prove a killed tracer left no probe program behind."""
from __future__ import annotations

import ctypes as ct
import os

_libc = ct.CDLL(None, use_errno=True)
NR_BPF = 321
PROG_GET_NEXT_ID, PROG_GET_FD_BY_ID, OBJ_GET_INFO_BY_FD = 11, 13, 15


class _IdAttr(ct.Structure):
    _fields_ = [("start_id", ct.c_uint32), ("next_id", ct.c_uint32), ("open_flags", ct.c_uint32),
                ("pad", ct.c_uint8 * 116)]


class _InfoAttr(ct.Structure):
    _fields_ = [("bpf_fd", ct.c_uint32), ("info_len", ct.c_uint32), ("info", ct.c_uint64),
                ("pad", ct.c_uint8 * 112)]


def _bpf(cmd: int, attr) -> int:
    return _libc.syscall(NR_BPF, cmd, ct.byref(attr), ct.sizeof(attr))


def prog_names() -> list[str]:
    names = []
    nid = 0
    while True:
        a = _IdAttr(start_id=nid)
        if _bpf(PROG_GET_NEXT_ID, a) != 0:
            break
        nid = a.next_id
        fa = _IdAttr(start_id=nid)
        fd = _bpf(PROG_GET_FD_BY_ID, fa)
        if fd < 0:
            continue
        buf = (ct.c_uint8 * 256)()
        ia = _InfoAttr(bpf_fd=fd, info_len=256, info=ct.addressof(buf))
        if _bpf(OBJ_GET_INFO_BY_FD, ia) == 0:
            names.append(bytes(buf[64:80]).split(b"\0")[0].decode())
        os.close(fd)
    return names
