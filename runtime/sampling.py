"""The sampling settings and the one check of each, shared by sample.py (options), chat.py (options and
/temperature) and serve.py (request fields), so that a value refused by one is refused by all, in the
same words. The distribution itself is model/generate.py's (logits_to_probs, sample)."""
from __future__ import annotations

from dataclasses import dataclass

from errors import UserError

# The logits (fp32) are divided by the temperature and by the repetition penalty: below 1e-4 a logit of
# 3.4e34 overflows to inf (the probabilities become nan), and less already changes nothing (greedy, or a
# token never repeated); above 1e4 nothing changes any more either. Top-p's kept mass is compared in fp32,
# where a top-p under 1.2e-38 rounds to 0 and keeps nothing; under 1e-6 it keeps the top token anyway.
MIN_SCALE = 1e-4
MIN_TOP_P = 1e-6


@dataclass
class Sampling:
    """How the next token is drawn: temperature 0 is greedy (deterministic, no random number drawn);
    top_k / top_p None turn those filters off."""
    temperature: float = 0.8
    top_k: int | None = 200
    top_p: float | None = None


def check_temperature(value: float, name: str = "--temperature") -> float:
    if not (value == 0 or MIN_SCALE <= value <= 1 / MIN_SCALE):  # also rejects nan
        raise UserError(f"{name} must be >= 0: 0 (greedy) or in [{MIN_SCALE:g}, {1 / MIN_SCALE:g}], got {value}; "
                        "e.g. 0.8")
    return value


def check_top_k(value: int, name: str = "--top-k") -> int:
    if value < 1:
        raise UserError(f"{name} must be >= 1, got {value}; use a large value (e.g. 50257) to keep every token")
    return value


def check_top_p(value: float, name: str = "--top-p") -> float:
    if not (MIN_TOP_P <= value <= 1.0):  # also rejects nan
        raise UserError(f"{name} must be in (0, 1], at least {MIN_TOP_P:g}, got {value}; e.g. 0.9, or 1 to turn "
                        "nucleus sampling off")
    return value


def check_repetition_penalty(value: float, name: str = "--repetition-penalty") -> float:
    if not (MIN_SCALE <= value <= 1 / MIN_SCALE):  # also rejects nan
        raise UserError(f"{name} must be > 0, in [{MIN_SCALE:g}, {1 / MIN_SCALE:g}], got {value}; e.g. 1.2, or 1 to "
                        "turn it off")
    return value
