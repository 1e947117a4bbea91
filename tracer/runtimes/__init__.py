"""Language runtimes whose own frames join the native stacks (issue 52: one module per runtime).

A runtime module finds its interpreter in the target (its library or executable in the maps),
knows the interpreter's layout, keeps the probe's maps of it current (which threads run it,
where their frames are), and reads from the running process what the frames name (code objects)
into the trace. Today: `python.py` (CPython 3.11-3.13; probes/python.h walks the frames). A next
runtime goes beside it: docs/architecture.md lists the files.
"""
