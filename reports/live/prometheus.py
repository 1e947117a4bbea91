"""The Prometheus exporter (`--metrics HOST:PORT` of watch, record and top; docs/fleet.md): a
SnapshotListener (common/listeners.py) serving a recording's figures in Prometheus' exposition
format over HTTP, by prometheus_client from its own registry in a daemon thread. The figures are
computed by metrics.py (FleetMetrics) in a thread of ours, once per snapshot; a scrape only formats
the last computed ones. What it may not read itself (the target's memory cgroup: the tracer's
tracer/process/cgroups.py) its builder hands it as `limit_of` (allocscope/cli/listeners.py)."""

from __future__ import annotations

import errno
import re
import socket
import threading
import time
from collections.abc import Callable

from common.errors import UsageError
from common.listeners import Pump

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
WORKER_LABEL = "worker"  # watch: which of the processes followed at once a series is of
MAX_WORKERS = 32  # watch: the most processes served at once (the label set stays bounded)


def parse_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port); UsageError in one line otherwise."""
    host, sep, port = (listen or "").rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--metrics wants HOST:PORT (e.g. --metrics 127.0.0.1:9479), not {listen!r}")
    return host, int(port)


def check_labels(labels: dict[str, str]) -> None:
    """Every --label key must be a Prometheus label name, and none of the exporter's own."""
    from .metrics import OWN_LABELS  # noqa: PLC0415 (the analysis, pandas: only with --metrics)

    for k in labels:
        if not LABEL_NAME.fullmatch(k) or k.startswith("__"):
            raise UsageError(f"--label {k}=...: with --metrics a label name is [a-zA-Z_][a-zA-Z0-9_]* (not __...)")
        if k in OWN_LABELS or k == WORKER_LABEL:
            raise UsageError(f"--label {k}=...: with --metrics {k!r} is a label of the exporter's own; pick another")


class Cost:
    """CPU seconds the exporter spent (its thread, and the scrapes' threads while collecting)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds = 0.0

    def add(self, since: float) -> None:
        with self.lock:
            self.seconds += time.thread_time() - since


class _Collector:
    """prometheus_client's view of the exporter's FleetMetrics (one per worker under watch): the
    target's labels added to every series, `worker` too where there are workers, and the
    exporter's own CPU (allocscope_exporter_cpu_seconds)."""

    def __init__(self, exporter, labels: dict[str, str], cost: Cost) -> None:
        self.exporter = exporter
        self.names = list(labels)
        self.values = list(labels.values())
        self.cost = cost

    def collect(self):
        from prometheus_client.core import (  # noqa: PLC0415
            CounterMetricFamily,
            GaugeMetricFamily,
            InfoMetricFamily,
        )

        t0 = time.thread_time()
        own_cpu = CounterMetricFamily(
            "allocscope_exporter_cpu_seconds",
            "CPU the exporter used in the tracer: its figures per snapshot and the scrapes",
            labels=self.names,
        )
        own_cpu.add_metric(self.values, self.cost.seconds)
        yield own_cpu
        out: dict[str, object] = {}  # one family per name, the workers' samples in it
        for worker, metrics in self.exporter.figures():
            names = self.names + ([WORKER_LABEL] if worker is not None else [])
            values = self.values + ([str(worker)] if worker is not None else [])
            for f in metrics.families():
                own = [k for k, _ in f.samples[0][0]] if f.samples else []
                m = out.get(f.name)
                if f.kind == "info":
                    if m is None:
                        m = out[f.name] = InfoMetricFamily(f.name, f.help, labels=names)
                    for labels, _v in f.samples:
                        m.add_metric(values, dict(labels))  # type: ignore[attr-defined]
                else:
                    if m is None:
                        cls = CounterMetricFamily if f.kind == "counter" else GaugeMetricFamily
                        m = out[f.name] = cls(f.name, f.help, labels=names + own)
                    for labels, v in f.samples:
                        m.add_metric(values + [val for _, val in labels], v)  # type: ignore[attr-defined]
        yield from out.values()
        self.cost.add(t0)


