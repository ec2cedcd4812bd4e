"""train.time_budget (training/timing/budget.py): the plan's arithmetic by hand, the duration syntax, a budget
run that resumes bit for bit and never re-decides, and timing that leaves no trace in the run."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

import training.timing.budget
from errors import UserError
from faults import inject
from checkpoint import VERSION, load_checkpoint
from training.timing.budget import Timing, parse_duration, plan
from training.config.sections import load_config


def test_durations_parse_and_a_bad_one_is_one_line():
    assert [parse_duration(s) for s in ("90s", "8m", "1.5h", "600", "0", "", " 2 min ")] == [90, 480, 5400, 600, 0, 0, 120]
    for bad in ("8 minutes", "-5s", "soon", "1e3"):
        with pytest.raises(UserError, match=r"^train.time_budget must be a duration like 90s, 8m or 1h \(0 = off\)"):
            load_config([f"--train.time_budget={bad}"])
    assert load_config(["--train.time_budget=8m"]).train.time_budget == "8m"


def test_the_plan_fits_steps_evals_and_checkpoints_in_the_budget_by_hand():
    # 100 s budget, 10 s spent setting up, steps of 0.1 s, evals of 2 s + 2 checkpoints of 0.5 s every 100 steps:
    # n steps cost 0.1 n + 3 ceil(n / 100); 90 s fit n = 690 (69 + 21 = 90), not 691 (69.1 + 24)
    timing = Timing(setup_s=10.0, step_s=0.1, eval_s=2.0, checkpoint_s=0.5)
    assert plan(100.0, timing, max_iters=5000, warmup_iters=100, eval_interval=100) == (690, 14)  # 100 * 690/5000
    assert plan(1e6, timing, max_iters=5000, warmup_iters=100, eval_interval=100) == (5000, 100)  # never above the config
    # train.eval_full's pass over the val split at the end (3 s) comes off the budget once: 87 s fit n = 660
    timing_full = Timing(setup_s=10.0, step_s=0.1, eval_s=2.0, checkpoint_s=0.5, final_s=3.0)
    assert plan(100.0, timing_full, max_iters=5000, warmup_iters=100, eval_interval=100) == (660, 13)
    with pytest.raises(UserError, match=r"train.time_budget=12s leaves no time to train: set-up took 10.0 s"):
        plan(12.0, timing, max_iters=5000, warmup_iters=100, eval_interval=100)


def test_the_plan_counts_samples_and_attention_maps_ceil_n_over_their_interval_times_by_hand():
    # 90 s after set-up, steps of 0.125 s, evals of 2 s + 2 checkpoints of 0.5 s every 100 steps (all exact in binary)
    timing = Timing(setup_s=10.0, step_s=0.125, eval_s=2.0, checkpoint_s=0.5, sample_s=1.0, inspect_s=0.5)
    kw = dict(max_iters=5000, warmup_iters=100, eval_interval=100)
    # neither on: 0.125 n + 3 ceil(n / 100) <= 90 -> n = 576 (72 + 18 = 90; 577: 72.125 + 18)
    assert plan(100.0, timing, **kw) == (576, 12)  # warmup 100 * 576 / 5000 = 11.52
    # a map every 200 steps (0.5 s): + 0.5 ceil(n / 200) -> n = 564 (70.5 + 18 + 1.5 = 90; 565: 70.625 + 18 + 1.5)
    assert plan(100.0, timing, **kw, inspect_interval=200) == (564, 11)
    # and samples every 50 steps (1 s): + ceil(n / 50) -> n = 500 (62.5 + 15 + 10 + 1.5 = 89; 501: 62.625 + 18 + 11
    # + 1.5 = 93.125, and every n above costs more)
    assert plan(100.0, timing, **kw, inspect_interval=200, sample_interval=50) == (500, 10)
    assert plan(100.0, timing, **kw, sample_interval=50) == (500, 10)  # 62.5 + 15 + 10 = 87.5; 501: 91.625


def test_a_sampling_round_and_an_inspection_are_timed_into_the_plan(tmp_path, data_root, monkeypatch, capsys):
    seen = []
    real = training.timing.budget.measure
    monkeypatch.setattr(training.timing.budget, "measure", lambda r: seen.append(real(r)) or seen[-1])
    _run(tmp_path / "out", data_root, "--train.time_budget=1h", "--train.max_iters=4", "--eval.sample_interval=2",
         "--eval.sample_tokens=40", "--eval.inspect_interval=4")
    # 40 forwards of 2 prompts, and one forward with two figures drawn: each more than one eval batch per split
    assert seen[0].sample_s > seen[0].eval_s / 2 > 0 and seen[0].inspect_s > 0
    out = capsys.readouterr().out
    assert (f"samples {seen[0].sample_s:.1f} s every 2 steps, attention maps {seen[0].inspect_s:.1f} s every 4 steps "
            "-> max_iters 4") in out
    _run(tmp_path / "off", data_root, "--train.time_budget=1h", "--train.max_iters=4")
    assert seen[1].sample_s == seen[1].inspect_s == 0.0


def _argv(out, data_root, *extra):
    return ["--data.tokenizer=char", f"--data.root={data_root}", f"--train.out_dir={out}", "--model.n_layer=2",
            "--model.n_head=2", "--model.n_embd=32", "--model.block_size=32", "--train.batch_size=4",
            "--train.max_iters=40", "--train.warmup_iters=8", "--train.eval_interval=4", "--train.eval_iters=2",
            "--train.log_interval=1", "--train.dtype=float32", "--train.device=cpu", "--model.dropout=0.1",
            "--train.peak_flops=1e11", "--wandb.mode=disabled", *extra]


def _run(out, data_root, *extra):
    from training import loop

    return loop.train(load_config(_argv(out, data_root, *extra)))


def test_a_budget_run_interrupted_and_resumed_ends_bitwise_equal_to_an_uninterrupted_one(tmp_path, data_root, monkeypatch,
                                                                                        capsys):
    timings = []

    def fake_measure(r):  # injected: the same figures every time, and counted
        timings.append(r.state.iter)
        return Timing(setup_s=1.0, step_s=0.5, eval_s=0.4, checkpoint_s=0.05)

    monkeypatch.setattr(training.timing.budget, "measure", fake_measure)
    # 10 s, 1 s of it set-up: n steps cost 0.5 n + (0.4 + 2 * 0.05) ceil(n / 4) <= 9 -> n = 14 (7 + 0.5 * 4 = 9;
    # 15 steps: 7.5 + 2 = 9.5)
    full = _run(tmp_path / "full", data_root, "--train.time_budget=10s")
    iters = load_checkpoint(tmp_path / "full")["plan"]["max_iters"]
    assert full["iter"] == iters == 14 and len(timings) == 1
    assert "time budget 10s: " in capsys.readouterr().out
    with inject(interrupt_after=5):
        part1 = _run(tmp_path / "resumed", data_root, "--train.time_budget=10s")
    assert part1["iter"] == 5 and len(timings) == 2
    monkeypatch.setattr(training.timing.budget, "measure", lambda r: pytest.fail("a resumed budget run must not re-decide"))
    part2 = _run(tmp_path / "resumed", data_root, "--train.time_budget=10s")
    assert "(decided when this run started)" in capsys.readouterr().out
    assert {**part1["losses"], **part2["losses"]} == full["losses"]
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "resumed")
    assert a["plan"]["max_iters"] == b["plan"]["max_iters"] and a["train"]["iter"] == b["train"]["iter"] == 14
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    with pytest.raises(UserError, match=r"train.time_budget: '10s' -> '20s'"):  # the saved plan would not hold
        _run(tmp_path / "resumed", data_root, "--train.time_budget=20s")


@pytest.mark.parametrize("max_iters", [5, 100])
def test_a_max_iters_changed_on_a_budget_runs_resume_says_it_is_not_applied(tmp_path, data_root, monkeypatch, capsys,
                                                                            max_iters):
    # found from outside: lowered from 2000 to 5 on resume, the run went on to its planned 11 without a word
    monkeypatch.setattr(training.timing.budget, "measure",
                        lambda r: Timing(setup_s=1.0, step_s=0.5, eval_s=0.4, checkpoint_s=0.05))  # plans 14 steps
    with inject(interrupt_after=2):
        _run(tmp_path / "out", data_root, "--train.time_budget=10s")
    capsys.readouterr()
    res = _run(tmp_path / "out", data_root, "--train.time_budget=10s", f"--train.max_iters={max_iters}")
    assert res["iter"] == 14
    assert (f"train.max_iters={max_iters} is not applied: train.time_budget=10s fixed this run's length when it "
            "started (from max_iters=40)") in capsys.readouterr().out



def test_a_budget_run_resumed_on_another_number_of_ranks_warns_that_its_kept_length_no_longer_fits(
        tmp_path, data_root, monkeypatch, capsys):
    """Found from outside: a budget run resumed on other ranks kept its plan (as it must: bit for bit) without a
    word, though its steps now take another time. The checkpoint's RNG entry is made 2 ranks' (as 2 ranks write
    it); resumed on 1, one warning line names the budget, both rank counts and what to do."""
    from checkpoint import save_checkpoint

    monkeypatch.setattr(training.timing.budget, "measure",
                        lambda r: Timing(setup_s=1.0, step_s=0.5, eval_s=0.4, checkpoint_s=0.05))  # plans 14 steps
    with inject(interrupt_after=2):
        _run(tmp_path / "out", data_root, "--train.time_budget=10s")
    capsys.readouterr()
    _run(tmp_path / "same", data_root, "--train.time_budget=10s", "--train.max_iters=3")
    assert "warning" not in capsys.readouterr().out  # (fresh, and below resumed on its own ranks: nothing to say)
    ckpt = load_checkpoint(tmp_path / "out" / "ckpt.pt")
    window = ckpt["window"] | {"loss_sums": ckpt["window"]["loss_sums"] * 2}  # (each rank's own sum, as 2 ranks save)
    save_checkpoint(tmp_path / "out" / "ckpt.pt", ckpt | {"rng": {"ranks": ckpt["rng"]["ranks"] * 2}, "window": window})
    res = _run(tmp_path / "out", data_root, "--train.time_budget=10s")
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: ")]
    assert res["iter"] == 14 and len(warnings) == 1, warnings  # the plan is kept, and said once
    assert ("train.time_budget=10s fixed this run's length (max_iters 14)" in warnings[0]
            and "written on 2 rank(s), this run has 1" in warnings[0] and "resume on 2 rank(s)" in warnings[0]), warnings


@given(saved=st.integers(1, 8), world=st.integers(1, 8), budget=st.sampled_from(["0", "", "10s", "2m"]),
       rng=st.sampled_from(["ranks", "none", "not a dict", "empty"]))
def test_the_ranks_warning_is_given_exactly_when_a_kept_budget_plan_meets_other_ranks(saved, world, budget, rng):
    """The class: one line when a budget's plan is kept and the checkpoint's ranks are not this run's; none when
    there is no budget, the ranks agree, or the RNG entry tells no ranks (restoring it reports that)."""
    from training.timing.budget import resumed_ranks_notes

    entry = {"ranks": {"ranks": [{}] * saved}, "none": None, "not a dict": [1, 2], "empty": {"ranks": []}}[rng]
    cfg = load_config([f"--train.time_budget={budget}"])
    notes = resumed_ranks_notes({"rng": entry, "plan": {"max_iters": 7}}, cfg, world)
    if budget in ("10s", "2m") and rng == "ranks" and saved != world:
        assert len(notes) == 1 and "\n" not in notes[0] and f"written on {saved} rank(s), this run has {world}" in notes[0]
    else:
        assert notes == []

def test_timing_the_step_leaves_no_trace_the_budget_run_equals_a_plain_run_of_its_plan(tmp_path, data_root):
    """The real measure: it runs steps and evals, then restores every state; the run that follows is bit for
    bit a run without a budget given the decided max_iters and warmup_iters."""
    budgeted = _run(tmp_path / "budget", data_root, "--train.time_budget=1h", "--train.max_iters=12")
    saved = load_checkpoint(tmp_path / "budget")["plan"]
    assert saved["max_iters"] == 12 and saved["warmup_iters"] == 8  # an hour is plenty: the config's plan
    plain = _run(tmp_path / "plain", data_root, "--train.max_iters=12")
    assert budgeted["losses"] == plain["losses"]
    a, b = load_checkpoint(tmp_path / "budget"), load_checkpoint(tmp_path / "plain")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for sa, sb in zip(a["optimizer"]["optimizers"], b["optimizer"]["optimizers"]):
        for i in sa["state"]:
            assert all(torch.equal(sa["state"][i][k], sb["state"][i][k]) for k in sa["state"][i])


def test_eval_fulls_pass_over_the_val_split_is_measured_into_the_plan(tmp_path, data_root, monkeypatch, capsys):
    seen = []
    real = training.timing.budget.measure
    monkeypatch.setattr(training.timing.budget, "measure", lambda r: seen.append(real(r)) or seen[-1])
    _run(tmp_path / "out", data_root, "--train.time_budget=1h", "--train.max_iters=4", "--train.eval_full=true")
    # an eval reads 2 batches of each split; the whole val split (~111k tokens) is ~870 batches of 4 x 32
    assert seen[0].final_s > 50 * seen[0].eval_s > 0
    assert f"the whole val split {seen[0].final_s:.1f} s at the end" in capsys.readouterr().out
    _run(tmp_path / "off", data_root, "--train.time_budget=1h", "--train.max_iters=4")
    assert seen[1].final_s == 0.0


class _SlowSteps:
    """train.py's step, with `extra` seconds added to the calls whose index is in `slow` (counted from 0)."""

    def __init__(self, step, slow, extra):
        self.step, self.slow, self.extra, self.calls = step, slow, extra, 0

    def __getattr__(self, name):  # optimizers, scaler, ...: the real step's
        return getattr(self.step, name)

    def __call__(self, batches):
        import time
        out = self.step(batches)
        if self.calls in self.slow:
            time.sleep(self.extra)
        self.calls += 1
        return out


