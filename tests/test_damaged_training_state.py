"""A run's own state gone bad, found from outside: checkpoints damaged in what a resume restores (the optimizer's
moments, the weights, the plan, the counters, tensors without data) and runs that diverge in a step's update.

Before: a moment of another shape corrupted the heap in the fused AdamW step (free(): invalid next size, a
segfault); a NaN moment, or a step at lr 1e30, ended in NaN weights written over a good ckpt.pt with exit status
0; NaN weights on resume were blamed on the learning rate; a plan's attention 'x' and a meta tensor were
tracebacks; a NaN best_val_loss silently stopped best.pt; sample.py and chat.py on weights that overflow the
logits were tracebacks inside torch.multinomial. Each is now one line, and the checkpoint on disk is unchanged."""
from __future__ import annotations

import math
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint import load_checkpoint, save_checkpoint
from checkpoint.format import train_entry_problem
from errors import UserError, run_cli
from inference import chat_cli, sample_cli
from serving import make_chat_checkpoint
from tiny_runs import run
import training.loop

STEPS = 2


@pytest.fixture(scope="module")
def base(tmp_path_factory, data_root):
    """A 2-step run's out_dir: what each test copies and damages."""
    out = tmp_path_factory.mktemp("base") / "out"
    run(out, data_root, f"--train.max_iters={STEPS}", f"--train.eval_interval={STEPS}")
    return out


def damaged(base, tmp_path, edit) -> tuple:
    """A copy of the base run with its ckpt.pt edited by `edit(payload)` -> (out_dir, the file's bytes)."""
    out = tmp_path / "out"
    shutil.copytree(base, out)
    payload = load_checkpoint(out / "ckpt.pt")
    edit(payload)
    save_checkpoint(out / "ckpt.pt", payload)
    return out, (out / "ckpt.pt").read_bytes()


def refused_resume(out, data_root, bytes_before, *words) -> str:
    with pytest.raises(UserError) as e:
        run(out, data_root, f"--train.max_iters={STEPS + 1}", f"--train.eval_interval={STEPS + 1}")
    line = str(e.value)
    assert "\n" not in line and all(w in line for w in words), line
    assert (out / "ckpt.pt").read_bytes() == bytes_before  # nothing overwritten
    return line


@settings(max_examples=12)
@given(data=st.data(), fault=st.sampled_from(["shape", "integer", "nan", "inf", "some missing"]))
def test_class_a_damaged_optimizer_state_is_one_line_and_nothing_is_written(base, data_root, tmp_path_factory,
                                                                             data, fault):
    def edit(payload):
        states = payload["optimizer"]["optimizers"][0]["state"]
        i = data.draw(st.sampled_from(sorted(states)), label="parameter")
        moment = states[i]["exp_avg"]
        if fault == "shape":
            shape = data.draw(st.lists(st.integers(1, 70), min_size=1, max_size=3).filter(
                lambda s: tuple(s) != tuple(moment.shape)), label="shape")
            states[i]["exp_avg"] = torch.zeros(shape)
        elif fault == "integer":
            states[i]["exp_avg_sq"] = torch.zeros(moment.shape, dtype=torch.int64)
        elif fault in ("nan", "inf"):
            flat = states[i]["exp_avg_sq"].view(-1)
            flat[data.draw(st.integers(0, flat.numel() - 1), label="at")] = float(fault)
        else:
            for j in data.draw(st.sets(st.sampled_from(sorted(states)), min_size=1, max_size=len(states) - 1)):
                del states[j]

    out, before = damaged(base, tmp_path_factory.mktemp("opt"), edit)
    refused_resume(out, data_root, before, "its 'optimizer' entry is malformed", "use another checkpoint")


