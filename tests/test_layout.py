"""probes/allocscope.h is mirrored once in tracer/base/layout.py: sizes and offsets must agree with
the ctypes classes BCC derives from the header itself."""

from __future__ import annotations

import ctypes as ct
import os
import subprocess
import sys

import pytest
from support import run_c_with_header

from tracer.base import layout as L


def test_enums_parsed_from_header():
    assert L.enum("AS_API_MALLOC") == 1 and L.API_NAMES[L.enum("AS_API_MMAP")] == "mmap"
    names = L.counter_names()
    assert names[0] == "lost_live_full" and "n_free_unknown" in names.values()
    assert all(i < L.enum("AS_CNT_MAX") for i in names)


def test_event_layout_matches_c_compiler(tmp_path):
    """Compile a C program with the header and print sizeof/offsetof of each struct."""
    structs = {
        "as_stack": L.Stack,
        "as_live": L.Live,
        "as_site_key": L.SiteKey,
        "as_site": L.Site,
        "as_flow_key": L.FlowKey,
        "as_flow": L.Flow,
        "as_inflight": L.Inflight,
        "as_event": L.Event,
        "as_sysargs": L.Sysargs,
        "as_region": L.Region,
        "as_release_key": L.ReleaseKey,
        "as_release": L.Release,
        "as_dev_key": L.DevKey,
        "as_custom": L.Custom,
    }
    lines = []
    for cname, cls in structs.items():
        lines.append(f'printf("{cname} %zu\\n", sizeof(struct {cname}));')
        for fname, _ in cls._fields_:
            lines.append(f'printf("{cname}.{fname} %zu\\n", offsetof(struct {cname}, {fname}));')
    got = dict(line.split() for line in run_c_with_header(tmp_path, lines).splitlines())
    for cname, cls in structs.items():
        assert int(got[cname]) == ct.sizeof(cls), cname
        for fname, _ in cls._fields_:
            assert int(got[f"{cname}.{fname}"]) == getattr(cls, fname).offset, (cname, fname)


@pytest.mark.bpf
def test_layout_matches_bcc_maps():
    from tracer.base.options import RecordOptions
    from tracer.bpf.probes import Probes

    p = Probes(os.getpid(), RecordOptions(max_live=1024, max_stacks=1024, max_sites=1024, ring_pages=16))
    try:
        for name, (key, val) in L.MAP_LAYOUTS.items():
            t = p.bpf[name.encode()]
            assert ct.sizeof(t.Key) == ct.sizeof(key), name
            assert ct.sizeof(t.Leaf) == ct.sizeof(val), name
    finally:
        p.close()


def test_reports_never_import_bcc():
    """reports/ runs anywhere: importing it (and loading a trace) must not need BCC."""
    code = (
        "import sys; sys.modules['bcc'] = None\n"
        "import reports.trace, reports.analysis, reports.analysis.diff, reports.symbolize\n"
        "import reports.render.text, reports.render.html, reports.render.pprof, reports.live.text\n"
        "import allocscope.cli.app\n"
        "print('ok')"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__))
    )
    assert p.stdout.strip() == "ok", p.stderr


def test_reports_know_the_tracers_source_names():
    """reports.analysis sorts sources by what memory they are without importing the tracer: its
    names must be the header's (as_source), and every CUDA or shared source must be in one class."""
    from reports import analysis as A

    names = set(L.SOURCE_NAMES.values())
    classes = [A.DEVICE_SOURCES, set(A.CUDA_HOST_SOURCES), set(A.SHMEM_SOURCES), set(A.DEVICE_FILE_SOURCES)]
    assert set().union(*classes) <= names
    assert {n for n in names if n.startswith("cuda-")} == A.CUDA_SOURCES
    assert {"shmem", "device", *A.CUDA_SOURCES} == set().union(*classes)
    assert {L.SOURCE_NAMES[L.enum("AS_SRC_CUDA_DEVICE")]} == A.DEVICE_SOURCES
    assert L.API_NAMES[L.enum("AS_API_CU_HOST_REGISTER")] == A.REGISTER_API
