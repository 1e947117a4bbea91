"""The live view of a recording in progress (`allocscope top`, `record`'s status line), fed by
the recorder's snapshots instead of a trace file:

    model.py  the model, updated snapshot by snapshot (pure data)
    text.py   the model as text: the full screen's styled lines, `top --batch`'s blocks, the
              status line (the CLI draws them: allocscope/cli/screen.py, watch.py)
    metrics.py     the fleet's figures per snapshot (pure data)
    prometheus.py  `--metrics`: the Prometheus exporter, a SnapshotListener (common/listeners.py)
"""
