"""Symbol names for people: C++ (Itanium, via cxxfilt), Rust legacy (hash suffix dropped) and
Rust v0 (via rust_demangler); any other name passes unchanged."""

from __future__ import annotations

import re
from functools import lru_cache

try:  # both are declared dependencies; stay importable (and non-demangling) without them
    import cxxfilt
except Exception:  # noqa: BLE001 - depends on the host's libstdc++
    cxxfilt = None  # type: ignore[assignment]
try:
    import rust_demangler
except Exception:  # noqa: BLE001
    rust_demangler = None  # type: ignore[assignment]

_RUST_LEGACY_RE = re.compile(r"^_?_ZN.*17h[0-9a-f]{16}E(?:\.[\w.$]*)?$")
_RUST_HASH_RE = re.compile(r"::h[0-9a-f]{16}$")
_RUST_V0_RE = re.compile(r"^_?_R[0-9A-Z]")


@lru_cache(maxsize=1 << 16)
def demangle(name: str) -> str:
    """Demangle a C++ (Itanium), Rust legacy or Rust v0 symbol; other names pass unchanged.

    Rust legacy names lose their trailing ``::h<16 hex>`` hash. Never raises: a name
    that fails to demangle is returned as given.
    """
    try:
        if _RUST_LEGACY_RE.match(name):
            return _demangle_rust_legacy(name)
        if _RUST_V0_RE.match(name):
            return _demangle_rust_v0(name)
        if name.startswith(("_Z", "__Z")):
            return _demangle_itanium(name)
    except Exception:  # noqa: BLE001 - a bad mangled name must never escape
        pass
    return name


def _demangle_itanium(name: str) -> str:
    if cxxfilt is None:
        return name
    try:
        return cxxfilt.demangle(name.removeprefix("_") if name.startswith("__Z") else name)
    except Exception:  # noqa: BLE001 - cxxfilt.InvalidName and ctypes trouble alike
        return name


def _demangle_rust_legacy(name: str) -> str:
    text = None
    if rust_demangler is not None:
        try:
            text = rust_demangler.demangle(name)
        except Exception:  # noqa: BLE001
            text = None
    if not text:
        text = _demangle_itanium(name)
    return _RUST_HASH_RE.sub("", text)


def _demangle_rust_v0(name: str) -> str:
    if rust_demangler is None:
        return name
    try:
        text = rust_demangler.demangle(name)
    except Exception:  # noqa: BLE001
        return name
    return text or name
