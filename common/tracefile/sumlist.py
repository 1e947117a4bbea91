"""The writer's parts/checksums (checksums.py says what a line holds and why the list is
crash-safe): a part's line appended just after the part is renamed into place, fsynced with the
parts, and a whole new list for the parts directory `watch --keep` exchanges in
(TraceWriter.replace_parts). No pyarrow here."""

from __future__ import annotations

import os

from . import checksums as C


class ChecksumList:
    """parts/checksums as one writer keeps it: the lines it appended, by part name."""

    def __init__(self) -> None:
        self.fd = -1  # parts/checksums, created with the first part
        self.sums: dict[str, C.Sum] = {}

    def add(self, partsfd: int, name: str, size: int, crc: int, sync: bool) -> None:
        """Append a part's line (O_APPEND: one write, whole or not at all)."""
        if self.fd < 0:
            self.fd = open_list(partsfd)
            os.write(self.fd, C.HEADER)
        os.write(self.fd, C.line(name, size, crc))
        self.sums[name] = C.Sum(size, crc)
        if sync:
            os.fsync(self.fd)

    def fsync(self) -> None:
        """After the parts directory's fsync: a power loss never leaves a line of a part not renamed."""
        if self.fd >= 0:
            os.fsync(self.fd)

    def relist(self, newfd: int, partsfd: int) -> dict[str, C.Sum]:
        """The checksums of the parts of a new parts directory (replace_parts): a part linked
        from the current one (`partsfd`, same inode) keeps its line, one written into it is read."""
        sums: dict[str, C.Sum] = {}
        for n in os.listdir(newfd):
            if n.startswith(".") or n == C.NAME:
                continue
            st = os.stat(n, dir_fd=newfd, follow_symlinks=False)
            try:
                same = os.stat(n, dir_fd=partsfd, follow_symlinks=False).st_ino == st.st_ino
            except FileNotFoundError:
                same = False
            if same and n in self.sums:
                sums[n] = self.sums[n]
            else:
                sums[n] = C.Sum(*C.crc_file(n, newfd))
        return sums

    def reopen(self, partsfd: int, sums: dict[str, C.Sum]) -> None:
        """The list of a parts directory just exchanged in (written whole with `sums`), appended
        to from now on."""
        self.close()
        self.fd = open_list(partsfd)
        self.sums = sums

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


def open_list(partsfd: int) -> int:
    """parts/checksums, for appending."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(C.NAME, flags, 0o600, dir_fd=partsfd)
