"""Where a trace may be written, checked and prepared without importing pyarrow: the CLI checks
-o before the tracer's heavy modules load (and before the probes are built beside them)."""

from __future__ import annotations

import json
import os
import shutil
import stat

from common.errors import OutputError

from .names import FORMAT, META


def is_trace_dir(path: str) -> bool:
    try:
        with open(os.path.join(path, META)) as f:
            return json.load(f).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def check_output(path: str, force: bool = False) -> bool:
    """Raise OutputError unless `path` may be written; True when something is there already
    (an old trace, or with `force` anything) that prepare_output will move aside. Changes
    nothing: called before the probes attach, so an interrupted start leaves the path as it was."""
    try:
        st = os.lstat(path)
    except PermissionError:
        raise OutputError(f"cannot write {path}: permission denied") from None
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise OutputError(f"cannot write {path}: directory {parent} does not exist") from None
        if not os.access(parent, os.W_OK):
            raise OutputError(f"cannot write {path}: directory {parent} is not writable") from None
        return False
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"refusing to write through the symlink {path}; give the real path")
    if (not stat.S_ISDIR(st.st_mode) or not is_trace_dir(path)) and not force:
        raise OutputError(
            f"{path} exists and is not an allocscope trace; choose another -o or pass --force to replace it"
        )
    old = path.rstrip("/") + ".old"
    if (
        os.path.lexists(old)
        and not force
        and not (os.path.isdir(old) and not os.path.islink(old) and is_trace_dir(old))
    ):
        raise OutputError(f"{old} exists and is not an allocscope trace; remove it first")
    return True


def prepare_output(path: str, force: bool = False) -> None:
    """Check that `path` may be written (check_output); an existing trace there is moved to
    PATH.old (like perf.data.old)."""
    if not check_output(path, force):
        return
    old = path.rstrip("/") + ".old"
    if os.path.lexists(old):
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old)
        else:
            os.unlink(old)
    os.rename(path, old)
