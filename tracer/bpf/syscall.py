"""bpf(2) through ctypes: the one wrapper of the syscall in the tracer (its number, the commands,
the parts of `union bpf_attr` each command reads, errno). What BCC's Python does not offer is
built on it: the maps and programs of the prebuilt store (tracer/bpf/prebuilt.py: create_map,
load_prog, here), uprobe_multi links, program statistics and the objects a tracer holds, read from
outside (tracer/bpf/objects.py).

`bpf(cmd, attr)` returns what the kernel returned (an fd, 0) or -errno; nothing else here keeps
errno. Each attr structure is the union's member for its commands, padded past the largest size
this kernel version reads (the kernel requires the bytes it does not know to be zero).
"""

from __future__ import annotations

import ctypes as ct
import os
import struct

_libc = ct.CDLL(None, use_errno=True)
NR_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine, 321)  # __NR_bpf

# enum bpf_cmd (uapi, append-only)
MAP_CREATE, MAP_GET_NEXT_KEY, PROG_LOAD = 0, 4, 5
PROG_GET_NEXT_ID, PROG_GET_FD_BY_ID, MAP_GET_FD_BY_ID, OBJ_GET_INFO_BY_FD = 11, 13, 14, 15
BTF_LOAD, MAP_LOOKUP_BATCH, LINK_CREATE = 18, 24, 28
# enum bpf_map_type
MAP_TYPE_HASH, MAP_TYPE_LRU_HASH, MAP_TYPE_RINGBUF, MAP_TYPE_TASK_STORAGE = 1, 9, 27, 29


def bpf(cmd: int, attr: ct.Structure) -> int:
    """bpf(cmd, &attr, sizeof attr): the kernel's result (an fd, or 0), or -errno."""
    rc = _libc.syscall(NR_BPF, cmd, ct.byref(attr), ct.sizeof(attr))
    return rc if rc >= 0 else -ct.get_errno()


class MapAttr(ct.Structure):  # BPF_MAP_CREATE
    _fields_ = [
        ("map_type", ct.c_uint32),
        ("key_size", ct.c_uint32),
        ("value_size", ct.c_uint32),
        ("max_entries", ct.c_uint32),
        ("map_flags", ct.c_uint32),
        ("inner_map_fd", ct.c_uint32),
        ("numa_node", ct.c_uint32),
        ("map_name", ct.c_char * 16),
        ("map_ifindex", ct.c_uint32),
        ("btf_fd", ct.c_uint32),
        ("btf_key_type_id", ct.c_uint32),
        ("btf_value_type_id", ct.c_uint32),
        ("btf_vmlinux_value_type_id", ct.c_uint32),
        ("map_extra", ct.c_uint64),
        ("pad", ct.c_uint8 * 64),
    ]


class ProgAttr(ct.Structure):  # BPF_PROG_LOAD
    _fields_ = [
        ("prog_type", ct.c_uint32),
        ("insn_cnt", ct.c_uint32),
        ("insns", ct.c_uint64),
        ("license", ct.c_uint64),
        ("log_level", ct.c_uint32),
        ("log_size", ct.c_uint32),
        ("log_buf", ct.c_uint64),
        ("kern_version", ct.c_uint32),
        ("prog_flags", ct.c_uint32),
        ("prog_name", ct.c_char * 16),
        ("prog_ifindex", ct.c_uint32),
        ("expected_attach_type", ct.c_uint32),
        ("pad", ct.c_uint8 * 96),
    ]


class BtfAttr(ct.Structure):  # BPF_BTF_LOAD
    _fields_ = [
        ("btf", ct.c_uint64),
        ("btf_log_buf", ct.c_uint64),
        ("btf_size", ct.c_uint32),
        ("btf_log_size", ct.c_uint32),
        ("btf_log_level", ct.c_uint32),
        ("pad", ct.c_uint8 * 100),
    ]


class IdAttr(ct.Structure):  # start_id (GET_NEXT_ID) and prog_id/map_id (GET_FD_BY_ID) share `id`
    _fields_ = [("id", ct.c_uint32), ("next_id", ct.c_uint32), ("open_flags", ct.c_uint32), ("pad", ct.c_uint8 * 116)]


class InfoAttr(ct.Structure):  # BPF_OBJ_GET_INFO_BY_FD
    _fields_ = [("bpf_fd", ct.c_uint32), ("info_len", ct.c_uint32), ("info", ct.c_uint64), ("pad", ct.c_uint8 * 112)]


class KeyAttr(ct.Structure):  # BPF_MAP_GET_NEXT_KEY (and the other element commands)
    _fields_ = [
        ("map_fd", ct.c_uint32),
        ("pad0", ct.c_uint32),
        ("key", ct.c_uint64),
        ("next_key", ct.c_uint64),
        ("flags", ct.c_uint64),
        ("pad", ct.c_uint8 * 96),
    ]


class BatchAttr(ct.Structure):  # BPF_MAP_LOOKUP_BATCH
    _fields_ = [
        ("in_batch", ct.c_uint64),
        ("out_batch", ct.c_uint64),
        ("keys", ct.c_uint64),
        ("values", ct.c_uint64),
        ("count", ct.c_uint32),
        ("map_fd", ct.c_uint32),
        ("elem_flags", ct.c_uint64),
        ("flags", ct.c_uint64),
        ("pad", ct.c_uint8 * 72),
    ]


