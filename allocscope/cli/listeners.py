"""The listeners of a live recording, built the one way for `record`, `top` and `watch`
(common/listeners.py: the SnapshotListener seam): `start_listeners` makes every exporter the
options ask for (`--metrics HOST:PORT`: the Prometheus one, reports/live/prometheus.py) and
returns them as one Listeners; the command adds its own view (a status line, the screen, the
`--batch` blocks) and hands `listeners.observer` to the recorder, or the Listeners to the watch.
Light at import (no pandas, no prometheus_client): --help and the option checks stay instant."""

from __future__ import annotations

import os
from collections.abc import Callable


def check_metrics(listen: str | None, labels: dict[str, str]) -> None:
    """--metrics and the --label pairs checked before anything is attached or listened on."""
    if listen is not None:
        from reports.live.prometheus import check_labels, parse_listen  # noqa: PLC0415

        parse_listen(listen)
        check_labels(labels)


def start_listeners(
    metrics: str | None,
    labels: dict[str, str],
    metrics_top: int = 10,
    say: Callable[[str], None] | None = None,
    workers: bool = False,
):
    """The exporters `record`, `top` and `watch` were asked for, listening from now on, as one
    common.listeners.Listeners (empty without any). `workers` (watch): several processes at once,
    told apart by pid. The caller says when each target starts and ends, and closes it."""
    from common.listeners import Listeners  # noqa: PLC0415

    out = Listeners()
    if metrics:
        from reports.live.prometheus import MetricsExporter  # noqa: PLC0415
        from tracer.process.cgroups import tightest_limit  # noqa: PLC0415

        exporter = MetricsExporter(metrics, labels, metrics_top, workers=workers, limit_of=tightest_limit)
        out.add(exporter)
        if say is not None:
            say(f"metrics on {exporter.url}")
    return out


def end_reason(summary, trace_path: str | None) -> str:
    """recording.end.reason of a finished recording: meta.json's `end` when the trace has it,
    else from the recorder's words ("target exited", "target exec'd ...", a signal, --duration)."""
    import json  # noqa: PLC0415

    if trace_path:
        try:
            with open(os.path.join(trace_path, "meta.json")) as f:
                end = json.load(f).get("end")
            if isinstance(end, dict) and end.get("reason"):
                return str(end["reason"])
        except (OSError, ValueError, AttributeError):
            pass
    said = getattr(summary, "end_reason", "") or ""
    if said == "target exited":
        return "exited"
    return "exec" if said.startswith("target exec") else "stopped"
