"""What the reader found of a trace's parts: verified against parts/checksums (checksums.py),
read without a checksum, or damaged (a part not as written, truncated, missing, unreadable or
not a part of its table). load_trace fills one `Integrity` per trace (Trace.integrity); the
reports withhold what depends on a damaged table and the CLI exits non-zero for it.

A recording that was killed is no damage: parts after its last `intervals` part are not read,
and the one part a kill can leave unlisted (renamed, its line not yet appended) reads as "not
verifiable (written after the last checksum)". A trace written before the checksums reads as
before: "not verifiable".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import checksums as C
from .format import parse_part_name

EVERY_TABLE = "*"  # a damage every table depends on (the checksum list itself)


@dataclass(frozen=True)
class Damage:
    part: str  # the file's name under parts/
    table: str  # the table it holds, EVERY_TABLE for the checksum list
    problem: str

    def text(self) -> str:
        return f"parts/{self.part}: {self.problem}"


@dataclass
class Integrity:
    """How a trace's parts read: `status` verified, not_verifiable or damaged."""

    checksums: str | None = None  # meta.json `checksums`: the writer listed its parts (None: an older trace)
    listed: dict[str, C.Sum] | None = None  # parts/checksums (None: none)
    damaged: list[Damage] = field(default_factory=list)
    verified: int = 0  # parts read and found as written
    unverified: list[str] = field(default_factory=list)  # parts read without a checksum
    complete: bool = True  # meta.json `complete` (a list may miss the last part of a killed recording)

    @classmethod
    def open(cls, pdir: str, meta: dict) -> Integrity:
        """Read parts/checksums of the parts directory `pdir` (meta: the trace's meta.json)."""
        algo = meta.get("checksums")
        it = cls(checksums=algo if isinstance(algo, str) else None, complete=bool(meta.get("complete")))
        path = os.path.join(pdir, C.NAME)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = None
        except OSError as e:
            it.damage(C.NAME, EVERY_TABLE, f"cannot be read ({e.strerror}): no part can be verified")
            return it
        if data is None:
            if it.checksums:
                try:  # the writer makes the list with the first part: no part, no list
                    parts = [n for n in os.listdir(pdir) if parse_part_name(n)]
                except OSError:
                    parts = []
                if parts:
                    it.damage(C.NAME, EVERY_TABLE, "missing: meta.json says the parts are listed; none can be verified")
            return it
        if it.checksums not in (None, C.ALGORITHM):
            it.damage(C.NAME, EVERY_TABLE, f"of an unknown kind ({it.checksums!r}): no part can be verified")
            return it
        listed, wrong = C.parse(data)
        if wrong:
            it.damage(C.NAME, EVERY_TABLE, f"damaged ({wrong}): no part can be verified")
            return it
        it.listed = listed
        return it

    def damage(self, part: str, table: str, problem: str) -> None:
        self.damaged.append(Damage(part, table, problem))

    def admit(self, pdir: str, name: str, table: str) -> bool:
        """Whether to read the part `name` of `table`: as written, or not verifiable. A part
        that is not as written is recorded as damaged and not read."""
        if any(d.table == EVERY_TABLE for d in self.damaged):
            self.unverified.append(name)
            return True
        if self.listed is None:
            self.unverified.append(name)
            return True
        want = self.listed.get(name)
        if want is None:
            if not self.complete:  # a killed recording's last part: renamed, its line not appended yet
                self.unverified.append(name)
                return True
            self.damage(name, table, "not in the checksum list: not a part this recording wrote (renamed or added?)")
            return False
        problem = C.check(os.path.join(pdir, name), want)
        if problem:
            self.damage(name, table, problem)
            return False
        self.verified += 1
        return True

    def missing(self, present: set[str], last: int) -> None:
        """Every listed part that is not there is missing; in an incomplete trace only those up
        to its last interval read (`last`): the parts after it are not read, and a power loss
        may take them (the list is fsynced with the parts, after them)."""
        for name in sorted(self.listed or {}):
            if name in present:
                continue
            stem = name.removesuffix(".parquet")
            parsed = parse_part_name(name)
            table = parsed[0] if parsed else stem.rpartition("-")[0] or "?"
            seq = stem.rpartition("-")[2]
            if not self.complete and seq.isdigit() and int(seq) > last:
                continue
            self.damage(name, table, "missing (the checksum list has it)")

    @property
    def status(self) -> str:
        if self.damaged:
            return "damaged"
        return "verified" if self.listed is not None else "not_verifiable"

    @property
    def tables(self) -> list[str]:
        """The damaged tables (EVERY_TABLE: all of them)."""
        return sorted({d.table for d in self.damaged})

    def note(self) -> str | None:
        """One sentence on what was verified, None when every part read was."""
        if self.damaged:
            n = len(self.damaged)
            by: dict[str, int] = {}
            for d in self.damaged:
                by[d.table] = by.get(d.table, 0) + 1
            names = [
                ("the checksum list" if t == EVERY_TABLE else t) + (f" ({k})" if k > 1 else "")
                for t, k in sorted(by.items())
            ]
            tables = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
            of = "table" if len(names) == 1 else "tables"
            return f"damaged trace: {n} part{'' if n == 1 else 's'} not as written or missing, of {of} {tables}"
        if self.listed is None:
            return "parts not verifiable: the trace was written before allocscope kept their checksums"
        if self.unverified:
            n = len(self.unverified)
            return (
                f"{n} part{'' if n == 1 else 's'} not verifiable: written after the last checksum "
                f"(the recording was interrupted): {', '.join(self.unverified)}"
            )
        return None
