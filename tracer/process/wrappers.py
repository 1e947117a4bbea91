"""Commands that only exec another program, resolved before a launch: `record -- CMD` traces the
program CMD ends up running, from its first instruction, where an exec would have ended the
recording (docs/limits.md: the probed allocator and its blocks are gone at an exec).

Two such wrappers are followed, each as it would run:
* a script starting `#!/usr/bin/env NAME [ARGS]` (or `env -S ...`): env looks NAME up in PATH and
  execs it with ARGS, the script and the command's arguments; the same argv is launched directly.
* a pyenv shim (`~/.pyenv/shims/python3`, a bash script ending in `exec ".../libexec/pyenv" exec
  "$program" "$@"`): `pyenv which NAME` names the interpreter it would run, in this directory and
  environment; it is launched with the command's arguments and its folder first in PATH, as `pyenv
  exec` does.
Anything else (a shell script, a wrapper that does work before its exec, `env -i`, a shim whose
`pyenv which` fails) runs as given: an exec then ends the trace, and the record says so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

_PYENV_SHIM = re.compile(rb'exec "([^"]*/libexec/pyenv)" exec "\$program" "\$@"')
_PYENV_ROOT = re.compile(rb'export PYENV_ROOT="([^"]*)"')
_HEAD = 4096  # a shim is ~400 bytes; a shebang line is at most 256 (BINPRM_BUF_SIZE) in the kernel
_DEPTH = 4


@dataclass
class Launch:
    """What to exec: `exe` with `argv`, `env` the environment's changes, and `via` the wrappers
    resolved, in order (none when the command is run as given)."""

    exe: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    via: list[str] = field(default_factory=list)

    def environ(self) -> dict[str, str] | None:
        return {**os.environ, **self.env} if self.env else None

    def said(self) -> str:
        """One line for the user ("" when nothing was resolved)."""
        if not self.via:
            return ""
        return f"{'; '.join(self.via)}: recording {self.exe}, from its first instruction"


def resolve(exe: str, argv: list[str]) -> Launch:
    """The program `argv` (looked up as `exe`) ends up running, through the wrappers above."""
    out = Launch(exe, list(argv))
    for _ in range(_DEPTH):
        head = _head(out.exe)
        step = _pyenv(out, head) or _env_script(out, head)
        if step is None:
            break
        out = step
    return out


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(_HEAD)
    except OSError:
        return b""


def shebang(head: bytes) -> list[bytes] | None:
    """The words of a script's `#!` line (interpreter first), None for a file that is not one."""
    if not head.startswith(b"#!"):
        return None
    return head[2:].split(b"\n", 1)[0].split()


def _env_script(cur: Launch, head: bytes) -> Launch | None:
    """`#!/usr/bin/env [-S] NAME [ARGS]`: [NAME, ARGS..., script, args...] with NAME from PATH."""
    words = shebang(head)
    if words is None or not os.access(cur.exe, os.X_OK):
        return None  # not a script, or one the kernel would not run (no x bit): its exec says why
    if len(words) < 2 or os.path.basename(words[0]) != b"env":
        return None
    rest = [os.fsdecode(w) for w in words[1:]]
    if rest[0] == "-S":
        rest = rest[1:]
    elif len(rest) > 1:  # the kernel passes "NAME ARGS" as one argument: env looks for that name
        return None
    if not rest or rest[0].startswith("-") or "=" in rest[0]:
        return None  # env's options or VAR=value: run as written
    path = shutil.which(rest[0], path=cur.env.get("PATH"))
    if path is None:
        return None  # env says it cannot find it, as it would
    script = cur.argv[0] if "/" in cur.argv[0] else cur.exe
    argv = [rest[0], *rest[1:], script, *cur.argv[1:]]
    return Launch(path, argv, dict(cur.env), [*cur.via, f"{script} runs {rest[0]} through env"])


def _pyenv(cur: Launch, head: bytes) -> Launch | None:
    """A pyenv shim: the interpreter `pyenv which NAME` names, with its folder first in PATH."""
    if not head.startswith(b"#!"):
        return None
    m = _PYENV_SHIM.search(head)
    if m is None:
        return None
    name = os.path.basename(cur.exe)
    env = {**os.environ, **cur.env}
    root = _PYENV_ROOT.search(head)
    if root:
        env["PYENV_ROOT"] = os.fsdecode(root.group(1))
    try:
        p = subprocess.run([os.fsdecode(m.group(1)), "which", name], env=env, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = p.stdout.decode(errors="replace").strip()
    if p.returncode != 0 or not path.startswith("/") or not os.access(path, os.X_OK):
        return None  # the shim will say why when it runs
    new = {"PATH": os.path.dirname(path) + os.pathsep + env.get("PATH", "")}
    if root:
        new["PYENV_ROOT"] = env["PYENV_ROOT"]
    return Launch(path, [path, *cur.argv[1:]], {**cur.env, **new}, [*cur.via, f"{name} is a pyenv shim"])