def _measure_with(monkeypatch, slow, extra):
    seen, real = [], training.timing.budget.measure

    def measure(r):
        r.trainer.step = _SlowSteps(r.trainer.step, slow, extra)
        seen.append(real(r))
        return seen[-1]
    monkeypatch.setattr(training.timing.budget, "measure", measure)
    return seen


def test_a_burst_of_slow_steps_does_not_move_the_measured_step(tmp_path, data_root, monkeypatch, capsys):
    # the first three timed steps (calls 2-4) slowed by 0.3 s, as when another process starts beside the run:
    # a median of those three would read > 0.3 s; the timed steps fill TIMED_S, so most are the real ~10 ms
    seen = _measure_with(monkeypatch, slow={2, 3, 4}, extra=0.3)
    _run(tmp_path / "out", data_root, "--train.time_budget=1h", "--train.max_iters=4")
    assert seen[0].timed_steps == training.timing.budget.MAX_TIMED and seen[0].step_s < 0.1
    assert f"(median of {training.timing.budget.MAX_TIMED})" in capsys.readouterr().out


def test_slow_steps_are_timed_as_many_times_as_fill_timed_s(tmp_path, data_root, monkeypatch):
    # every step 0.1 s slower: the last warm-up step (~0.1 s) sets the count, ceil(0.5 / 0.1xx) = 5 timed steps
    monkeypatch.setattr(training.timing.budget, "TIMED_S", 0.5)
    seen = _measure_with(monkeypatch, slow=set(range(100)), extra=0.1)
    _run(tmp_path / "out", data_root, "--train.time_budget=1h", "--train.max_iters=4")
    assert seen[0].timed_steps == 5 and 0.1 <= seen[0].step_s < 0.2


