"""The tool's version: pyproject.toml's (its one source), found the same way however allocscope
runs — from a source checkout (pyproject.toml beside the packages), from the relocatable bundle
(its VERSION file, which scripts/bundle.sh writes from pyproject.toml; the bundle carries no
package metadata), or installed (the package's metadata)."""

from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import metadata
from pathlib import Path

UNKNOWN = "0+unknown"
_ROOT = Path(__file__).resolve().parents[1]  # a checkout's root; the bundle's python/


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


@lru_cache(maxsize=1)
def tool_version() -> str:
    text = _read(_ROOT / "pyproject.toml")
    if text:
        try:
            project = tomllib.loads(text).get("project") or {}
        except tomllib.TOMLDecodeError:
            project = {}
        if project.get("name") == "allocscope" and isinstance(project.get("version"), str):
            return project["version"]
    if (_ROOT.parent / "libexec" / "bootstrap.py").is_file():  # the bundle: ROOT/python/common/
        v = (_read(_ROOT.parent / "VERSION") or "").strip()
        if v:
            return v
    try:
        return metadata.version("allocscope")
    except metadata.PackageNotFoundError:
        return UNKNOWN
