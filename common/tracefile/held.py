"""Held parts (TraceWriter's hold_s > 0; why and what a SIGKILL loses: writer.py): small parts
kept in memory and written together at the end of an interval every `hold_s` seconds, one part
per table holding the rows of all the intervals since the last write, named with the last of
them, the `intervals` part last."""

from __future__ import annotations

import pyarrow as pa

HOLD_BYTES = 4 << 20  # held parts (Arrow bytes) past this are written at the interval's end, whatever hold_s


class HeldParts:
    """The parts held since the last write, in the order they came."""

    def __init__(self, hold_s: float, clock) -> None:
        self.hold_s = hold_s
        self._clock = clock
        self._parts: list[tuple[str, int, pa.Table]] = []  # (table, seq, part) not written yet, in order
        self._bytes = 0
        self._written_at: float | None = None  # when held intervals were last written (None: never)

    def __bool__(self) -> bool:
        return bool(self._parts)

    def hold(self, table: str, seq: int, data: pa.Table, nbytes: int) -> bool:
        """Keep a part; True when what is held is due: at an interval's end (its `intervals`
        part), the first one, or hold_s after the last write, or past HOLD_BYTES."""
        self._parts.append((table, seq, data))
        self._bytes += nbytes
        return table == "intervals" and (
            self._written_at is None or self._clock() - self._written_at >= self.hold_s or self._bytes >= HOLD_BYTES
        )

    def take(self) -> list[tuple[str, int, pa.Table]]:
        """What is held, taken, as the parts to write: per table one part of all its rows, named
        with its last seq (a table whose parts' columns disagree: one part each); `intervals`
        last (a reader takes nothing named after the last one)."""
        held, self._parts, self._bytes = self._parts, [], 0
        tables: dict[str, list[tuple[int, pa.Table]]] = {}
        for table, seq, data in held:
            tables.setdefault(table, []).append((seq, data))
        if "intervals" in tables:
            tables["intervals"] = tables.pop("intervals")  # last
            self._written_at = self._clock()
        out = []
        for table, parts in tables.items():
            try:
                data = pa.concat_tables([d for _, d in parts], promote_options="default") if len(parts) > 1 else None
            except (pa.ArrowException, ValueError, TypeError):  # columns that disagree: one part each
                data = None
            if data is None:
                out += [(table, seq, d) for seq, d in parts]
            else:
                out.append((table, parts[-1][0], data))
        return out
