"""The trace file, the contract between tracer and reports: `format` (tables, schemas, part
names, version), `writer` (crash-safe parts and meta.json), `reader` (a trace as pandas),
`conform` (what a reader accepts from a damaged part or meta.json). Import the module you need:
this package imports none of them, so the tracer never loads pandas through it."""
