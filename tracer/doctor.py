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
    return Check(
        "root",
        ok,
        "running as root" if ok else f"running as uid {os.geteuid()}",
        "run allocscope with sudo (BPF and uprobes need root)",
    )


def check_bpf_syscall() -> Check:
    """BPF_MAP_CREATE of a tiny array: proves the bpf() syscall works for us."""
    from .bpf.syscall import MAP_CREATE, MapAttr, bpf  # noqa: PLC0415

    fd = bpf(MAP_CREATE, MapAttr(map_type=2, key_size=4, value_size=4, max_entries=1))  # BPF_MAP_TYPE_ARRAY
    if fd >= 0:
        os.close(fd)
        return Check("bpf syscall", True, "bpf() can create maps")
    return Check(
        "bpf syscall",
        False,
        f"bpf() failed: {os.strerror(-fd)}",
        "run as root; check kernel.unprivileged_bpf_disabled / lockdown / seccomp of this container",
    )


def check_bcc() -> Check:
    try:
        import bcc  # noqa: PLC0415
    except ImportError as e:
        return Check(
            "BCC python",
            False,
            f"cannot import bcc ({e})",
            "apt-get install python3-bpfcc (Debian's package; the PyPI 'bcc' is unrelated), "
            "and use a venv made with --system-site-packages: make setup",
        )
    return Check("BCC python", True, f"bcc from {os.path.dirname(bcc.__file__)}")


def prebuilt_serves() -> tuple[bool, str]:
    """(the probes built once, tracer/bpf/prebuilt.py, serve this kernel, why not / where)."""
    try:
        from .base.options import RecordOptions  # noqa: PLC0415
        from .bpf import prebuilt  # noqa: PLC0415
        from .bpf.kernel_btf import rss_offsets  # noqa: PLC0415
        from .bpf.source import probe_config  # noqa: PLC0415

        try:
            rss_offsets()
            rss_tracepoint = False
        except (OSError, LookupError):
            rss_tracepoint = True
        flags, consts = probe_config(RecordOptions(), False, "dwarf", rss_tracepoint)
        prebuilt.find(flags, consts)
        return True, str(prebuilt.STORE)
    except Exception as e:  # noqa: BLE001 (NotPrebuilt, or no BTF to read the offsets from)
        return False, str(e).splitlines()[0][:200] if str(e) else type(e).__name__


def check_prebuilt() -> Check:
    ok, why = prebuilt_serves()
    if ok:
        return Check(
            "prebuilt probes",
            True,
            f"{why} serves this kernel: no compiler and no kernel headers needed, every option loads from it",
        )
    return Check(
        "prebuilt probes",
        check_headers(prebuilt_ok=False).ok,
        f"not used here ({why}): BCC compiles the probes on this box (kernel headers needed; "
        "6-15 s the first time for each option variant, then cached)",
        "make setup (builds probes/prebuilt/); a kernel with BTF (CONFIG_DEBUG_INFO_BTF=y)",
    )


def check_headers(prebuilt_ok: bool | None = None) -> Check:
    if prebuilt_ok is None:
        prebuilt_ok = prebuilt_serves()[0]
    if prebuilt_ok:
        return Check("kernel headers", True, "not needed: the prebuilt probes serve this kernel (no compile)")
    rel = platform.release()
    build = f"/lib/modules/{rel}/build"
    env = os.environ.get("BCC_KERNEL_SOURCE")  # BCC reads it instead of /lib/modules (the bundle sets it)
    if env:
        if os.path.exists(os.path.join(env, "include/generated/autoconf.h")):
            return Check("kernel headers", True, f"BCC_KERNEL_SOURCE={env}")
        return Check(
            "kernel headers",
            False,
            f"BCC_KERNEL_SOURCE={env} has no include/generated/autoconf.h",
            "point BCC_KERNEL_SOURCE at a configured kernel header tree, or unset it",
        )
    if os.path.exists(os.path.join(build, "include/generated/autoconf.h")):
        return Check("kernel headers", True, f"{build} -> {os.path.realpath(build)}")
    if os.path.exists("/sys/kernel/kheaders.tar.xz"):
        return Check("kernel headers", True, "in-kernel headers (/sys/kernel/kheaders.tar.xz)")
    return Check(
        "kernel headers",
        False,
        f"no headers at {build}",
        "apt-get install linux-headers-amd64; scripts/setup-host.sh links them when no "
        "package matches the running kernel (make setup does it)",
    )


