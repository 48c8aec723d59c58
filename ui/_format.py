"""How every page shows a number: 4 significant digits, scientific where needed.

One function for text (:func:`number`), one d3 format for charts' axes and tooltips
(:data:`D3`) and one printf format for table columns (:data:`COLUMN`), so that a value
reads the same on every page (``1.67e-05``, never ``0.00002`` on one page and
``0.0000167`` on another). Tables and CSV exports keep the full value: only its display
is rounded; :func:`full` is the text shown on hover.

Example:
    >>> number(1.67e-05), number(0.084244), number(2.26558463665e-06), number(1234567.0)
    ('1.67e-05', '0.08424', '2.266e-06', '1.235e+06')
    >>> number(None), number(3), number("sgd"), number(True)
    ('—', '3', 'sgd', 'True')
    >>> full(0.03833332156156663)
    '0.03833332156156663'
"""

from __future__ import annotations

import math

SIGNIFICANT = 4
# d3's format (Vega-Lite axes and tooltips): 4 significant digits, trailing zeros trimmed.
D3 = f".{SIGNIFICANT}~g"
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
    return f"{value:.{SIGNIFICANT}g}"


def full(value: object) -> str:
    """``value`` at full precision (what hover and CSV show); ``—`` when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return repr(value) if isinstance(value, float) else str(value)
