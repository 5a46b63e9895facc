"""Comparing JSON numbers by sign, where a negative zero must stay one (``-0.0`` == ``0.0`` in Python)."""

from __future__ import annotations

import math
from typing import Any


def signs(value: Any) -> Any:
    """``value`` with each number replaced by its sign (``copysign(1, x)``: -1.0 for -0.0), so that two
    values compare equal only if their zeros have the same signs."""
    if isinstance(value, dict):
        return {k: signs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [signs(v) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return math.copysign(1.0, value)
    return value
