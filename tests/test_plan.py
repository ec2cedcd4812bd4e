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


# --------------------------------------------------------------- counts past what a config could ask for

def _config_takes(key: str, value: int) -> bool:
    """The reference: whether train.py's own config accepts `value` for train.<key>."""
    from training.config.sections import load_config

    try:
        load_config([f"--train.{key}={value}"])
    except UserError:
        return False
    return True


COUNTS = st.one_of(st.integers(-3, 2**70), st.sampled_from([0, 1, 10**9, 10**9 + 1, 2**62, 2**63, 2**100, 10**400]))


@given(name=st.sampled_from(["max_iters", "warmup_iters"]), value=COUNTS)
def test_a_plans_count_is_kept_exactly_where_a_config_could_have_asked_for_it(name, value):
    """A hand-edited plan's max_iters 2**62 overrode train.max_iters and trained forever; warmup_iters 2**100
    trained at lr ~0. A count is kept iff the config accepts it for its key, else one line naming the entry."""
    try:
        plan = RunPlan.start(Resume(Path("out/ckpt.pt"), {"plan": {name: value, "notes": {}}}))
    except UserError as e:
        assert str(e).startswith("checkpoint out/ckpt.pt: its 'plan' entry is malformed") and name in str(e), str(e)
        assert "\n" not in str(e) and len(str(e)) < 300, str(e)
        assert not _config_takes(name, value), value
        return
    assert _config_takes(name, value), value
    assert plan.saved == {}  # (no note: nothing kept, but read)


@given(micro=COUNTS, accum=COUNTS)
def test_a_plans_batch_is_at_most_a_steps_tokens(micro, accum):
    ok = micro >= 1 and accum >= 1 and micro * accum <= 2**30  # config.validate's tokens per step, written out
    try:
        RunPlan.start(Resume(Path("out/ckpt.pt"), {"plan": {"micro_batch": micro, "accum": accum, "notes": {}}}))
    except UserError as e:
        assert not ok and "'plan' entry is malformed" in str(e) and len(str(e)) < 300, str(e)
        return
    assert ok, (micro, accum)


@given(it=COUNTS, tokens=COUNTS, end=st.one_of(st.none(), st.integers(1, 10**9)))
def test_the_train_entrys_counts_are_bounded_by_the_config_and_its_plan(it, tokens, end):
    """The 'train' entry's iter 2**200 was accepted (sample.py printed it). Its iter is at most the config's
    largest max_iters and its own plan's max_iters (train.py saves only inside its loop); its tokens_seen at most
    that many steps of the most tokens a step may take. Both readers, a resume and inference, refuse alike."""
    from checkpoint.format import train_entry_problem
    from checkpoint.resume import check_counters

    ok = (0 <= it and (it == 0 or _config_takes("max_iters", it)) and (end is None or it <= end)
          and 0 <= tokens <= 10**9 * 2**30)
    plan = {} if end is None else {"max_iters": end, "notes": {}}
    resume = Resume(Path("out/ckpt.pt"), {"train": {"iter": it, "tokens_seen": tokens}, "plan": plan})
    try:
        check_counters(resume)
    except UserError as e:
        assert not ok and str(e).startswith("checkpoint out/ckpt.pt: its 'train' entry is malformed"), str(e)
        assert "\n" not in str(e) and len(str(e)) < 300, str(e)
        assert train_entry_problem(resume.train, plan)  # what inference (checkpoint/load.py) refuses with
        return
    assert ok, (it, tokens, end)
