"""allocscope: an eBPF allocation tracer for large native daemons (CLI package). Its version is
pyproject.toml's, however it runs (checkout, bundle, installed): common.version.tool_version()."""
