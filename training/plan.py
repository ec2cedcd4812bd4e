"""The run plan: every decision taken at start-up, made once, by one rule, and kept in one place.

    dtype             the training dtype (train.dtype; auto: timed on a CPU, the GPU's native type)
    loss_chunk_rows   rows of the fused LM-head loss per chunk (None: the full logits), for this device
    loss_product      how the fused loss makes the head's weight gradient (timed once per machine)
    attention         the SDPA kernel training puts first on a GPU (timed: runtime/attention.py)
    batch             Batch(micro_batch, accum): sequences per micro-step per rank / global micro-steps
    schedule          Schedule(max_iters, warmup_iters) (train.max_iters, or what train.time_budget leaves)
    peak_flops        the device's peak, for MFU (train.peak_flops, or a table / a probe)
    step_graph        whether the training step replays as one CUDA graph (training/graphs/step.py)

The rule, the same for every decision, written where each is made (the chain, training/builders.py):

    plan.settle(name, the config's Decision or plan.kept(name) or a measured Decision)

  1. the config's own value, where it names one (a batch size, a dtype, no time budget);
  2. else the value this run decided when it started, saved in the checkpoint's "plan" entry, so a
     resume under another load, memory limit or machine trains bit for bit as the first session;
  3. else measured now: by rank 0, its answer shared with every rank (Parallel.decide), or, for what every
     rank must take part in (the memory a micro-batch needs, the steps a budget times), by every rank,
     which agree among themselves.
A decision that describes this machine rather than the run (loss_chunk_rows, peak_flops, step_graph) is not kept:
`kept` has none for it. The config itself is never changed: the loop reads the schedule from here.

The plan is saved as one checkpoint entry and printed as one block. Its saved form is checked where
the checkpoint format lives (check_plan), which also moves the decisions of
checkpoints written before the plan had an entry into it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Generic, NamedTuple, TypeVar

from checkpoint import Resume
from checkpoint.format import check_plan, plan_entry

T = TypeVar("T")
KEPT_SUFFIX = " (decided when this run started)"  # how a kept decision's line ends when printed


class Batch(NamedTuple):
    micro_batch: int  # sequences per micro-step on each rank
    accum: int  # GLOBAL micro-steps per optimizer step (each rank runs accum / world_size)


class Schedule(NamedTuple):
    max_iters: int
    warmup_iters: int


# a decision whose value has several fields, saved one field each (the others: one field of their name)
GROUPS: dict[str, type] = {"batch": Batch, "schedule": Schedule}
NOT_KEPT = {"loss_chunk_rows", "peak_flops", "step_graph"}  # facts of this machine, decided again on every start
DERIVED = {"accum"}  # a kept batch may lack it (format 2): the chain derives it from the global batch


@dataclass(frozen=True)
class Decision(Generic[T]):
    value: T
    note: str = ""  # the line that says how it was made ("": nothing worth a line)
    kept: bool = False  # the resumed run's own decision (rule 2), not made again

    def line(self) -> str:
        return self.note + KEPT_SUFFIX if self.kept and self.note else self.note


@dataclass
class RunPlan:
    decisions: dict[str, Decision] = field(default_factory=dict)  # in the order they were made
    saved: dict[str, Decision] = field(default_factory=dict, repr=False)  # the resumed run's kept decisions

    @classmethod
    def start(cls, resume: Resume | None) -> "RunPlan":
        """An empty plan; for a resumed run, with what its checkpoint's plan keeps (rule 2)."""
        plan = cls()
        if resume is not None:
            plan.saved = saved_decisions(plan_entry(resume.payload, resume.path))
        return plan

    # ------------------------------------------------------------------------------------ the rule
    def kept(self, name: str) -> Decision | None:
        """Rule 2: the resumed run's decision `name`, marked kept; None where this machine decides again
        (NOT_KEPT), or the run did not make it."""
        saved = self.saved.get(name)
        return None if saved is None or name in NOT_KEPT else replace(saved, kept=True)

    def settle(self, name: str, decision: Decision[T]) -> T:
        """Record `name`'s decision (made once) and return its value."""
        if name in self.decisions:
            raise RuntimeError(f"the run plan's {name} is decided once")
        self.decisions[name] = decision
        return decision.value

    def revise(self, name: str, decision: Decision) -> None:
        """A decision the run had to change after start-up (the compile fallback's loss path on a GPU): the
        plan still holds what the run does, and says why."""
        self.decisions[name] = decision

    def value(self, name: str, default: Any = None) -> Any:
        decision = self.decisions.get(name)
        return default if decision is None else decision.value

    # the decisions' values, typed, as the loop and the reports read them
    dtype = property(lambda self: self.value("dtype", ""))
    loss_chunk_rows = property(lambda self: self.value("loss_chunk_rows"))
    loss_product = property(lambda self: self.value("loss_product", ""))
    batch = property(lambda self: self.value("batch", Batch(0, 0)))
    micro_batch = property(lambda self: self.batch.micro_batch)
    accum = property(lambda self: self.batch.accum)
    schedule = property(lambda self: self.value("schedule", Schedule(0, 0)))
    max_iters = property(lambda self: self.schedule.max_iters)
    warmup_iters = property(lambda self: self.schedule.warmup_iters)
    peak_flops = property(lambda self: self.value("peak_flops"))
    step_graph = property(lambda self: bool(self.value("step_graph", False)))

    def lines(self) -> list[str]:
        """The plan as printed at start: one line per decision, in the order they were made (each line says
        which decision it is)."""
        return [line for d in self.decisions.values() if (line := d.line())]

    # ------------------------------------------------------------------------------- saved / restored
    def state_dict(self) -> dict[str, Any]:
        """The decisions made so far, one field each (a decision not yet made is absent), and how each was
        made: the layout check_plan reads."""
        out: dict[str, Any] = {}
        for name, d in self.decisions.items():
            if name not in NOT_KEPT:
                out.update(d.value._asdict() if name in GROUPS else {name: d.value})
        out["notes"] = {name: d.note for name, d in self.decisions.items() if name not in NOT_KEPT}
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A saved plan (the Checkpointer's restore): what rule 2 keeps. The decisions already made stay as
        they are; a damaged entry raises check_plan's TypeError or ValueError."""
        self.saved = saved_decisions(check_plan(state))


def saved_decisions(state: dict[str, Any]) -> dict[str, Decision]:
    """A checked saved plan as decisions, by name: those it made (its first field neither absent, 0 nor
    ""), a group's missing fields None where the chain derives them (DERIVED), else not kept."""
    out = {}
    for name, note in state.get("notes", {}).items():
        fields = GROUPS[name]._fields if name in GROUPS else (name,)
        values = [state.get(f) for f in fields]
        if values[0] in (None, "", 0) or any(v is None and f not in DERIVED for f, v in zip(fields, values)):
            continue
        out[name] = Decision(GROUPS[name](*values) if name in GROUPS else values[0], note)
    return out
