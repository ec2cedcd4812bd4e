"""The run plan: every decision taken at start-up, made once, by one rule, and kept in one place.

    dtype             the training dtype (train.dtype; auto: timed on a CPU, the GPU's native type)
    loss_chunk_rows   rows of the fused LM-head loss per chunk (None: the full logits), for this device
    loss_product      how the fused loss makes the head's weight gradient (timed once per machine)
    attention         the SDPA kernel training puts first on a GPU (timed: runtime/attention.py)
    micro_batch/accum sequences per micro-step per rank / global micro-steps (train.batch_size, or auto)
    max_iters/warmup_iters  the schedule (train.max_iters, or what train.time_budget leaves room for)
    peak_flops        the device's peak, for MFU (train.peak_flops, or a table / a probe)

The rule, the same for every decision (`RunPlan.settle`):
  1. the config's own value, where it names one (a batch size, a dtype, no time budget);
  2. else the value this run decided when it started, saved in the checkpoint's "plan" entry, so a
     resume under another load, memory limit or machine trains bit for bit as the first session;
  3. else measured now: by rank 0, its answer shared with every rank (Parallel.decide), or, for what every
     rank must take part in (the memory a micro-batch needs, the steps a budget times), by every rank,
     which agree among themselves.
A decision that describes this machine rather than the run (loss_chunk_rows, peak_flops) is not kept:
rule 2 is skipped for it. The config itself is never changed: the loop reads the schedule from here.

The plan is saved as one checkpoint entry and printed as one block. Checkpoints written before it had an
entry kept these decisions in their "train" entry; checkpoint/format.py's upgrade moves them here.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

from checkpoint import Resume
from errors import UserError, short_error
from runtime.precision import DTYPE_BY_NAME

from .distributed import Parallel

# a decision's name -> the fields it sets (most set one field of the same name)
GROUPS = {"batch": ("micro_batch", "accum"), "schedule": ("max_iters", "warmup_iters")}
NOT_KEPT = {"loss_chunk_rows", "peak_flops"}  # facts of this machine, decided again on every start
KEPT_NOTE = " (decided when this run started)"


@dataclass
class RunPlan:
    dtype: str = ""
    loss_chunk_rows: int | None = None
    loss_product: str = ""
    attention: str = ""  # the SDPA kernel put first on a GPU (runtime/attention.py), "default" elsewhere
    micro_batch: int = 0
    accum: int = 0  # GLOBAL micro-steps per optimizer step (each rank runs accum / world_size)
    max_iters: int = 0
    warmup_iters: int = 0
    peak_flops: float | None = None
    notes: dict[str, str] = field(default_factory=dict)  # decision -> the line that says how it was made
    saved: dict[str, Any] = field(default_factory=dict, repr=False)  # the resumed run's plan (load_state_dict)
    shown: dict[str, str] = field(default_factory=dict, repr=False)  # the notes as printed (kept: the suffix)
    # a value given by whoever builds the run, beside the config (a benchmark comparing loss paths): rule 1
    forced: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def start(cls, resume: Resume | None) -> "RunPlan":
        """An empty plan; for a resumed run, with what its checkpoint's plan keeps (rule 2)."""
        plan = cls()
        if resume is not None:
            try:
                plan.load_state_dict(resume.payload.get("plan", {}))
            except (TypeError, ValueError, AttributeError) as e:
                raise UserError(f"checkpoint {resume.path}: its 'plan' entry is malformed ({short_error(e, 120)}); "
                                "use another checkpoint (e.g. best.pt), or a new --train.out_dir") from None
        return plan

    # ------------------------------------------------------------------------------------ the rule
    def settle(self, name: str, par: Parallel, *, measure: Callable[[], tuple[Any, str]],
               override: Callable[[], tuple[Any, str]] | None = None, every_rank: bool = False,
               reapply: Callable[[Any, str], tuple[Any, str]] | None = None) -> Any:
        """Decide `name` once, by the module's rule, and return its value (a tuple for a GROUPS name).
        `override`: the config's value, where it names one, -> (value, note). `measure` -> (value, note),
        run by rank 0 and shared, or with `every_rank` by every rank (it makes the ranks agree itself).
        `reapply(saved value, its note)` -> (value, note) to use (it may refuse the saved one in one line)."""
        names = GROUPS.get(name, (name,))
        if name in self.notes:
            raise RuntimeError(f"the run plan's {name} is decided once")
        saved = self._saved(name, names)
        if reapply is None and isinstance(saved, tuple) and None in saved:
            saved = None  # a part is missing and nothing derives it: decided again
        if name in self.forced:
            value, note = self.forced[name], f"{name} {self.forced[name]} (given by the caller)"
        elif override is not None:
            value, note = par.decide(override)
        elif saved is not None:
            value, note = (reapply or (lambda v, n: (v, n + KEPT_NOTE)))(saved, self.saved["notes"][name])
        else:
            value, note = measure() if every_rank else par.decide(measure)
        for f, v in zip(names, value if len(names) > 1 else (value,)):
            setattr(self, f, v)
        self.notes[name] = note.removesuffix(KEPT_NOTE)  # saved without the suffix: it is added when kept
        self.shown[name] = note
        return value

    def revise(self, name: str, value: Any, note: str) -> None:
        """A decision the run had to change after start-up (the compile fallback's loss path on a GPU): the
        plan still holds what the run does, and says why."""
        setattr(self, name, value)
        self.notes[name] = self.shown[name] = note

    def _saved(self, name: str, names: tuple[str, ...]) -> Any:
        """The resumed run's value of a kept decision, or None (not kept, or not made: its first field
        absent, 0 or ""). A group's other fields may be absent (None): `reapply` derives them."""
        if name in NOT_KEPT or name not in self.saved.get("notes", {}) or self.saved.get(names[0]) in (None, "", 0):
            return None
        values = tuple(self.saved.get(f) for f in names)
        return values if len(names) > 1 else values[0]

    def lines(self) -> list[str]:
        """The plan as printed at start: one line per decision, in the order they were made (each line says
        which decision it is)."""
        return [self.shown[name] for name in self.notes if self.shown.get(name)]

    # ------------------------------------------------------------------------------- saved / restored
    def state_dict(self) -> dict[str, Any]:
        """The decisions made so far (a decision not yet made is absent), and how each was made."""
        made = {f for name in self.notes for f in GROUPS.get(name, (name,))} - NOT_KEPT
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name in made}
        out["notes"] = {k: v for k, v in self.notes.items() if k not in NOT_KEPT}
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Read a saved plan: what rule 2 keeps. The decisions already made stay as they are. Every
        value must have its field's type (a damaged entry is refused, naming it, by the Checkpointer)."""
        kinds = {f.name: {"str": str, "int": int}[f.type] for f in fields(self) if f.type in ("str", "int")}
        if not isinstance(state, dict) or not isinstance(state.get("notes", {}), dict):
            raise TypeError(f"the plan should be a dict with a dict of notes, got {state!r:.80}")
        for name, note in state.get("notes", {}).items():
            if not isinstance(note, str):
                raise TypeError(f"the note of {name} should be str, got {note!r:.80}")
        for name, value in state.items():
            kind = kinds.get(name)
            if kind is not None and (isinstance(value, bool) or not isinstance(value, kind)):
                raise TypeError(f"{name} should be {kind.__name__}, got {value!r}")
        if state.get("dtype", "float32") not in DTYPE_BY_NAME:
            raise ValueError(f"dtype should be one of {', '.join(DTYPE_BY_NAME)}, got {state['dtype']!r}")
        for name in ("micro_batch", "accum", "max_iters"):
            if state.get(name, 1) < 1:
                raise ValueError(f"{name} should be at least 1, got {state[name]}")
        if state.get("warmup_iters", 0) < 0:  # a config's warmup may exceed its max_iters: lr_at handles it
            raise ValueError(f"warmup_iters should be at least 0, got {state['warmup_iters']}")
        self.saved = dict(state)
