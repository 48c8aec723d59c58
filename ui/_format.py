"""How every page shows a number: 4 significant digits, scientific only where needed.

One function for text (:func:`number`), one d3 format for charts' axes and tooltips
(:data:`D3`) and one printf format for table columns (:data:`COLUMN`), so that a value
reads the same on every page and in the CLI (``0.0000167``, never ``0.00002`` on one
page and ``1.67e-05`` on another): :func:`number` is :func:`trials.numbers.significant`,
the rule the browser applies to ``COLUMN`` cells, and ``D3`` writes the same plain
decimals. Tables and CSV exports keep the full value: only its display is rounded;
double-clicking a table cell shows it, and :func:`full` is the text of exact-value
columns.

Example:
    >>> number(1.67e-05), number(0.084244), number(2.26558463665e-06), number(1234567.0)
    ('0.0000167', '0.08424', '0.000002266', '1235000')
    >>> number(1.2e-07), number(-3.0), number(float("inf"))
    ('1.2e-7', '-3', 'inf')
    >>> number(None), number(3), number("sgd"), number(True)
    ('—', '3', 'sgd', 'True')
    >>> full(0.03833332156156663)
    '0.03833332156156663'
"""

from __future__ import annotations

import math

from trials.numbers import SIGNIFICANT_DIGITS, significant

SIGNIFICANT = SIGNIFICANT_DIGITS
# d3's format (Vega-Lite axes and tooltips): 4 significant digits in plain decimals,
# trailing zeros trimmed; "g" would switch to "1.235e+6" where tables show 1235000.
D3 = f".{SIGNIFICANT}~r"
# sprintf-js's format (st.column_config.NumberColumn).
COLUMN = f"%.{SIGNIFICANT}g"
MISSING = "—"


def number(value: object) -> str:
    """``value`` in 4 significant digits if it is a real number; as text otherwise."""
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and math.isnan(value):
        return MISSING
    if isinstance(value, int):
        return str(value)
    return significant(value)


def full(value: object) -> str:
    """``value`` at full precision (what exact-value columns and CSV show); ``—`` when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return repr(value) if isinstance(value, float) else str(value)