def test_a_run_saved_by_format_2_resumes_with_every_decision_it_made(tmp_path, data_root, monkeypatch, capsys):
    """Checkpoints written before the run plan had its own entry kept the decisions among the counters:
    the budget's max_iters and warmup, batch_size auto's micro-batch, the dtype. Rewritten by hand into that
    layout, an interrupted run resumes with all of them (nothing is measured again) and ends bitwise equal to
    the uninterrupted one."""
    import training.batch_size
    import training.builders
    from tiny_runs import as_version_2

    monkeypatch.setattr(training.timing.budget, "measure", lambda r: Timing(setup_s=1.0, step_s=0.5, eval_s=0.4,
                                                                      checkpoint_s=0.05))
    monkeypatch.setattr(training.batch_size, "memory_limit", lambda device: 10 * 2**30)
    monkeypatch.setattr(training.batch_size, "estimated_bytes", lambda *a, **k: (lambda m: m * 2**30))
    auto = ("--train.time_budget=10s", "--train.batch_size=auto", "--train.global_batch_size=16")
    full = _run(tmp_path / "full", data_root, *auto)
    with inject(interrupt_after=5):
        _run(tmp_path / "old", data_root, *auto)
    ckpt = load_checkpoint(tmp_path / "old")
    assert (ckpt["plan"]["micro_batch"], ckpt["plan"]["accum"], ckpt["plan"]["max_iters"]) == (8, 2, 14)
    torch.save(as_version_2(ckpt), tmp_path / "old" / "ckpt.pt")
    for module, name in ((training.timing.budget, "measure"), (training.builders, "measure_batch")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("a resumed run must not decide again"))
    capsys.readouterr()
    resumed = _run(tmp_path / "old", data_root, *auto)
    out = capsys.readouterr().out
    assert "time budget 10s: " in out and "batch_size auto: 8 x 32 tokens per micro-step" in out
    assert {k: v for k, v in full["losses"].items() if k > 5} == resumed["losses"] and resumed["iter"] == 14
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "old")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert b["version"] == VERSION and b["plan"]["micro_batch"] == 8 and "budget_iters" not in b["train"]
