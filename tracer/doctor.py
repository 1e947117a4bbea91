"""`allocscope doctor`: can this machine trace? Each check says what is missing and the fix."""
from __future__ import annotations

import ctypes as ct
import os
import platform
from dataclasses import dataclass

from common.errors import PermissionProblem

TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _tracefs() -> str | None:
    for d in TRACEFS_DIRS:
        if os.path.exists(os.path.join(d, "uprobe_events")):
            return d
    return None


def check_root() -> Check:
    ok = os.geteuid() == 0
    return Check("root", ok, "running as root" if ok else f"running as uid {os.geteuid()}",
                 "run allocscope with sudo (BPF and uprobes need root)")


def check_bpf_syscall() -> Check:
    """BPF_MAP_CREATE of a tiny array: proves the bpf() syscall works for us."""
    libc = ct.CDLL(None, use_errno=True)

    class Attr(ct.Structure):
        _fields_ = [("map_type", ct.c_uint32), ("key_size", ct.c_uint32), ("value_size", ct.c_uint32),
                    ("max_entries", ct.c_uint32), ("pad", ct.c_uint8 * 112)]

    attr = Attr(2, 4, 4, 1)  # BPF_MAP_TYPE_ARRAY
    fd = libc.syscall(321, 0, ct.byref(attr), ct.sizeof(attr))  # __NR_bpf, BPF_MAP_CREATE
    if fd >= 0:
        os.close(fd)
        return Check("bpf syscall", True, "bpf() can create maps")
    err = ct.get_errno()
    return Check("bpf syscall", False, f"bpf() failed: {os.strerror(err)}",
                 "run as root; check kernel.unprivileged_bpf_disabled / lockdown / seccomp of this container")


def check_bcc() -> Check:
    try:
        import bcc  # noqa: PLC0415
    except ImportError as e:
        return Check("BCC python", False, f"cannot import bcc ({e})",
                     "apt-get install python3-bpfcc (Debian's package; the PyPI 'bcc' is unrelated), "
                     "and use a venv made with --system-site-packages: make setup")
    return Check("BCC python", True, f"bcc from {os.path.dirname(bcc.__file__)}")


def check_headers() -> Check:
    rel = platform.release()
    build = f"/lib/modules/{rel}/build"
    env = os.environ.get("BCC_KERNEL_SOURCE")  # BCC reads it instead of /lib/modules (the bundle sets it)
    if env:
        if os.path.exists(os.path.join(env, "include/generated/autoconf.h")):
            return Check("kernel headers", True, f"BCC_KERNEL_SOURCE={env}")
        return Check("kernel headers", False, f"BCC_KERNEL_SOURCE={env} has no include/generated/autoconf.h",
                     "point BCC_KERNEL_SOURCE at a configured kernel header tree, or unset it")
    if os.path.exists(os.path.join(build, "include/generated/autoconf.h")):
        return Check("kernel headers", True, f"{build} -> {os.path.realpath(build)}")
    if os.path.exists("/sys/kernel/kheaders.tar.xz"):
        return Check("kernel headers", True, "in-kernel headers (/sys/kernel/kheaders.tar.xz)")
    return Check("kernel headers", False, f"no headers at {build}",
                 "apt-get install linux-headers-amd64; scripts/setup-host.sh links them when no "
                 "package matches the running kernel (make setup does it)")


def check_tracefs() -> Check:
    d = _tracefs()
    if d:
        return Check("tracefs", True, f"mounted at {d}")
    return Check("tracefs", False, "tracefs is not mounted",
                 "mount -t tracefs nodev /sys/kernel/tracing (make setup does it)")


def check_uprobes() -> Check:
    d = _tracefs()
    if os.path.exists("/sys/bus/event_source/devices/uprobe/type"):
        return Check("uprobes", True, "uprobe PMU available (probes vanish with the tracer, even on SIGKILL)")
    if d and os.path.exists(os.path.join(d, "uprobe_events")):
        return Check("uprobes", True, f"{d}/uprobe_events (no uprobe PMU: a killed tracer may leave probes)")
    return Check("uprobes", False, "kernel has no uprobe support", "a kernel with CONFIG_UPROBE_EVENTS=y")


def check_tracepoints() -> Check:
    d = _tracefs()
    need = ["syscalls/sys_enter_mmap", "syscalls/sys_exit_munmap", "sched/sched_process_exit", "task/task_rename"]
    if not d:
        return Check("tracepoints", False, "tracefs missing", "see tracefs")
    missing = [n for n in need if not os.path.exists(os.path.join(d, "events", n))]
    if missing:
        return Check("tracepoints", False, f"missing {', '.join(missing)}",
                     "a kernel with CONFIG_FTRACE_SYSCALLS=y")
    return Check("tracepoints", True, "syscall, sched and task tracepoints present")


def check_btf() -> Check:
    ok = os.path.exists("/sys/kernel/btf/vmlinux")
    return Check("kernel BTF", ok, "/sys/kernel/btf/vmlinux present" if ok else "no /sys/kernel/btf/vmlinux",
                 "a kernel with CONFIG_DEBUG_INFO_BTF=y (needed to read the user stack pointer in syscalls)")


def run_checks() -> list[Check]:
    checks = [check_root(), check_bpf_syscall(), check_bcc(), check_headers(), check_tracefs(),
              check_uprobes(), check_tracepoints(), check_btf()]
    if all(c.ok for c in checks):
        checks.append(check_compile())
    return checks


def check_compile() -> Check:
    """Compile and load the real probe program against our own pid (no attach)."""
    try:
        from .options import RecordOptions  # noqa: PLC0415
        from .probe import Probes  # noqa: PLC0415

        p = Probes(os.getpid(), RecordOptions(max_live=1024, max_stacks=1024, max_sites=1024, ring_pages=16,
                                              unwind_rows=4096))
        unwind = "with the DWARF unwinder" if p.unwind == "dwarf" else \
            f"without the DWARF unwinder ({p.unwind_error[:120]}): stacks will use frame pointers"
        p.close()
    except Exception as e:  # noqa: BLE001 - report whatever BCC says
        return Check("probe program", False, f"does not load: {str(e).splitlines()[0][:200]}",
                     "run scripts/setup-host.sh; see the checks above")
    return Check("probe program", True, f"probes/allocscope.c compiles and passes the verifier, {unwind}")


def require_root() -> None:
    """Root, a working bpf() syscall and tracefs: checked before anything is compiled or written,
    so a box that cannot trace gets one line, not a compiler's error dump."""
    if os.geteuid() != 0:
        raise PermissionProblem("allocscope record needs root (BPF and uprobes); run it with sudo")
    for check in (check_bpf_syscall(), check_tracefs()):
        if not check.ok:
            raise PermissionProblem(f"{check.name}: {check.detail}; fix: {check.fix}")
