"""The tool's version, from the installed package's metadata (pyproject.toml is its one source)."""
from __future__ import annotations

from functools import lru_cache
from importlib import metadata


@lru_cache(maxsize=1)
def tool_version() -> str:
    try:
        return metadata.version("allocscope")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"
