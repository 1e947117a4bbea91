"""The probes built while the rest of the tracer loads.

Building the probes (tracer/bpf/program.py: BCC's maps-only compile, the verifier) is ~1 s of native
code that releases the GIL; importing the tracer (pyarrow, numpy, capstone) and scanning the
target's allocators is ~0.5 s of Python. `EarlyProbes(target, opts)`, started by the CLI as
soon as the target is known, does the first in a thread while the main thread does the second;
tracer.record.recorder.Recorder takes the result. Nothing here imports BCC or pyarrow at import time.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .probes import Probes


class EarlyProbes:
    def __init__(self, pid: int, opts, launched: bool) -> None:
        self.pid, self.opts, self.launched = pid, opts, launched
        self.t_start = time.perf_counter()
        self.seconds = 0.0
        self._probes: Probes | None = None
        self._error: BaseException | None = None
        self._taken = False
        self._thread = threading.Thread(target=self._build, name="build probes", daemon=True)
        self._thread.start()

    def _build(self) -> None:
        try:
            t = time.perf_counter()
            from .probes import Probes  # noqa: PLC0415 (imports bcc)

            imported = time.perf_counter() - t
            self._probes = Probes(self.pid, self.opts, launched=self.launched)
            program = self._probes.program
            program.timings = {"import the probes' modules (in the thread)": imported, **program.timings}
        except BaseException as e:  # noqa: BLE001 (re-raised in the thread that takes the result)
            self._error = e
        self.seconds = time.perf_counter() - self.t_start

    def result(self):
        """The Probes (joined), or the exception building them raised."""
        self._thread.join()
        self._taken = True
        if self._error is not None:
            raise self._error
        return self._probes

    def discard(self) -> None:
        """The recording did not start: wait for the build and free what it made."""
        if self._taken:
            return
        self._thread.join()
        self._taken = True
        if self._probes is not None:
            self._probes.close()
