"""bpf(2) (tracer/bpf/syscall.py), as root: what BCC's Python does not offer the tracer (uprobe_multi links,
kernel 6.6+; a program's run time and count), and the BPF objects one tracer process holds and
the programs loaded on the machine, read from outside, so tests and bench/soak.py can watch a
running `allocscope record` without touching it:

    ids = tracer_objects(pid)          # {"maps": {map_id, ...}, "progs": {prog_id, ...}}
    map_counts(pid)                    # {"live": 1234, "stacks": 56, "sysargs": 2, ...}
    prog_exists(prog_id)               # False once the program is freed
    prog_names()                       # names of every loaded program (a killed tracer left none)

Objects are found through /proc/PID/fdinfo (map_id:/prog_id: lines), so other tracers running
on the same machine at the same time are never mistaken for ours. Entry counts of hash maps
read them bucket by bucket with BPF_MAP_LOOKUP_BATCH, which a map changing under the walk does not
restart (entries added or deleted meanwhile may or may not be counted: a count within the map's
churn of one walk). Other maps are walked with BPF_MAP_GET_NEXT_KEY, which restarts from the first
key when the current one is deleted (on a busy hash map that counted up to twice its entries).
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
from collections.abc import Iterator
from typing import Any

from .syscall import (
    LINK_CREATE,
    MAP_GET_FD_BY_ID,
    MAP_GET_NEXT_KEY,
    MAP_LOOKUP_BATCH,
    MAP_TYPE_HASH,
    MAP_TYPE_LRU_HASH,
    OBJ_GET_INFO_BY_FD,
    PROG_GET_FD_BY_ID,
    PROG_GET_NEXT_ID,
    BatchAttr,
    IdAttr,
    InfoAttr,
    KeyAttr,
    UprobeMultiAttr,
    bpf,
)

_HASH_TYPES = (MAP_TYPE_HASH, MAP_TYPE_LRU_HASH)  # not the per-CPU ones
TRACE_UPROBE_MULTI = 48  # enum bpf_attach_type (uapi, append-only; kernel 6.6+)
TRACE_UPROBE_SESSION = 57  # kernel 6.13+
UPROBE_MULTI_RETURN = 1  # BPF_F_UPROBE_MULTI_RETURN


def uprobe_multi_link(
    prog_fd: int,
    path: str,
    offsets: list[int],
    cookies: list[int],
    pid: int,
    attach_type: int = TRACE_UPROBE_MULTI,
    flags: int = 0,
) -> int:
    """A uprobe_multi link: `prog_fd` (loaded with expected_attach_type `attach_type`) runs at each
    file offset of `path` in process `pid` — on entry, or on return with UPROBE_MULTI_RETURN; in
    a session (TRACE_UPROBE_SESSION) on entry and, when that run returned 0, on return.
    bpf_get_attach_cookie gives the offset's cookie. Returns the link fd (closing it detaches
    every probe of the link at once, one unregistration wait for all), or -errno."""
    n = len(offsets)
    p = ct.create_string_buffer(os.fsencode(path))
    offs, cks = (ct.c_uint64 * n)(*offsets), (ct.c_uint64 * n)(*cookies)
    attr = UprobeMultiAttr(
        prog_fd=prog_fd,
        attach_type=attach_type,
        path=ct.addressof(p),
        offsets=ct.addressof(offs),
        cookies=ct.addressof(cks),
        cnt=n,
        multi_flags=flags,
        pid=pid,
    )
    return bpf(LINK_CREATE, attr)


def fdinfo_texts(pid: int) -> Iterator[str]:
    """The text of each /proc/PID/fdinfo entry of process `pid` (those gone meanwhile skipped)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return
    for fd in fds:
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                yield f.read()
        except OSError:
            continue


def tracer_objects(pid: int) -> dict[str, set[int]]:
    """IDs of the BPF maps and programs process `pid` holds open."""
    out: dict[str, set[int]] = {"maps": set(), "progs": set()}
    for text in fdinfo_texts(pid):
        for line in text.splitlines():
            if line.startswith("map_id:"):
                out["maps"].add(int(line.split()[1]))
            elif line.startswith("prog_id:"):
                out["progs"].add(int(line.split()[1]))
    return out


def prog_exists(prog_id: int) -> bool:
    fd = bpf(PROG_GET_FD_BY_ID, IdAttr(id=prog_id))
    if fd < 0:
        return -fd != errno.ENOENT
    os.close(fd)
    return True


def obj_info(fd: int) -> bytes | None:
    """bpf_prog_info / bpf_map_info of an object fd (its first 256 bytes)."""
    buf = (ct.c_uint8 * 256)()
    ia = InfoAttr(bpf_fd=fd, info_len=256, info=ct.addressof(buf))
    return bytes(buf) if bpf(OBJ_GET_INFO_BY_FD, ia) == 0 else None


# struct bpf_prog_info (uapi, append-only): run_time_ns and run_cnt (kernel.bpf_stats_enabled=1)
_RUN_TIME_OFF, _RUN_CNT_OFF = 192, 200


