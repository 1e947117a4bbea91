"""`allocscope watch`: follow a daemon across restarts, one trace per incarnation (docs/watch.md)."""
