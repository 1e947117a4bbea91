"""`--fold`: which application wrappers are folded out of sites. Apart from reports/analysis/stacks.py
(which imports pandas) so that `top` and `record` can check `--fold` before the heavy imports."""

from __future__ import annotations

import fnmatch
import os
import re

from common.errors import UsageError

# Application wrappers around malloc, folded out of sites like the language wrappers above: the
# code that asked for memory is the frame right outside them. (library, glob patterns matched
# against the whole function name, case-sensitive); listed in the report when they fold a frame.
APP_WRAPPERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("redis", ("zmalloc*", "ztrymalloc*", "zcalloc*", "ztrycalloc*", "zrealloc*", "ztryrealloc*", "zstrdup")),
    (
        "cpython",
        (
            "PyObject_Malloc",
            "PyObject_Calloc",
            "PyObject_Realloc",
            "_PyObject_Malloc",
            "_PyObject_Calloc",
            "_PyObject_Realloc",
            "PyMem_*",
            "_PyMem_*",
            "pymalloc_alloc",
            "pymalloc_realloc",
            "_PyObject_Arena*",
            "new_arena",
            "allocate_from_new_pool",
        ),
    ),
    (
        "glib",
        (
            "g_malloc*",
            "g_realloc*",
            "g_try_malloc*",
            "g_try_realloc*",
            "g_slice_alloc*",
            "g_memdup*",
            "g_strdup*",
            "g_strndup",
        ),
    ),
    (
        "openssl",
        (
            "CRYPTO_malloc",
            "CRYPTO_zalloc",
            "CRYPTO_realloc",
            "CRYPTO_clear_realloc",
            "CRYPTO_memdup",
            "CRYPTO_strdup",
            "CRYPTO_strndup",
            "CRYPTO_secure_malloc",
            "CRYPTO_secure_zalloc",
        ),
    ),
    (
        "xmalloc",
        (
            "xmalloc",
            "xcalloc",
            "xzalloc",
            "xrealloc",
            "xreallocarray",
            "xnmalloc",
            "xnrealloc",
            "x2realloc",
            "x2nrealloc",
            "xcharalloc",
            "xmemdup",
            "xstrdup",
            "xstrndup",
        ),
    ),
)

USER_FOLD = "--fold"  # the `from` of a pattern the user gave

_GLOB_CHARS = frozenset("*?[")

_OPEN, _CLOSE = "<([", ">)]"


def _split_fold(value: str) -> list[str]:
    """'a,b' -> ['a', 'b']; a comma inside <...>, (...) or [...] belongs to the name
    (`std::map<int, int>::insert`, `f(int, long)`)."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in value:
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE and depth:
            depth -= 1
        cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out]


def parse_fold(values: str | list[str] | tuple[str, ...] | None) -> Folding:
    """The one normalizer of `--fold FUNC[,FUNC]` (repeatable) for every command: FUNC is an
    exact function name, or a glob (fnmatch `*`, `?`, `[...]`, case-sensitive) when it holds one
    of those; either way it is matched against the whole symbolized name (C++ names include
    their parameters: `Pool::get*`). Duplicates are dropped, order kept. UsageError for an empty
    name or a pattern without a literal character (it would fold every frame)."""
    if isinstance(values, str):
        values = [values]
    patterns: list[str] = []
    for value in values or ():
        for p in _split_fold(value):
            if not p:
                raise UsageError(f"--fold wants FUNC[,FUNC...] (e.g. --fold my_alloc,'pool_*'), not {value!r}")
            if not set(p) - _GLOB_CHARS - set("]!"):
                raise UsageError(
                    f"--fold {p!r} would fold every frame: give a function name or a pattern "
                    "with some of its letters (e.g. 'pool_*')"
                )
            if p not in patterns:
                patterns.append(p)
    return Folding(tuple(patterns))


class Folding:
    """Which application wrappers are folded out of sites (allocator entry points and language
    wrappers, WRAPPER_PATTERNS, always are): the built-in APP_WRAPPERS plus the user's `--fold`
    patterns. Build it with `parse_fold`; `None` anywhere a `fold` is taken means the built-ins
    only."""

    def __init__(self, user: tuple[str, ...] = ()) -> None:
        self.user = tuple(user)
        self.patterns: list[tuple[str, str]] = [(lib, p) for lib, pats in APP_WRAPPERS for p in pats] + [
            (USER_FOLD, p) for p in self.user
        ]
        self._rx = [
            (src, p, re.compile(fnmatch.translate(p) if _GLOB_CHARS & set(p) else re.escape(p) + r"\Z"))
            for src, p in self.patterns
        ]
        self._any = re.compile("|".join(f"(?:{rx.pattern})" for _, _, rx in self._rx))
        self._cache: dict[str, tuple[str, str] | None] = {}

    def match(self, function: str) -> tuple[str, str] | None:
        """(library or '--fold', pattern) of the first pattern matching the whole name, or None."""
        if function in self._cache:
            return self._cache[function]
        hit = None
        if self._any.match(function):
            hit = next((src, p) for src, p, rx in self._rx if rx.match(function))
        self._cache[function] = hit
        return hit

    def __repr__(self) -> str:
        return f"Folding(user={self.user!r})"


DEFAULT_FOLDING = Folding()


NO_CALLER = "[no caller with a symbol]"  # the function of a stripped library's location with no caller known


def frame_name(function: str, where: str = "", call: str | None = None, inside: str | None = None) -> str:
    """A frame or location as people read it: the function and `where` (' file.c:12'), then the
    CUDA call it made (' via cudaMalloc', stacks.fold_frames), and for a stripped module's frames
    kept under the code that called into them (stacks.located) 'inside libcuda.so.1, called
    from cuCtxCreate_v2' ('inside libcuda.so.1, no caller with a symbol': NO_CALLER)."""
    text = f"{function}{where}" + (f" via {call}" if call else "")
    if inside and function == NO_CALLER:
        return f"inside {os.path.basename(inside)}, no caller with a symbol" + (f" via {call}" if call else "")
    return f"inside {os.path.basename(inside)}, called from {text}" if inside else text
