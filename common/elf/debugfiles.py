"""Separate debug files, found where gdb looks for them (`<debug dir>/.build-id/xx/yyyy.debug`,
`.gnu_debuglink` beside the file, in `.debug/` and under the debug dir), and dwz's supplementary
file (`.gnu_debugaltlink`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator

from elftools.elf.elffile import ELFFile

from .container import OpenedElf, elf_build_id, open_elf

Progress = Callable[[str], None]
DEBUG_DIRS = ("/usr/lib/debug",)


def _quiet(_message: str) -> None:
    pass


def debuglink(elf: ELFFile) -> str | None:
    """File name stored in `.gnu_debuglink` (the CRC that follows is not checked)."""
    section = elf.get_section_by_name(".gnu_debuglink")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return None
    name = section.data().split(b"\0", 1)[0]
    return os.fsdecode(name) or None


def build_id_path(debug_dir: str, bid: str) -> str:
    """`<debug_dir>/.build-id/xx/yyyy.debug` for build ID xxyyyy."""
    return os.path.join(debug_dir, ".build-id", bid[:2], bid[2:] + ".debug")


def debug_file_candidates(
    module_path: str, bid: str | None, link: str | None, debug_dirs: Iterable[str]
) -> Iterator[str]:
    """Where gdb would look for separate debug info, in gdb's order."""
    dirs = list(debug_dirs)
    if bid and len(bid) > 2:
        for d in dirs:
            yield build_id_path(d, bid)
    if link:
        here = os.path.dirname(os.path.abspath(module_path))
        yield os.path.join(here, link)
        yield os.path.join(here, ".debug", link)
        for d in dirs:
            yield os.path.join(d, here.lstrip("/"), link)


def find_debug_file(
    path: str, bid: str | None, link: str | None, debug_dirs: Iterable[str] = DEBUG_DIRS, progress: Progress = _quiet
) -> OpenedElf | None:
    """First separate debug file of the module at `path` that exists, is ELF and (when both
    IDs are known) has build ID `bid`."""
    own = os.path.realpath(path)
    for candidate in debug_file_candidates(path, bid, link, debug_dirs):
        if not os.path.isfile(candidate) or os.path.realpath(candidate) == own:
            continue
        found = open_elf(candidate)
        if found is None:
            continue
        candidate_id = elf_build_id(found.elf)
        if bid and candidate_id and candidate_id != bid:
            found.close()
            continue
        progress(f"{path}: debug info from {candidate}")
        return found
    return None


def find_alt_file(
    dwarf_file: OpenedElf, debug_dirs: Iterable[str] = DEBUG_DIRS, progress: Progress = _quiet
) -> OpenedElf | None:
    """The dwz supplementary file named by `.gnu_debugaltlink` (its path, then its build ID)."""
    section = dwarf_file.elf.get_section_by_name(".gnu_debugaltlink")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return None
    raw_name, _, raw_id = section.data().partition(b"\0")
    name, alt_id = os.fsdecode(raw_name), raw_id.hex() or None
    candidates = [os.path.join(os.path.dirname(dwarf_file.path), name)]
    if alt_id:
        candidates += [build_id_path(d, alt_id) for d in debug_dirs]
    for candidate in candidates:
        found = open_elf(candidate) if os.path.isfile(candidate) else None
        if found is None:
            continue
        if alt_id and elf_build_id(found.elf) not in (None, alt_id):
            found.close()
            continue
        progress(f"{dwarf_file.path}: supplementary DWARF from {candidate}")
        return found
    progress(f"{dwarf_file.path}: supplementary DWARF {name} not found")
    return None