def check_tracefs() -> Check:
    d = _tracefs()
    if d:
        return Check("tracefs", True, f"mounted at {d}")
    return Check(
        "tracefs", False, "tracefs is not mounted", "mount -t tracefs nodev /sys/kernel/tracing (make setup does it)"
    )


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
        return Check("tracepoints", False, f"missing {', '.join(missing)}", "a kernel with CONFIG_FTRACE_SYSCALLS=y")
    return Check("tracepoints", True, "syscall, sched and task tracepoints present")


def _libc_malloc() -> tuple[str, int] | None:
    """(path, file offset) of this process's libc `malloc`: something to probe harmlessly."""
    from .bpf.symbols import symbol_offsets  # noqa: PLC0415

    try:
        with open("/proc/self/maps") as f:
            paths = [line.split()[-1] for line in f if "libc.so" in line and "x" in line.split()[1]]
    except OSError:
        return None
    for path in paths:
        off = symbol_offsets(path, ["malloc"]).offsets.get("malloc")
        if off is not None:
            return path, off
    return None


def _probe_link(attach_type: int) -> str:
    """'' when a uprobe_multi link of `attach_type` (a 2-instruction program that returns 0, on
    our own libc malloc, this process only) can be made and closed here, else why not."""
    from .bpf.objects import uprobe_multi_link  # noqa: PLC0415
    from .bpf.syscall import PROG_LOAD, ProgAttr, bpf  # noqa: PLC0415

    target = _libc_malloc()
    if target is None:
        return "no libc malloc in this process to try it on"
    insns = (ct.c_uint64 * 2)(0x00000000000000B7, 0x0000000000000095)  # r0 = 0; exit
    lic = ct.create_string_buffer(b"GPL")
    attr = ProgAttr(
        prog_type=2,  # BPF_PROG_TYPE_KPROBE
        insn_cnt=2,
        insns=ct.addressof(insns),
        license=ct.addressof(lic),
        expected_attach_type=attach_type,
    )
    prog = bpf(PROG_LOAD, attr)
    if prog < 0:
        return f"the kernel refuses the program type ({os.strerror(-prog)})"
    try:
        fd = uprobe_multi_link(prog, target[0], [target[1]], [0], os.getpid(), attach_type=attach_type)
        if fd < 0:
            return f"the kernel refuses the link ({os.strerror(-fd)})"
        os.close(fd)
        return ""
    finally:
        os.close(prog)


def check_uprobe_links() -> Check:
    """uprobe_multi links (6.6+) and uprobe sessions (6.13+): faster exits and, for sampled
    recordings, no return trap on unsampled calls. Without them perf events and classic return
    probes serve (never a failure)."""
    from .bpf.objects import TRACE_UPROBE_MULTI, TRACE_UPROBE_SESSION  # noqa: PLC0415

    multi, session = _probe_link(TRACE_UPROBE_MULTI), _probe_link(TRACE_UPROBE_SESSION)
    if not multi and not session:
        return Check(
            "uprobe links",
            True,
            "uprobe_multi links and uprobe sessions available "
            "(one link per module; sampled calls skip the return trap)",
        )
    if not multi:
        return Check(
            "uprobe links",
            True,
            f"uprobe_multi links available; uprobe sessions not ({session}): "
            "sampled recordings keep classic return probes",
        )
    return Check(
        "uprobe links",
        True,
        f"uprobe_multi links not available ({multi}): a perf event per "
        "probe (each takes ~0.1 s to detach at exit), classic return probes",
    )