@settings(max_examples=6)
@given(data=st.data(), value=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_class_non_finite_weights_on_resume_are_named_not_blamed_on_the_learning_rate(base, data_root,
                                                                                     tmp_path_factory, data, value):
    def edit(payload):
        name = data.draw(st.sampled_from(sorted(k for k, v in payload["model"].items() if v.is_floating_point())))
        flat = payload["model"][name].view(-1)
        flat[data.draw(st.integers(0, flat.numel() - 1))] = value
        edit.name = name

    out, before = damaged(base, tmp_path_factory.mktemp("nan"), edit)
    line = refused_resume(out, data_root, before, "has non-finite weights", "use best.pt or an earlier checkpoint")
    assert "train.lr" not in line and edit.name.split(".")[-1] in line, line


@settings(max_examples=8)
@given(attention=st.text(max_size=8).filter(lambda a: a not in ("default", "flash", "cudnn", "efficient")))
def test_class_a_plans_attention_kernel_that_is_none_is_one_line(base, data_root, tmp_path_factory, attention):
    out, before = damaged(base, tmp_path_factory.mktemp("plan"), lambda p: p["plan"].update(attention=attention))
    refused_resume(out, data_root, before, "'plan' entry is malformed", "attention should be one of")


@given(best=st.one_of(st.floats(allow_nan=True), st.integers(-5, 5), st.text(max_size=2), st.booleans(), st.none()))
def test_class_best_val_loss_is_a_loss_or_inf(best):
    problem = train_entry_problem({"iter": 1, "tokens_seen": 1, "best_val_loss": best}, {})
    ok = not isinstance(best, bool) and isinstance(best, (int, float)) and not math.isnan(best) and best >= 0
    assert (problem is None) == ok, (best, problem)


@pytest.mark.parametrize("where", ["model", "optimizer"])
@pytest.mark.parametrize("kind", ["meta", "sparse"])
def test_a_tensor_without_values_anywhere_in_a_checkpoint_is_one_line_for_every_reader(base, tmp_path, data_root,
                                                                                       where, kind, capsys):
    def edit(payload):
        t = (payload["model"]["transformer.ln_f.weight"] if where == "model"
             else payload["optimizer"]["optimizers"][0]["state"][0]["exp_avg"])
        odd = torch.empty(t.shape, device="meta") if kind == "meta" else t.to_sparse()
        if where == "model":
            payload["model"]["transformer.ln_f.weight"] = odd
        else:
            payload["optimizer"]["optimizers"][0]["state"][0]["exp_avg"] = odd

    out, before = damaged(base, tmp_path, edit)
    refused_resume(out, data_root, before, "not a tensor that holds values")
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: sample_cli.main(["--checkpoint", str(out), "--prompt", "a", "--max-new-tokens", "2"]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "not a tensor that holds values" in err and "Traceback" not in err, err


def test_a_step_whose_update_overflows_stops_before_anything_is_saved(base, data_root, tmp_path):
    """lr 1e30 (the config's bound): the step's own loss and grad norm are finite, its update makes the weights
    ~1e28; the eval after it is NaN. At the last step: the good ckpt.pt stays, no best.pt of it, exit by the line."""
    out, before = damaged(base, tmp_path, lambda payload: None)
    best_before = (out / "best.pt").read_bytes()
    with pytest.raises(UserError) as e:
        run(out, data_root, f"--train.max_iters={STEPS + 1}", "--train.eval_interval=1", "--train.lr=1e30",
            "--train.min_lr=0", "--train.warmup_iters=0")
    assert f"became non-finite at iter {STEPS + 1}" in str(e.value) and f"still holds iter {STEPS}" in str(e.value)
    assert (out / "ckpt.pt").read_bytes() == before and (out / "best.pt").read_bytes() == best_before
    # mid-run, from scratch: the first eval is already NaN, and no checkpoint is written to be resumed
    with pytest.raises(UserError, match="nothing to resume"):
        run(tmp_path / "fresh", data_root, "--train.max_iters=3", "--train.eval_interval=1", "--train.lr=1e30",
            "--train.min_lr=0", "--train.warmup_iters=0")
    assert not (tmp_path / "fresh" / "ckpt.pt").exists()


def test_weights_that_turn_non_finite_after_a_finite_step_stop_the_run_at_the_next_check(base, data_root, tmp_path,
                                                                                        monkeypatch):
    """The guard read only the step's loss and grad norm (computed before the update): a NaN the update writes is
    found in the weights at the next log or checkpoint, before anything is logged, evaluated or saved."""
    real = training.loop.step_at

    def poisoning(r, i, lr):
        out = real(r, i, lr)
        if i == STEPS:  # the resumed run's first step: its loss was finite
            next(r.trainer.model.parameters()).data.view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(training.loop, "step_at", poisoning)
    out, before = damaged(base, tmp_path, lambda payload: None)
    with pytest.raises(UserError, match=f"the weights became non-finite by iter {STEPS + 1}; stopped, .* still holds "
                                        f"iter {STEPS}"):
        run(out, data_root, f"--train.max_iters={STEPS + 2}", f"--train.eval_interval={STEPS + 2}")
    assert (out / "ckpt.pt").read_bytes() == before


@pytest.mark.parametrize("scale", [1e25, 1e36])
@pytest.mark.parametrize("temperature", ["0", "0.8"])
def test_weights_that_overflow_the_logits_are_one_line_in_sample_and_chat(tmp_path, capsys, monkeypatch, scale,
                                                                        temperature):
    """Finite weights whose logits overflow (a diverged run's): torch.multinomial's traceback, top-p's index -1,
    or greedy's token 0 of all-NaN rows printed as text. Now the line sample.py and chat.py give alike."""
    import io

    make_chat_checkpoint(tmp_path / "ckpt.pt")
    payload = load_checkpoint(tmp_path / "ckpt.pt")
    payload["model"]["transformer.wte.weight"].mul_(scale)
    save_checkpoint(tmp_path / "ckpt.pt", payload)
    runs = (lambda: sample_cli.main(["--checkpoint", str(tmp_path), "--prompt", "ab", "--temperature", temperature,
                                     "--max-new-tokens", "3", "--dtype", "float32"]),
            lambda: chat_cli.main(["--checkpoint", str(tmp_path), "--temperature", temperature, "--dtype", "float32"]))
    for main in runs:
        monkeypatch.setattr("sys.stdin", io.StringIO("hello there\n"))
        with pytest.raises(SystemExit) as e:
            run_cli(main)
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert e.value.code == 2 and "Traceback" not in err and len(lines) == 1, err
        assert "the model's logits are NaN or inf" in lines[0] and "use best.pt or an earlier checkpoint" in lines[0]
