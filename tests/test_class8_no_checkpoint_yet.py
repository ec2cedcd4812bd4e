"""A run that stops before its first ckpt.pt (the loss diverged; the disk was full) has nothing to resume, and
the files it left make a fresh run in the same out_dir refuse to start: its line names every one of them, and
doing what it says lets the same command run.

Found from outside: the line named metrics.jsonl only, but best.pt (written at an eval, before the first
ckpt.pt: at the same iteration best.pt is written first) made the rerun refuse too ("holds an earlier run's
best.pt but no ckpt.pt")."""
from __future__ import annotations

import errno
import re

import pytest

import checkpoint.checkpointer
from training.config.sections import load_config
from training import loop
from training import cli as train_cli
from errors import run_cli
from faults import inject
from tiny_runs import tiny_argv


@pytest.mark.parametrize("cause", ["diverged", "disk full"])
@pytest.mark.parametrize("eval_first", [True, False], ids=["best.pt first", "no best.pt"])
def test_class_the_line_after_a_stop_before_any_checkpoint_names_every_file_and_its_advice_works(
        tmp_path, data_root, capsys, monkeypatch, cause, eval_first):
    out = tmp_path / "out"
    argv = tiny_argv(out, data_root, "--train.max_iters=4", "--train.checkpoint_interval=3",
                     f"--train.eval_interval={2 if eval_first else 100}")
    real_save = checkpoint.checkpointer.save_checkpoint

    def no_space_for_ckpt(path, payload, **kw):
        if path.name == "ckpt.pt":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(path, payload, **kw)

    if cause == "disk full":
        monkeypatch.setattr(checkpoint.checkpointer, "save_checkpoint", no_space_for_ckpt)
    with inject(**({"nan_at": 2} if cause == "diverged" else {})), pytest.raises(SystemExit) as stopped:
        run_cli(lambda: train_cli.main(argv))
    monkeypatch.undo()
    errors = [line for line in re.split(r"[\r\n]", capsys.readouterr().err) if line.startswith("error:")]
    assert stopped.value.code == 2 and len(errors) == 1, errors
    assert "nothing to resume" in errors[0], errors[0]
    left = sorted(p.name for p in out.iterdir() if p.name in ("best.pt", "metrics.jsonl"))
    assert left == (["best.pt"] if eval_first else []) + ["metrics.jsonl"]
    moved = re.search(r"\(or move (.*) away first\)", errors[0]).group(1).split(", ")
    assert sorted(moved) == [str(out / name) for name in left], errors[0]
    for i, path in enumerate(moved):  # as the line says
        (out / path).rename(tmp_path / f"away{i}")
    assert loop.train(load_config(argv))["iter"] == 4
