"""The run plan's one rule (training/plan.py): the config's value, else what the resumed run decided, else
measured by rank 0; a decision is made once; the plan a checkpoint holds is read back as saved, and a
damaged one, of any shape, is one line naming the checkpoint's 'plan' entry."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from checkpoint.run import Resume
from errors import UserError
from runtime.precision import DTYPE_BY_NAME
from training.distributed import Parallel
from training.plan import RunPlan

ONE = Parallel()


def measured(value, note="measured"):
    calls = []

    def measure():
        calls.append(1)
        return value, note
    return measure, calls


def test_the_config_wins_then_the_saved_value_then_a_measurement():
    saved = RunPlan()
    saved.load_state_dict({"dtype": "bfloat16", "notes": {"dtype": "dtype auto -> bfloat16"}})
    measure, calls = measured("float32")
    plan = RunPlan(saved=saved.saved)
    assert plan.settle("dtype", ONE, measure=measure) == "bfloat16" and not calls  # kept: never measured again
    assert plan.shown["dtype"] == "dtype auto -> bfloat16 (decided when this run started)"
    plan = RunPlan(saved=saved.saved)
    assert plan.settle("dtype", ONE, measure=measure, override=lambda: ("float32", "from config")) == "float32"
    fresh = RunPlan()
    assert fresh.settle("dtype", ONE, measure=measure) == "float32" and calls == [1]
    with pytest.raises(RuntimeError, match="decided once"):
        fresh.settle("dtype", ONE, measure=measure)


def test_a_group_decision_sets_its_fields_and_what_is_saved_is_read_back():
    plan = RunPlan()
    plan.settle("schedule", ONE, measure=lambda: ((120, 7), "time budget 1m: ..."))
    plan.settle("peak_flops", ONE, measure=lambda: (1e12, "peak"))  # a fact of this machine: not saved
    assert (plan.max_iters, plan.warmup_iters) == (120, 7)
    state = plan.state_dict()
    assert state == {"max_iters": 120, "warmup_iters": 7, "notes": {"schedule": "time budget 1m: ..."}}
    again = RunPlan.start(Resume(Path("ckpt.pt"), {"plan": state}))
    assert again.settle("schedule", ONE, measure=lambda: pytest.fail("kept")) == (120, 7)
    assert again.settle("peak_flops", ONE, measure=lambda: (2e12, "peak now")) == 2e12  # decided again


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
    for name in ("dtype", "schedule"):  # what is kept is what was saved, of its type
        plan.settle(name, ONE, measure=lambda: ("float32", "") if name == "dtype" else ((5, 1), ""))
    assert isinstance(plan.dtype, str) and isinstance(plan.max_iters, int) and isinstance(plan.warmup_iters, int)
