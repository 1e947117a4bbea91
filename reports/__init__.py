"""Offline readers of traces: no root, no BCC. Layers inside, each importing only those above it:

trace.py       load_trace: a trace into pandas (common.tracefile.reader)
wrappers.py    which functions are allocator wrappers folded out of stacks (built-in, --fold),
               without pandas: record and top check --fold before the heavy imports
symbolize/     (module, file offset) -> function, file, line, inlined frames; symbols
               embedded in a trace
analysis/      the report and diff documents (pandas): `from reports import analysis as A`
render/        one module per output format: text, JSON, CSV, HTML, pprof, folded stacks
live/          the live view of `top`, fed by the recorder's snapshots
"""