class Merged:
    """Snapshots (tracer.record.snapshot.Snapshot) taken as one: the site counters are cumulative
    and `sites` is the recorder's current table, so the latest snapshot with the union of the
    changed keys and of the new stacks is what all of them were, in order."""

    def __init__(self, snap) -> None:
        self.seq, self.final, self.row, self.sites = snap.seq, snap.final, snap.row, snap.sites
        self.changed = list(snap.changed)
        self.stack_columns = {k: list(v) for k, v in snap.stack_columns.items()} if snap.stack_columns else None
        self.names = dict(snap.names)
        self.allocator = getattr(snap, "allocator", "")
        self.allocators = getattr(snap, "allocators", ())
        self.first_allocators = self.allocators  # the earliest rows: what was resident at the attach
        self.blocked = getattr(snap, "blocked", ())
        self.python = tuple(getattr(snap, "python", ()))  # CPython's frames of the new stacks
        self.count = 1

    def merge(self, snap) -> None:
        self.seq, self.final, self.row, self.sites = snap.seq, snap.final, snap.row, snap.sites
        seen = set(self.changed)
        self.changed += [k for k in snap.changed if k not in seen]
        if snap.stack_columns:
            if self.stack_columns is None:
                self.stack_columns = {k: list(v) for k, v in snap.stack_columns.items()}
            else:
                for k, v in snap.stack_columns.items():
                    self.stack_columns[k] += list(v)
        self.names.update(snap.names)
        self.allocator = getattr(snap, "allocator", "") or self.allocator
        self.allocators = getattr(snap, "allocators", ()) or self.allocators
        self.first_allocators = self.first_allocators or self.allocators
        self.blocked = getattr(snap, "blocked", ())
        self.python += tuple(getattr(snap, "python", ()))
        self.count += 1


class Worker:
    """One process's figures on the exporter: its FleetMetrics (whose counters outlive each
    incarnation that used the slot), its pid (0: none now), the snapshot queued and not taken."""

    def __init__(self, index: int | None, metrics) -> None:
        self.index = index
        self.metrics = metrics
        self.pid = 0
        self.open: Merged | None = None


