"""The kernel facts the probes need (tracer/bpf/kernel_btf.py: struct offsets, the raw
sched_switch shape, nop5 uprobes) are read from the running kernel's BTF once per kernel and boot
and kept in $ALLOCSCOPE_CACHE_DIR/kernel/: a warm start reads them back without loading the BTF,
and what it reads back is exactly what the BTF says."""

from __future__ import annotations

import json
import os

import pytest
from support import unavailable

from tracer.bpf import kernel_btf as k


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A new cache dir and none of this process's kept answers."""
    if not os.path.exists(k.VMLINUX):
        unavailable(f"no kernel BTF at {k.VMLINUX}")
    monkeypatch.setenv("ALLOCSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ALLOCSCOPE_BPF_CACHE", raising=False)
    monkeypatch.delenv("ALLOCSCOPE_UPROBE_NOP5", raising=False)

    k.forget()
    yield k.forget
    k.forget()


def facts() -> dict:
    with k.one_load():
        return {
            "rss": k.rss_offsets(),
            "files": k.file_offsets(),
            "nop5": k.optimizes_nop5_uprobes(),
            "switch": k.switch_offsets(),
            "return_probe": k.return_probe_offsets(),
            "fsbase": k.fsbase_offset(),
        }


def test_read_once_then_kept_without_loading_the_btf(fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOCSCOPE_BPF_CACHE", "0")
    truth = facts()  # straight from the BTF, nothing kept
    assert not (tmp_path / "kernel").exists()
    assert truth["rss"].task_mm > 0 and truth["files"].task_files > 0
    assert len(truth["switch"]) == 3 and truth["switch"][0].startswith("-DAS_OFF_TASK_PID=")
    assert len(truth["return_probe"]) == 5 and len(truth["fsbase"]) == 1

    fresh()
    monkeypatch.delenv("ALLOCSCOPE_BPF_CACHE")
    loads = []
    real = k.KernelBtf

    def counted():
        loads.append(1)
        return real()

    monkeypatch.setattr(k, "KernelBtf", counted)
    assert facts() == truth
    assert loads == [1]  # one load shared by every lookup of the cold start
    (kept,) = (tmp_path / "kernel").iterdir()
    assert kept.name == f"{k.kernel_key()}.json"
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    stored = json.loads(kept.read_text())
    assert stored["rss"] == {"task_mm": truth["rss"].task_mm, "mm_anon": truth["rss"].mm_anon}
    assert stored["switch"] == list(truth["switch"]) and stored["fsbase"] == truth["fsbase"]

    fresh()  # a warm start: the same answers, and the BTF is never loaded

    def no_btf():
        raise AssertionError("the kernel's BTF was loaded on a warm start")

    monkeypatch.setattr(k, "KernelBtf", no_btf)
    assert facts() == truth


def test_a_missing_member_is_kept_and_raised_again(fresh, tmp_path):
    calls = []

    def lacks():
        calls.append(1)
        raise LookupError("mm_struct.rss_stat")

    for _ in range(2):
        fresh()
        with pytest.raises(LookupError, match="rss_stat"):
            k.remember("probe", lacks)
    assert calls == [1]
    (kept,) = (tmp_path / "kernel").iterdir()
    assert json.loads(kept.read_text()) == {"probe": {"error": "mm_struct.rss_stat"}}


def test_nothing_kept_without_btf_or_with_the_cache_off(fresh, tmp_path, monkeypatch):
    monkeypatch.setattr(k, "VMLINUX", str(tmp_path / "no-such-btf"))
    assert k.kernel_key() is None
    assert k.remember("x", lambda: 7) == 7
    monkeypatch.undo()
    monkeypatch.setenv("ALLOCSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ALLOCSCOPE_BPF_CACHE", "0")
    fresh()
    assert k.remember("y", lambda: 8) == 8
    assert not (tmp_path / "kernel").exists()


def test_a_file_others_may_write_is_not_read(fresh, tmp_path):
    assert k.remember("x", lambda: 1) == 1
    (kept,) = (tmp_path / "kernel").iterdir()
    kept.write_text(json.dumps({"x": 2}))
    fresh()
    assert k.remember("x", lambda: 3) == 2  # this user's own file, private: read
    kept.chmod(0o666)
    fresh()
    assert k.remember("x", lambda: 4) == 4  # writable by others: not trusted, read again
