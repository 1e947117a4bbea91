"""allocscope: an eBPF allocation tracer for large native daemons (CLI package). Its version is
the installed package's (pyproject.toml): common.version.tool_version()."""
