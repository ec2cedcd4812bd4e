"""The run plan (training/plan.py): what the resumed run decided is kept and says so; a decision is made once;
the plan a checkpoint holds is read back as saved, and a damaged one, of any shape, is one line naming the
checkpoint's 'plan' entry (checkpoint/format.py's check_plan)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from checkpoint import Resume
from errors import UserError
from runtime.precision import DTYPE_BY_NAME
from training.plan import Decision, RunPlan, Schedule

def test_a_kept_decision_says_so_and_a_decision_is_made_once():
    saved = RunPlan()
    saved.load_state_dict({"dtype": "bfloat16", "notes": {"dtype": "dtype auto -> bfloat16"}})
    plan = RunPlan(saved=saved.saved)
    assert plan.settle("dtype", plan.kept("dtype") or Decision("float32", "measured")) == "bfloat16"
    assert plan.lines() == ["dtype auto -> bfloat16 (decided when this run started)"]
    assert plan.state_dict() == {"dtype": "bfloat16", "notes": {"dtype": "dtype auto -> bfloat16"}}  # no suffix saved
    fresh = RunPlan()
    assert fresh.kept("dtype") is None and fresh.settle("dtype", Decision("float32", "measured")) == "float32"
    with pytest.raises(RuntimeError, match="decided once"):
        fresh.settle("dtype", Decision("float32"))


def test_a_group_decision_sets_its_fields_and_what_is_saved_is_read_back():
    plan = RunPlan()
    plan.settle("schedule", Decision(Schedule(120, 7), "time budget 1m: ..."))
    plan.settle("peak_flops", Decision(1e12, "peak"))  # a fact of this machine: not saved
    assert (plan.max_iters, plan.warmup_iters) == (120, 7)
    state = plan.state_dict()
    assert state == {"max_iters": 120, "warmup_iters": 7, "notes": {"schedule": "time budget 1m: ..."}}
    again = RunPlan.start(Resume(Path("ckpt.pt"), {"plan": state}))
    assert again.kept("schedule") == Decision(Schedule(120, 7), "time budget 1m: ...", kept=True)
    assert again.kept("peak_flops") is None  # decided again


def test_a_kept_batch_may_lack_its_micro_steps_a_kept_schedule_may_not():
    plan = RunPlan.start(Resume(Path("ckpt.pt"), {"plan": {"micro_batch": 4, "max_iters": 9,
                                                           "notes": {"batch": "b", "schedule": "s"}}}))
    assert plan.kept("batch").value == (4, None) and plan.kept("schedule") is None


JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                 st.text(max_size=12), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4),
                                                                                           st.integers(), max_size=2))
FIELDS = ("dtype", "loss_product", "micro_batch", "accum", "max_iters", "warmup_iters")


@given(st.one_of(JUNK, st.dictionaries(st.sampled_from(FIELDS + ("notes", "other")),
                                       st.one_of(JUNK, st.sampled_from(list(DTYPE_BY_NAME)), st.integers(0, 64),
                                                 st.dictionaries(st.sampled_from(("dtype", "batch", "schedule")),
                                                                 st.one_of(st.text(max_size=8), JUNK), max_size=3)),
                                       max_size=8)))
def test_a_saved_plan_of_any_shape_is_read_or_refused_in_one_line(entry):
    try:
        plan = RunPlan.start(Resume(Path("out/ckpt.pt"), {"plan": entry}))
    except UserError as e:
        assert str(e).startswith("checkpoint out/ckpt.pt: its 'plan' entry is malformed") and "\n" not in str(e)
        return
    saved = plan.saved
    assert saved.get("dtype", "float32") in DTYPE_BY_NAME
    assert all(saved.get(k, 1) >= 1 for k in ("micro_batch", "accum", "max_iters"))
    assert saved.get("warmup_iters", 0) >= 0
    plan.settle("dtype", plan.kept("dtype") or Decision("float32"))  # what is kept is what was saved, of its type
    plan.settle("schedule", plan.kept("schedule") or Decision(Schedule(5, 1)))
    assert isinstance(plan.dtype, str) and isinstance(plan.max_iters, int) and isinstance(plan.warmup_iters, int)
