"""Renderers: format what reports.analysis computed, one module per output. No analysis here.

    shared.py      names of frames and locations, plain-text tables, styles: what the text
                   forms and the pages share
    text.py        the report as text (`allocscope report`); text_sites.py a site's details,
                   the sites held at the peak, GPU memory; text_waits.py waits, freeing cost
    diff_text.py   the diff as text (`allocscope diff`)
    html.py        the offline report page (assets/: its template, script, style, uPlot)
    html_tables.py the page's tables; html_diff_tables.py the diff's; html_cells.py what both
                   are built from; html_diff.py the diff page
    csvout.py      the ranked sites as CSV
    pprof.py       a pprof profile (gzipped profile.proto)
    flamegraph.py  folded stacks for flamegraph.pl / speedscope, and the flame graphs' data

Nothing is imported here, so importing one renderer does not pull in the others.
"""
