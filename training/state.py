"""The run's counters, in one object that checkpoints like every other stateful part."""
from __future__ import annotations

import math
import secrets
import string
from dataclasses import asdict, dataclass, field, fields
from typing import Any


def new_run_id() -> str:
    """8 lowercase alphanumerics, like wandb's own ids. Uses `secrets`, so no training RNG is consumed."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


@dataclass
class TrainState:
    iter: int = 0  # optimizer steps done
    best_val_loss: float = math.inf
    tokens_seen: int = 0
    elapsed_s: float = 0.0  # wall seconds of the run so far (set-up, steps, evals, checkpoints), across resumes
    run_id: str = field(default_factory=new_run_id)  # one id per run, kept across resumes (also wandb's)
    dtype: str = ""  # the training dtype this run chose, kept on resume (train.dtype may override it)
    # train.time_budget's decision (training/budget.py), made once when the run started; 0 = none
    budget_iters: int = 0
    budget_warmup: int = 0
    budget_note: str = ""

    ADDED_LATER = {"budget_iters": 0, "budget_warmup": 0, "budget_note": ""}  # absent from older checkpoints

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Every field must be there with its type; an int where a float is expected is fine."""
        for f in fields(self):
            value = state[f.name] if f.name in state or f.name not in self.ADDED_LATER else self.ADDED_LATER[f.name]
            kind = {"int": int, "float": (int, float), "str": str}[f.type]
            if isinstance(value, bool) or not isinstance(value, kind):
                raise TypeError(f"{f.name} should be {f.type}, got {value!r}")
            setattr(self, f.name, float(value) if f.type == "float" else value)
