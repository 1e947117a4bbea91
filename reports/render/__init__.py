"""Renderers: format what reports.analysis computed, one module per output. No analysis here.

    format.py      units, names of frames, plain-text tables, JSON: what every renderer shares
    text.py        the report as text (`allocscope report`)
    diff_text.py   the diff as text (`allocscope diff`)
    html.py        the offline report page (assets/: its template, script, style, uPlot)
    html_tables.py the page's tables; html_diff.py the diff page
    csvout.py      the ranked sites as CSV
    pprof.py       a pprof profile (gzipped profile.proto)
    flamegraph.py  folded stacks for flamegraph.pl / speedscope, and the flame graphs' data

Nothing is imported here: reports.analysis.findings uses format.py, which must not pull in the
renderers that import reports.analysis.
"""
