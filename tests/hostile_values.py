"""Special numbers and number texts the hostile tests give every numeric option."""
from __future__ import annotations

import math


SPECIAL_INTS = [0, -1, 1, 2, 10**5, 10**6 + 1, 2**31, 2**63, 2**64, 10**23, -(2**63) - 1]


SPECIAL_FLOATS = [0.0, -0.0, -1.0, 5e-324, 1e-300, 1e-45, 1.17e-38, 1e-6, 0.5, 1.0, 1.5, 1e6, 1e308, math.inf,
                  -math.inf, math.nan]


TEXTS = ["1e23", "1e-300", "nan", "inf", "²", "0x10", "1_000", " 7 ", "-0", ""]
