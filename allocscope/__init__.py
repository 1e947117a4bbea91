"""allocscope: an eBPF allocation tracer for large native daemons (CLI package)."""
__version__ = "0.1.0"
