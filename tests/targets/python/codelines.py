"""Print, as JSON, every code object of a source file: its location table (co_linetable), first
line and co_lines() — what reports/symbolize/python.py must agree with (tests/test_python_layout.py)."""

import json
import sys
import types


def walk(co):
    yield co
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            yield from walk(c)


with open(sys.argv[1]) as f:
    top = compile(f.read(), sys.argv[1], "exec")
print(
    json.dumps(
        [
            {"first": co.co_firstlineno, "table": co.co_linetable.hex(), "lines": [list(x) for x in co.co_lines()]}
            for co in walk(top)
        ]
    )
)