def check_marker_probes() -> Check:
    """Where --inject's markers are probed (tracer/inject/agent.py marker_offset): on a 5-byte nop,
    which kernels since 6.18 turn into a call (no breakpoint trap per sampled call), or on the push
    after it (emulated after a trap). Never a failure."""
    from .bpf.kernel_btf import optimizes_nop5_uprobes  # noqa: PLC0415

    if optimizes_nop5_uprobes():
        return Check(
            "inject markers", True, "a uprobe on a 5-byte nop becomes a call: --inject's sampled calls skip the trap"
        )
    return Check(
        "inject markers",
        True,
        "uprobes on a 5-byte nop are not optimized here (x86-64 kernels since 6.18 do): "
        "--inject's sampled calls trap (~0.5 µs each)",
    )


def check_btf() -> Check:
    ok = os.path.exists("/sys/kernel/btf/vmlinux")
    return Check(
        "kernel BTF",
        ok,
        "/sys/kernel/btf/vmlinux present" if ok else "no /sys/kernel/btf/vmlinux",
        "a kernel with CONFIG_DEBUG_INFO_BTF=y (needed to read the user stack pointer in syscalls)",
    )


def run_checks() -> list[Check]:
    checks = [
        check_root(),
        check_bpf_syscall(),
        check_bcc(),
        check_headers(),
        check_tracefs(),
        check_uprobes(),
        check_tracepoints(),
        check_btf(),
        check_prebuilt(),
    ]
    if all(c.ok for c in checks):
        checks += [check_uprobe_links(), check_marker_probes(), check_compile(), check_oom_mark()]
    return checks


def check_oom_mark() -> Check:
    """Whether a recording can watch the OOM killer's marks (tracer/bpf/oom.py). Never a failure:
    without them an OOM kill is told by the memory cgroups' counters."""
    from .bpf.oom import open_victims  # noqa: PLC0415

    victims, how = open_victims()
    if victims is None:
        return Check("OOM kills", True, f"told by the memory cgroups' counters only (oom:mark_victim: {how})")
    memory = (
        "with the victim's memory at the kill"
        if victims.memory
        else "(this kernel's tracepoint gives no memory figures)"
    )
    victims.close()
    where = "loads from the prebuilt program" if how == "prebuilt" else how
    return Check("OOM kills", True, f"told by the kernel's own mark of its victim, oom:mark_victim ({where}), {memory}")


def check_compile() -> Check:
    """Compile and load the real probe program against our own pid (no attach)."""
    try:
        from .base.options import RecordOptions  # noqa: PLC0415
        from .bpf.probes import Probes  # noqa: PLC0415

        p = Probes(
            os.getpid(), RecordOptions(max_live=1024, max_stacks=1024, max_sites=1024, ring_pages=16, unwind_rows=4096)
        )
        unwind = (
            "with the DWARF unwinder"
            if p.unwind == "dwarf"
            else f"without the DWARF unwinder ({p.unwind_error[:120]}): stacks will use frame pointers"
        )
        how = (
            "loads from the prebuilt programs (no compile)"
            if p.program.bpf_cache == "prebuilt"
            else f"compiles here ({p.program.prebuilt_why[:120]})"
        )
        p.close()
    except Exception as e:  # noqa: BLE001 - report whatever BCC says
        return Check(
            "probe program",
            False,
            f"does not load: {str(e).splitlines()[0][:200]}",
            "run scripts/setup-host.sh; see the checks above",
        )
    return Check("probe program", True, f"probes/allocscope.c {how} and passes the verifier, {unwind}")


def require_root(command: str = "record") -> None:
    """Root, a working bpf() syscall and tracefs: checked before anything is compiled or written,
    so a box that cannot trace gets one line, not a compiler's error dump. `command`: the one
    asking (record, top, watch, demo), named in the line."""
    if os.geteuid() != 0:
        raise PermissionProblem(f"allocscope {command} needs root (BPF and uprobes); run it with sudo")
    for check in (check_bpf_syscall(), check_tracefs()):
        if not check.ok:
            raise PermissionProblem(f"{check.name}: {check.detail}; fix: {check.fix}")