def prog_stats(fd: int) -> tuple[int, int] | None:
    """(run_time_ns, run_cnt) of a BPF program fd: 0 unless the kernel keeps them."""
    raw = obj_info(fd)
    if raw is None:
        return None
    return (
        int.from_bytes(raw[_RUN_TIME_OFF : _RUN_TIME_OFF + 8], "little"),
        int.from_bytes(raw[_RUN_CNT_OFF : _RUN_CNT_OFF + 8], "little"),
    )


def map_info(fd: int) -> tuple[str, int, int, int, int]:
    """(name, type, key_size, value_size, max_entries) from struct bpf_map_info"""
    raw = obj_info(fd)
    if raw is None:
        return "", 0, 0, 0, 0
    field = [int.from_bytes(raw[i : i + 4], "little") for i in range(0, 20, 4)]  # type id key value max
    return raw[24:40].split(b"\0")[0].decode(), field[0], field[2], field[3], field[4]


def prog_names() -> list[str]:
    """Names of every BPF program loaded on the machine (PROG_GET_NEXT_ID, then each one's info)."""
    names = []
    nid = 0
    while True:
        a = IdAttr(id=nid)
        if bpf(PROG_GET_NEXT_ID, a) != 0:
            break
        nid = a.next_id
        fd = bpf(PROG_GET_FD_BY_ID, IdAttr(id=nid))
        if fd < 0:
            continue
        raw = obj_info(fd)
        if raw is not None:
            names.append(raw[64:80].split(b"\0")[0].decode())
        os.close(fd)
    return names


def _walk_count(fd: int, key_size: int, max_entries: int) -> int:
    key = (ct.c_uint8 * max(key_size, 1))()
    nxt = (ct.c_uint8 * max(key_size, 1))()
    attr = KeyAttr(map_fd=fd, key=0, next_key=ct.addressof(nxt))
    n = 0
    while n <= 2 * max_entries + 16:
        if bpf(MAP_GET_NEXT_KEY, attr) != 0:
            break
        n += 1
        ct.memmove(key, nxt, key_size)
        attr.key = ct.addressof(key)
    return n


def _batch_count(fd: int, key_size: int, value_size: int) -> int | None:
    """Entries of a hash map by BPF_MAP_LOOKUP_BATCH; None when the kernel refuses it."""
    chunk = 4096
    token_in, token_out = (ct.c_uint8 * 8)(), (ct.c_uint8 * 8)()
    first, n = True, 0
    keys: Any = None  # ctypes arrays, made for the chunk size in use
    values: Any = None
    while True:
        if keys is None:  # buffers made once per chunk size, reused batch after batch
            keys = (ct.c_uint8 * (max(key_size, 1) * chunk))()
            values = (ct.c_uint8 * (max(value_size, 1) * chunk))()
        attr = BatchAttr(
            in_batch=0 if first else ct.addressof(token_in),
            out_batch=ct.addressof(token_out),
            keys=ct.addressof(keys),
            values=ct.addressof(values),
            count=chunk,
            map_fd=fd,
        )
        rc = bpf(MAP_LOOKUP_BATCH, attr)
        err = -rc if rc < 0 else 0
        if rc != 0 and err == errno.ENOSPC and chunk < 1 << 20:
            chunk *= 4  # one bucket holds more entries than a chunk: nothing was read
            keys = values = None
            continue
        if rc != 0 and err != errno.ENOENT:
            return None
        n += attr.count
        if rc != 0:  # ENOENT: the last buckets were read
            return n
        ct.memmove(token_in, token_out, 8)
        first = False


def _count(fd: int, map_type: int, key_size: int, value_size: int, max_entries: int) -> int:
    if map_type in _HASH_TYPES:
        n = _batch_count(fd, key_size, value_size)
        if n is not None:
            return n
    return _walk_count(fd, key_size, max_entries)


def map_counts(pid: int, names: tuple[str, ...] = ("live", "stacks", "sites", "flows", "sysargs")) -> dict[str, int]:
    """Entries in the named hash maps of the tracer `pid` (names as in probes/allocscope.c)."""
    out: dict[str, int] = {}
    for mid in sorted(tracer_objects(pid)["maps"]):
        fd = bpf(MAP_GET_FD_BY_ID, IdAttr(id=mid))
        if fd < 0:
            continue
        try:
            name, map_type, key_size, value_size, max_entries = map_info(fd)
            if name in names:
                out[name] = _count(fd, map_type, key_size, value_size, max_entries)
        finally:
            os.close(fd)
    return out


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def program_stats_of(pid: int) -> dict[str, tuple[int, int]]:
    """The BPF programs process `pid` holds: kernel name (15 characters) -> (run_time_ns,
    run_cnt), summed over the programs of that name (0 unless kernel.bpf_stats_enabled)."""
    out: dict[str, list[int]] = {}
    for prog_id in sorted(tracer_objects(pid)["progs"]):
        fd = bpf(PROG_GET_FD_BY_ID, IdAttr(id=prog_id))
        if fd < 0:
            continue
        try:
            raw = obj_info(fd)
            st = prog_stats(fd)
        finally:
            os.close(fd)
        if raw is None or st is None:
            continue
        name = raw[64:80].split(b"\0")[0].decode() or f"id{prog_id}"
        acc = out.setdefault(name, [0, 0])
        acc[0] += st[0]
        acc[1] += st[1]
    return {k: (v[0], v[1]) for k, v in out.items()}
