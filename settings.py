"""Config fields that carry their own rules. Every key of every config section is one `setting(...)`:
a dataclass field whose metadata holds its help line (what --help prints), whether a resumed run may
change it, and its check. Adding a key is one line in its section; no other table lists the keys.

    @dataclass
    class TrainSection:
        lr: float = setting(1e-3, "peak learning rate", resume=True, check=at_least(0))

A check takes the value and returns None, or what is wrong ("must be >= 1, got 0"), which the caller
prefixes with the key's name (`train.max_iters must be >= 1, got 0`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from errors import UserError, clipped
from fileio import check_path_value

Check = Callable[[Any], "str | None"]


class Freezable:
    """A config dataclass whose instances are frozen once loaded (`freeze`, called by load_config): after
    that, assigning to a field raises, so every decision a run makes lives in its plan, not in its config."""
    _frozen = False

    def __setattr__(self, name: str, value: Any) -> None:
        if self._frozen:
            raise dataclasses.FrozenInstanceError(f"cannot assign {type(self).__name__}.{name}: a loaded config is "
                                                  "frozen; decisions go into the run plan (training/plan.py)")
        object.__setattr__(self, name, value)

    def freeze(self):
        """Freeze this config and every section in it; returns it."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Freezable):
                value.freeze()
        object.__setattr__(self, "_frozen", True)
        return self


def setting(default: Any = dataclasses.MISSING, help: str = "", *, resume: bool = False, check: Check | None = None,
            default_factory: Any = dataclasses.MISSING, before: Any = dataclasses.MISSING, path: bool = False) -> Any:
    """A config field: `help` is its --help line; `resume=True` if a resumed run may change it (it does not
    change what the weights or the data mean); `check` validates its value; `before`, for a key added
    after runs were already being saved, the value that reproduces what those runs did (a checkpoint
    whose config lacks the key resumes with it, so the key's new default never changes an old run).
    `path`: the value is a path (or a name that may be one): fileio.path_problem's faults are refused in one
    line (check_fields, check_path_fields); whether it may be empty is the field's own check."""
    if not help:
        raise ValueError("every setting needs a help line")
    meta = {"help": help, "resume": resume, "check": check, "path": path}
    if before is not dataclasses.MISSING:
        meta["before"] = before
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def help_of(f: dataclasses.Field) -> str:
    return f.metadata.get("help", "")


def may_change_on_resume(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("resume"))


def value_before(f: dataclasses.Field) -> Any:
    """The value a run saved before this key existed had (dataclasses.MISSING: the default applies)."""
    return f.metadata.get("before", dataclasses.MISSING)


def path_fields(obj: Any) -> list[dataclasses.Field]:
    """The fields of `obj` (a config section) whose values are paths: what tests enumerate."""
    return [f for f in dataclasses.fields(obj) if f.metadata.get("path")]


def check_path_fields(obj: Any, section: str) -> None:
    """Every path field's value as a path (fileio.check_path_value, the same line as an option's): the first
    fault is a one-line UserError."""
    for f in path_fields(obj):
        value = getattr(obj, f.name)
        if not isinstance(value, str) or value == "":
            continue  # (a non-string, or empty: each field's own check says what it wants)
        check_path_value(value, f"{section}.{f.name}")


def check_fields(obj: Any, section: str) -> None:
    """Run every field's check; the first problem is a one-line UserError naming `section.key`."""
    check_path_fields(obj, section)
    for f in dataclasses.fields(obj):
        check = f.metadata.get("check")
        value = getattr(obj, f.name)
        problem = (check(value) if check else None) or _int64(value)
        if problem:
            raise UserError(f"{section}.{f.name} {problem}")


INT64 = 2**63


def _int64(value: Any) -> str | None:
    """Every int key, whatever its own check: past 64 bits a checkpoint can't hold it, and arithmetic
    with it (lr * step, steps / interval) overflows a float."""
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        shown = str(value) if value.bit_length() < 200 else f"a {len(str(value))}-digit number"
        return f"must fit in 64 bits (below 2**63), got {shown}; write a sensible value"
    return None


# ------------------------------------------------------------------------------------------ checks

def finite_number(value: Any) -> bool:
    """An int or float (a bool is an int to Python, not a number here) that is finite as a float: an int of 400
    digits overflows float() (math.isfinite raises on it), as it would in any plot or format of it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _shown(v: Any) -> str:
    """A value for a message, cut: a number of 5000 digits (a config's, or a checkpoint's) is not quoted whole."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() < 4000:  # (str() of any fewer digits works)
        text = str(v)
        return text if len(text) <= 40 else f"a {len(text)}-digit number"
    return clipped(v)


def at_least(low: float, hint: str = "") -> Check:
    return lambda v: None if v >= low else f"must be >= {low}, got {_shown(v)}{hint}"


def at_most(high: float, hint: str = "") -> Check:
    bound = f"{high:,}" if isinstance(high, int) else f"{high:g}"  # 1,073,741,824 exactly; 1e+30
    return lambda v: None if v <= high else f"must be at most {bound}, got {_shown(v)}{hint}"


def in_range(low: float, high: float, shown: str | None = None, hint: str = "") -> Check:
    """low <= v < high; `shown` writes the interval in the message (e.g. "[0, 2**63)")."""
    interval = shown or f"[{low}, {high})"
    return lambda v: None if low <= v < high else f"must be in {interval}, got {_shown(v)}{hint}"


def one_of(*choices: str) -> Check:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}, got {v!r}"


def not_blank(hint: str) -> Check:
    return lambda v: None if isinstance(v, str) and v.strip() else f"is empty; {hint}"


def all_of(*checks: Check) -> Check:
    def check(v: Any) -> str | None:
        return next((p for p in (c(v) for c in checks) if p), None)
    return check


# ------------------------------------------------------------------------------------ a run's counts

# Bounds shared by the config's keys and a checkpoint's record of what a run decided and did
# (checkpoint/format.py: check_plan, train_entry_problem): a hand-edited checkpoint may hold no count that
# no config could have asked for (a plan's warmup_iters of 2**100 trained at lr ~0, silently).
MAX_ITERS = 10**9  # optimizer steps: ~10,000x GPT-3's ~94k, and 11 days at 1 ms a step; past it a value is a typo
MAX_TOKENS_PER_STEP = 2**30  # tokens per optimizer step: ~300x GPT-3's 3.2M batch; past it a config is a typo
ITERS = all_of(at_least(1), at_most(MAX_ITERS))  # train.max_iters
WARMUP_ITERS = all_of(at_least(0), at_most(MAX_ITERS))  # train.warmup_iters
# every N steps: beyond MAX_ITERS an interval never comes (an eval_interval of 1e18 was accepted); 0 = off where said
EVERY = all_of(at_least(1), at_most(MAX_ITERS))
EVERY_OR_OFF = all_of(at_least(0, " (0 turns it off)"), at_most(MAX_ITERS))
# batches per split per eval: 1e18 was accepted and the first eval never ended; past this many random batches (77M
# tokens at small.yaml's shape) the estimate is no better than the exact loss of one pass over the split
MAX_EVAL_ITERS = 100_000
EVAL_ITERS = all_of(at_least(1), at_most(MAX_EVAL_ITERS, "; for the val split's exact loss, train.eval_full reads "
                                                         "it once, every token"))

