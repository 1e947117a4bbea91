"""Options shared by several commands (report, diff, and a later `top`): declared once here,
parsed by one library function. No heavy imports: `--help` stays instant."""
from __future__ import annotations

import click

FOLD_HELP = ("Also fold these functions out of sites, like the built-in wrappers (zmalloc*, "
             "PyObject_Malloc, g_malloc*, CRYPTO_malloc, xmalloc...): the site starts at the frame "
             "that called them. FUNC is an exact function name, or a glob when it holds * ? or [...] "
             "(e.g. 'pool_*'); C++ names include their parameters ('Pool::get*'). Repeatable; commas "
             "inside <> () [] belong to the name.")


def fold_option(f):
    """--fold FUNC[,FUNC] (repeatable): the raw values, for reports.analysis.parse_fold."""
    return click.option("--fold", "fold", multiple=True, metavar="FUNC[,FUNC]", help=FOLD_HELP)(f)
