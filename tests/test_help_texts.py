"""What --help says agrees with README and docs where both give a figure (issue 53): the time
--inject's hooks take to come out by themselves if allocscope dies (measured:
bench/results/2026-12-07-inject-watchdog-restore.md; the bound itself is checked by
tests/test_inject_bpf.py::test_inject_tracer_sigkilled)."""

from __future__ import annotations

import re

from support import ROOT, cli


def test_inject_watchdog_figure_agrees():
    helps = " ".join(cli(cmd, "--help", check=True).stdout for cmd in ("record", "top"))
    helps = " ".join(helps.split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    inject_doc = " ".join((ROOT / "docs" / "inject.md").read_text().split())
    assert helps.count("by themselves within ~1 s if allocscope dies") == 2, helps
    assert "puts them back within ~1 s" in readme
    assert re.search(r"puts every entry word back itself .* within ~1 s", inject_doc)
    assert "within 0.1 s" not in helps + readme
