"""The one parser of token and parameter counts in configs and on the command line: `5B`, `524288`, `1.5M`, `2e9`."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from .errors import UserError

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}  # decimal, as token budgets are
_COUNT = re.compile(r"\s*([+-]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([KMBGT]?)\s*", re.IGNORECASE)


def parse_count(value: Any, key: str, minimum: int = 1) -> int:
    """An exact whole count from an int, a float without a fraction, or text with an optional decimal K/M/B/G/T
    suffix. Garbage, a fraction of a unit (`1.5`, `1.0000005M`) and anything below `minimum` (default 1: zero and
    negatives are refused) are a one-line ValueError starting with `key: `."""
    if isinstance(value, bool):
        raise UserError(f"{key}: expected a count like 20M, 1.5B or 4096, got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = _COUNT.fullmatch(str(value))
        if not m:
            raise UserError(f"{key}: expected a count like 20M, 1.5B or 4096, got {value!r}")
        try:
            exact = Decimal(m.group(1).replace("_", "")) * _SUFFIX[m.group(2).upper()]
        except InvalidOperation:
            raise UserError(f"{key}: expected a count like 20M, 1.5B or 4096, got {value!r}") from None
        if exact != exact.to_integral_value():
            raise UserError(f"{key}: {value!r} is not a whole number ({exact.normalize():f})")
        n = int(exact)
    if n < minimum:
        raise UserError(
            f"{key}: must be at least {minimum}, got {value!r}"
            if minimum != 1
            else f"{key}: must be positive, got {value!r}"
        )
    return n
