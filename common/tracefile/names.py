"""The trace's names that code outside the format needs without importing pyarrow (the CLI
checks an output path before anything heavy is imported): the format tag and the file names."""

FORMAT = "allocscope.trace"
META = "meta.json"
PARTS = "parts"
