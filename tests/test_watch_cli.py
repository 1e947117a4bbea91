"""`allocscope watch`'s bad outputs and its help: one line each with exit 6 (OutputError), never a
traceback; `--help` says the mode the watch really records in."""

from __future__ import annotations

import os

import pytest
from support import cli, one_line_error

pytestmark = pytest.mark.root  # watch checks root before its output directory


@pytest.mark.parametrize(
    ("make", "said"),
    [
        ("file", "it exists and is not a directory"),
        ("proc", "cannot make the directory (No such file or directory)"),
        ("under_file", "cannot make the directory (Not a directory)"),
    ],
)
def test_watch_output_that_cannot_be_a_directory(tmp_path, make, said):
    f = tmp_path / "exists"
    f.write_text("not a directory")
    out = {"file": str(f), "proc": "/proc/allocscope-xyz", "under_file": str(f / "sub")}[make]
    line = one_line_error(cli("watch", "--pgrep", "no-such-daemon-xyz", "-o", out), said, code=6)
    assert line.startswith(f"allocscope: -o {out}: "), line
    assert f.read_text() == "not a directory"
    assert not os.path.exists("/proc/allocscope-xyz")


def test_watch_help_says_its_default_mode():
    out = cli("watch", "--help", check=True).stdout
    at = out.index("--mode [full|residency]")
    mode = out[at : out.index("--sample-bytes N", at)]
    flat = " ".join(mode.split())
    assert "[default: residency]" in flat and "[default: full]" not in flat, flat
    assert "unless --inject or --sample-bytes is given (then full)" in flat, flat
