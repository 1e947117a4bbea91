"""The `allocscope` command line: a thin adapter over tracer/ and reports/, a module per command.

Nothing is imported here: `allocscope.cli.entry` (the console script) must install the signal
handling before click or anything heavy loads. The click group is `allocscope.cli.app.main`.
"""
