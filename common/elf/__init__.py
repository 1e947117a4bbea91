"""The one ELF reader: what unwinding, allocator detection (whose function offsets and sizes probe
placement works from), symbol embedding and symbolizing need from an ELF file. pyelftools reads
the container (headers, sections, notes, compressed sections); this package adds the policy on
top, a module by concern, every public name importable from `common.elf` itself:

* container.py: `open_elf` opens a file as ELF or gives None (missing, unreadable, truncated, not
  ELF); `OpenedElf.open` raises instead, for callers that report why. `segments` /
  `offset_to_vaddr` / `vaddr_to_offset`: file offsets <-> virtual addresses through the PT_LOAD
  program headers (PIE, shared libraries and fixed-address executables alike). `elf_build_id`:
  the GNU build ID from the notes. `section_bytes`, `has_section`, `exec_ranges`, `is_static`:
  section contents (decompressed), the address ranges of code, static linking.
* debugfiles.py: `debuglink`, `find_debug_file`, `find_alt_file`: separate debug files, where gdb
  looks for them (`<debug dir>/.build-id/xx/yyyy.debug`, `.gnu_debuglink` beside the file, in
  `.debug/` and under the debug dir), and dwz's supplementary file (`.gnu_debugaltlink`).
* symbols.py: `read_symbols` / `SymbolTable` / `module_symbols` / `defined_functions`: the
  function symbols of `.symtab` and `.dynsym`, one name chosen per address.
* raw.py: `RawElf`, the headers read with struct (no pyelftools), for scans of every module.
* query.py: `build_id` and `query_functions` (the symbol tables vectorised with numpy): RawElf
  first, pyelftools where it gives up.

Nothing here raises for a bad file except `OpenedElf.open`; nothing keeps a file open after its
`OpenedElf` is closed.
"""

from __future__ import annotations

from .container import (  # noqa: F401
    SHF_EXECINSTR,
    OpenedElf,
    Segment,
    elf_build_id,
    exec_ranges,
    has_section,
    is_static,
    offset_to_vaddr,
    open_elf,
    section_bytes,
    segments,
    vaddr_to_offset,
)
from .debugfiles import (  # noqa: F401
    DEBUG_DIRS,
    Progress,
    build_id_path,
    debug_file_candidates,
    debuglink,
    find_alt_file,
    find_debug_file,
)
from .query import FunctionQuery, build_id, query_functions  # noqa: F401
from .raw import SHT_NOBITS, RawElf, RawSection  # noqa: F401
from .symbols import (  # noqa: F401
    STT_FUNC,
    STT_GNU_IFUNC,
    STT_NOTYPE,
    RawSymbol,
    SymbolTable,
    defined_functions,
    module_symbols,
    read_symbols,
)
