#!/usr/bin/python3
"""Run Debian's memleak-bpfcc with one fix so that it can attach beside other uprobes.

python3-bpfcc 0.26 declares libbcc's bpf_attach_uprobe with one argument too few, so the kernel
gets stack garbage as the uprobe's ref_ctr_offset and refuses (EINVAL, "ref_ctr_offset mismatch"
in dmesg) a uprobe on an address where any other uprobe with offset 0 exists — allocscope's,
perf's, bpftrace's, or one the kernel still holds. This passes 0, as the C API means; memleak's
probes and their cost are unchanged.

    bench/memleak_fixed.py [memleak-bpfcc arguments...]
"""

import ctypes as ct
import runpy
import shutil
import sys

from bcc import libbcc

_real = ct.CDLL("libbcc.so.0", use_errno=True)["bpf_attach_uprobe"]
_real.restype = ct.c_int
_real.argtypes = [ct.c_int, ct.c_int, ct.c_char_p, ct.c_char_p, ct.c_uint64, ct.c_int, ct.c_uint32]


def _attach_uprobe(*args):
    return _real(*args, 0) if len(args) == 6 else _real(*args)


libbcc.lib.bpf_attach_uprobe = _attach_uprobe
tool = shutil.which("memleak-bpfcc") or "/usr/sbin/memleak-bpfcc"
sys.argv = [tool, *sys.argv[1:]]
runpy.run_path(tool, run_name="__main__")