class MetricsExporter:
    """Serves a recording's metrics on `listen` (HOST:PORT) with the target's `labels` on every
    series and the top `top_k` locations and waits. `observe` is a recorder observer (cheap: a
    queue put); `target_started`/`target_ended` mark incarnations (watch: every restart).

    `workers` (watch): several processes at once, each on a slot of its own told apart by the
    `worker` label ("0", "1"...: the lowest slot free when it started; a restart takes the slot
    its predecessor freed), at most MAX_WORKERS of them: the label set stays bounded however
    many processes come and go; one beyond the cap is traced but not served (target_started
    says False)."""

    def __init__(
        self,
        listen: str,
        labels: dict[str, str],
        top_k: int = 10,
        fold=None,
        workers: bool = False,
        limit_of: Callable[[int], int | None] | None = None,
    ) -> None:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415
        from prometheus_client.exposition import start_http_server  # noqa: PLC0415

        host, port = parse_listen(listen)
        if top_k < 1:
            raise UsageError(f"--metrics-top wants a positive number, not {top_k}")
        check_labels(labels)
        self.labels = dict(labels)
        self.top_k, self.fold, self.workers = top_k, fold, workers
        self.limit_of = limit_of  # pid -> the tightest memory cgroup limit (None: no such gauge)
        self.slots: list[Worker] = []
        self._slot(0 if workers else None)
        self.registry = CollectorRegistry(auto_describe=False)
        self.cost = Cost()
        self.registry.register(_Collector(self, self.labels, self.cost))  # type: ignore[arg-type]
        try:
            self.server, self.thread = start_http_server(port, host, self.registry)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UsageError(f"--metrics {listen}: the address is in use (another exporter there?)") from None
            if isinstance(e, socket.gaierror) or e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                raise UsageError(f"--metrics {listen}: no such local address") from None
            raise UsageError(f"--metrics {listen}: cannot listen there: {e.strerror or e}") from None
        self.address = self.server.server_address[:2]
        self.lock = threading.Lock()
        self.by_pid: dict[int, Worker] = {}  # the processes served now (workers)
        self.snapshots = 0  # (merged) snapshots handled
        self.pump = Pump(self._handle, "allocscope-metrics")
        self.closed = False

    def _slot(self, index: int | None) -> Worker:
        from .metrics import FleetMetrics  # noqa: PLC0415

        w = Worker(index, FleetMetrics(self.top_k, self.fold, self.slots[0].metrics.sym if self.slots else None))
        self.slots.append(w)
        return w

    @property
    def metrics(self):
        """The first slot's figures (record, top: the only one)."""
        return self.slots[0].metrics

    def figures(self) -> list[tuple[int | None, object]]:
        """(worker index or None, its FleetMetrics) for every slot, in order (any thread)."""
        return [(w.index, w.metrics) for w in list(self.slots)]

    @property
    def url(self) -> str:
        host, port = str(self.address[0]), int(self.address[1])
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def _of(self, pid: int) -> Worker | None:
        return self.by_pid.get(pid) if self.workers else self.slots[0]

    def observe(self, snap, pid: int = 0) -> None:
        """In the recorder's thread: a queue put, or, while the snapshot queued last is still
        waiting (the exporter's thread is behind: a first symbolization, a busy box), merged
        into it — the queue holds at most one snapshot per incarnation, whatever the delay."""
        with self.lock:
            w = self._of(pid)
            if w is None:
                return
            if w.open is not None:
                w.open.merge(snap)
                return
            w.open = Merged(snap)
            self.pump.observe(("snap", w, w.open))

    def target_started(self, pid: int, comm: str, trace_path: str | None, launched: bool = False) -> bool:
        """A new incarnation; False when it has no slot (workers: MAX_WORKERS served already)."""
        with self.lock:
            w: Worker | None = self.slots[0]
            if self.workers:
                busy = {x.index for x in self.by_pid.values()}
                w = next((x for x in self.slots if x.index not in busy), None)
                if w is None and len(self.slots) < MAX_WORKERS:
                    w = self._slot(len(self.slots))
                if w is None:
                    return False
                self.by_pid[pid] = w
            assert w is not None
            w.open = None  # the next snapshot is the new incarnation's
            self.pump.observe(("start", w, (pid, comm, trace_path, launched)))
            return True

    def target_ended(self, reason: str, pid: int = 0) -> None:
        with self.lock:
            w = self.by_pid.pop(pid, None) if self.workers else self.slots[0]
            if w is None:
                return
            w.open = None
            self.pump.observe(("end", w, reason))

    def _handle(self, item) -> None:
        t0 = time.thread_time()
        try:
            self._apply(item)
        finally:
            self.cost.add(t0)

    def _apply(self, item) -> None:
        what, w, arg = item
        if what == "flush":
            arg.set()
            return
        m = w.metrics
        if what == "snap":
            with self.lock:
                if w.open is arg:
                    w.open = None  # taken: what comes next is queued anew
            self.snapshots += 1
            if w.pid and not arg.final:
                m.cgroup_limit = self._limit(w.pid)
            m.update(arg)
        elif what == "start":
            w.pid = int(arg[0])
            m.cgroup_limit = self._limit(w.pid) if w.pid else None
            m.started(*arg)
        elif what == "end":
            w.pid = 0
            m.ended(arg)

    def _limit(self, pid: int) -> int | None:
        return self.limit_of(pid) if self.limit_of is not None else None

    def flush(self) -> None:
        """Wait until everything queued so far is in the served figures (tests)."""
        done = threading.Event()
        self.pump.observe(("flush", None, done))
        done.wait()

    def close(self) -> None:
        """Stop serving (what was queued is handled first)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.pump.close()
        finally:
            self.server.shutdown()
            self.server.server_close()


__all__ = ["MAX_WORKERS", "WORKER_LABEL", "MetricsExporter", "check_labels", "parse_listen"]
