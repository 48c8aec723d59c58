"""How every output shows a number: 4 significant digits, scientific only where needed.

The CLI's tables, the UI's text and the UI's table cells must show one value the same
way (``0.0000167``, never ``0.00002`` in one place and ``1.67e-05`` in another). The
UI's table cells are formatted by the browser, which rounds to 4 significant digits and
prints the rounded number as JavaScript does (plain decimals from 1e-6 up to 1e21,
``1.2e-7`` outside), so :func:`significant` follows that rule everywhere.

Example:
    >>> significant(1.67e-05), significant(0.084244), significant(2.26558463665e-06)
    ('0.0000167', '0.08424', '0.000002266')
    >>> significant(1234567.0), significant(1.2e-07), significant(-3.0)
    ('1235000', '1.2e-7', '-3')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

SIGNIFICANT_DIGITS = 4
# JavaScript prints a number in plain decimals in this range, in exponent form outside.
_PLAIN = (1e-6, 1e21)


def significant(value: float) -> str:
    """``value`` rounded to 4 significant digits, printed as JavaScript prints it."""
    if math.isnan(value) or math.isinf(value):
        return str(value)
    rounded = float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    if rounded == 0:
        return "0"
    if _PLAIN[0] <= abs(rounded) < _PLAIN[1]:
        text = format(Decimal(repr(rounded)), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, exponent = repr(rounded).split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent):+d}"


def format_value(value: object) -> str:
    """A table cell: floats with 4 significant digits, None as ``-``, the rest as is."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return significant(value)
    return str(value)


def format_hparams(hparams: Mapping[str, Any]) -> str:
    """``name=value`` pairs sorted by name, floats shortened as in every table cell."""
    return ", ".join(f"{k}={format_value(v)}" for k, v in sorted(hparams.items()))
