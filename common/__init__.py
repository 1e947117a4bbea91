"""The layer both sides share: the error types, the trace file format (write, read, check) and
the ELF reader. Imports neither tracer/, reports/ nor allocscope/ (tests/test_layers.py)."""