class UprobeMultiAttr(ct.Structure):  # BPF_LINK_CREATE, .uprobe_multi
    _fields_ = [
        ("prog_fd", ct.c_uint32),
        ("target_fd", ct.c_uint32),
        ("attach_type", ct.c_uint32),
        ("flags", ct.c_uint32),
        ("path", ct.c_uint64),
        ("offsets", ct.c_uint64),
        ("ref_ctr_offsets", ct.c_uint64),
        ("cookies", ct.c_uint64),
        ("cnt", ct.c_uint32),
        ("multi_flags", ct.c_uint32),
        ("pid", ct.c_uint32),
        ("pad", ct.c_uint8 * 52),
    ]


def storage_btf(value_size: int) -> int:
    """A BTF object for a task-storage map: [1] int (the key), [2] unsigned char, [3] an array
    of value_size of them (the value). Its fd."""
    strs = b"\0int\0unsigned char\0"
    types = struct.pack("<IIII", 1, 1 << 24, 4, (1 << 24) | 32)  # int: signed, 32 bits
    types += struct.pack("<IIII", 5, 1 << 24, 1, 8)  # unsigned char: 8 bits
    types += struct.pack("<III", 0, 3 << 24, 0) + struct.pack("<III", 2, 1, value_size)  # array
    hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strs))
    blob = ct.create_string_buffer(hdr + types + strs)
    fd = bpf(BTF_LOAD, BtfAttr(btf=ct.addressof(blob), btf_size=len(hdr + types + strs)))
    if fd < 0:
        log = ct.create_string_buffer(4096)
        attr = BtfAttr(
            btf=ct.addressof(blob),
            btf_size=len(hdr + types + strs),
            btf_log_buf=ct.addressof(log),
            btf_log_size=4096,
            btf_log_level=1,
        )
        bpf(BTF_LOAD, attr)
        raise OSError(-fd, f"BTF for task storage: {log.value.decode(errors='replace')[-300:]}")
    return fd


def create_map(row: list, max_entries: int) -> int:
    """A map of the prebuilt store's table signature `row` (name, type, key size, value size,
    max entries, flags, ...) with `max_entries`: its fd (OSError when the kernel refuses it)."""
    name, mtype, key_size, leaf_size, _max, flags = row[:6]
    attr = MapAttr(
        map_type=mtype,
        key_size=key_size,
        value_size=leaf_size,
        max_entries=max_entries,
        map_flags=flags,
        map_name=name.encode()[:15],
    )
    btf_fd = -1
    if mtype == MAP_TYPE_TASK_STORAGE:
        btf_fd = storage_btf(leaf_size)
        attr.btf_fd, attr.btf_key_type_id, attr.btf_value_type_id = btf_fd, 1, 3
    try:
        fd = bpf(MAP_CREATE, attr)
        if fd < 0:
            raise OSError(-fd, f"cannot create map {name}: {os.strerror(-fd)}")
        return fd
    finally:
        if btf_fd >= 0:
            os.close(btf_fd)  # the map holds its own reference


def load_prog(name: str, code: bytes, prog_type: int, license: str, attach_type: int) -> int:
    """Instructions `code` loaded (verified) as program `name`: its fd. Failures raise as BCC's
    load does (PermissionError without the privilege; else Exception with the verifier log's
    last lines, from a second load that keeps the log)."""
    buf = ct.create_string_buffer(code, len(code))
    lic = ct.create_string_buffer(license.encode())
    attr = ProgAttr(
        prog_type=prog_type,
        insn_cnt=len(code) // 8,
        insns=ct.addressof(buf),
        license=ct.addressof(lic),
        prog_name=name.encode()[:15],
        expected_attach_type=max(attach_type, 0),
    )
    fd = bpf(PROG_LOAD, attr)
    if fd >= 0:
        return fd
    err = -fd
    if err == 1:  # EPERM
        raise PermissionError("Need super-user privileges to run")
    size = 1 << 22
    log = ct.create_string_buffer(size)
    attr.log_level, attr.log_size, attr.log_buf = 1, size, ct.addressof(log)
    fd = bpf(PROG_LOAD, attr)
    if fd >= 0:
        return fd  # loaded the second time (a transient failure)
    tail = log.value.decode(errors="replace").strip().splitlines()[-3:]
    raise Exception(f"Failed to load BPF program {name.encode()!r}: {os.strerror(err)}: {' / '.join(tail)}")


NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine, 298)
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_SET_BPF = 0x2400, 0x40042408  # _IO('$', 0), _IOW('$', 8, u32)


def perf_event_bpf(attr: ct.Structure, tid: int, prog_fd: int) -> int:
    """perf_event_open(attr, tid, cpu -1) with program `prog_fd` attached and the event enabled:
    its fd, or -errno. What libbcc's bpf_attach_perf_event_raw does, without its perror: a thread
    that exits between the listing of /proc/PID/task and the open is ordinary (ESRCH), not a line
    on the user's terminal (the watch printed "perf_event_open failed: No such process")."""
    fd = _libc.syscall(NR_PERF_EVENT_OPEN, ct.byref(attr), tid, -1, -1, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        return -ct.get_errno()
    for req, arg in ((PERF_EVENT_IOC_SET_BPF, prog_fd), (PERF_EVENT_IOC_ENABLE, 0)):
        if _libc.ioctl(fd, ct.c_ulong(req), ct.c_int(arg)) != 0:
            err = ct.get_errno()
            os.close(fd)
            return -err
    return fd
