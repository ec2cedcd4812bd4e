"""Checkpoints written before the checkpoint code moved into checkpoint/ still work: the committed
fixture (tests/fixtures/README.md says how it was made, by train.py at bc82a42) samples and resumes."""
from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from inference import sample_cli
from training import loop
from checkpoint import load_model
from errors import run_cli
from training.config.sections import load_config

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "ckpt_v2_char.pt"
# the tiny shakespeare char data that run was trained on, prepared by the same commit (format 1)
PREPARED_V1 = Path(__file__).resolve().parent / "fixtures" / "prepared-v1-char"
# the settings the fixture was trained with (its config entry holds them too)
FIXTURE_ARGV = ["--config", "shakespeare_char", "--model.n_layer=1", "--model.n_head=2", "--model.n_embd=16",
                "--model.block_size=16", "--train.batch_size=2", "--train.eval_interval=3", "--train.eval_iters=1",
                "--train.warmup_iters=1", "--train.dtype=float32", "--wandb.mode=disabled",
                "--model.gelu_approximate=tanh"]  # shakespeare_char.yaml's GELU when the fixture was trained


def _raw_tensors() -> dict[str, torch.Tensor]:
    """The fixture's weights read without our code: torch.save's zip holds a pickle, read with
    torch.load(weights_only=True) directly."""
    assert zipfile.is_zipfile(FIXTURE)
    return torch.load(FIXTURE, map_location="cpu", weights_only=True)["model"]


def test_an_old_checkpoint_loads_for_inference_with_its_own_weights():
    loaded = load_model(str(FIXTURE))
    raw = _raw_tensors()
    ours = loaded.model.state_dict()
    assert set(ours) == set(raw)
    for k, t in raw.items():
        assert torch.equal(ours[k], t), k
    assert loaded.tokenizer["tokenizer"] == "char" and len(loaded.tokenizer["chars"]) == 65
    assert (loaded.model.config.n_layer, loaded.model.config.n_embd, loaded.model.config.block_size) == (1, 16, 16)


def test_an_old_checkpoint_samples_greedily_like_an_uncached_loop(capsys):
    loaded = load_model(str(FIXTURE), dropout=0.0)
    chars = loaded.tokenizer["chars"]
    idx = torch.tensor([[chars.index("\n")]])
    with torch.no_grad():  # the textbook loop: whole context each step, argmax, no cache
        for _ in range(10):
            idx = torch.cat([idx, loaded.model(idx[:, -16:])[:, -1].argmax(-1, keepdim=True)], dim=1)
    expected = "".join(chars[i] for i in idx[0].tolist())
    with pytest.raises(SystemExit) as ei:
        run_cli(lambda: sample_cli.main(["--checkpoint", str(FIXTURE), "--temperature", "0", "--max-new-tokens",
                                            "10", "--dtype", "float32", "--device", "cpu"]))
    assert ei.value.code == 0
    assert capsys.readouterr().out == expected + "\n"


def test_an_old_run_resumes_where_it_stopped(tmp_path):
    """An old run resumes on the data it was prepared with (an unchanged format-1 dir is kept)."""
    root = tmp_path / "prepared"
    shutil.copytree(PREPARED_V1, root)
    out = tmp_path / "old-run"
    out.mkdir()
    shutil.copy(FIXTURE, out / "ckpt.pt")
    res = loop.train(load_config([*FIXTURE_ARGV, f"--train.out_dir={out}", f"--data.root={root}",
                                   "--train.max_iters=5", "--train.log_interval=1"]))
    assert sorted(res["losses"]) == [4, 5]  # iters 1-3 came from the old run
    assert res["iter"] == 5


FIXTURE_V3 = FIXTURE.with_name("ckpt_v3_char.pt")  # iter 3 of a 6-step run, format 3 (README.md)
V3_AFTER = FIXTURE.with_name("ckpt_v3_char_iter6.pt")  # that run's weights and losses at iter 6, uninterrupted
V3_ARGV = ["--config", "shakespeare_char", "--model.n_layer=1", "--model.n_head=2", "--model.n_embd=16",
           "--model.block_size=16", "--train.batch_size=2", "--train.grad_accum_steps=2", "--train.eval_interval=3",
           "--train.eval_iters=1", "--train.warmup_iters=2", "--train.dtype=float32", "--wandb.mode=disabled",
           "--train.max_iters=6", "--train.log_interval=1"]


def test_a_format_3_run_resumes_bit_for_bit_as_it_would_have_gone_on(tmp_path):
    """Its plan (a time budget's schedule among it) is kept, not decided again, and the steps after the
    resume give the uninterrupted run's losses exactly and its weights to the last bits: the fixture was made on
    an AVX512 CPU, whose kernels sum in another order than an AVX2 CPU's (a Zen 3, 2026-11-28: the losses equal,
    the weights 3.4e-7 apart at most after the last step). A resume that lost state (the optimizer's moments,
    the schedule, the data position) moves them by orders of magnitude more."""
    root = tmp_path / "prepared"
    shutil.copytree(PREPARED_V1, root)
    out = tmp_path / "v3-run"
    out.mkdir()
    shutil.copy(FIXTURE_V3, out / "ckpt.pt")
    res = loop.train(load_config([*V3_ARGV, f"--train.out_dir={out}", f"--data.root={root}"]))
    after = torch.load(V3_AFTER, map_location="cpu", weights_only=True)
    assert res["iter"] == after["iter"] == 6
    assert {i: res["losses"][i] for i in (4, 5, 6)} == {i: after["losses"][i] for i in (4, 5, 6)}
    weights = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)["model"]
    assert set(weights) == set(after["model"])
    for k, t in after["model"].items():
        torch.testing.assert_close(weights[k], t, rtol=0, atol=2e-6, msg=k)


def version_1_of(v2: dict) -> dict:
    """The fixture as format 1 kept it (format.upgrade's docstring, written out by hand): the counters at the top
    level, no elapsed_s, one optimizer state, rank 0's RNG streams."""
    old = {k: v for k, v in v2.items() if k not in ("train", "optimizer", "rng")}
    old |= {k: v2["train"][k] for k in ("iter", "best_val_loss", "tokens_seen")} | {"wandb_run_id": v2["train"]["run_id"]}
    return old | {"version": 1, "optimizer": v2["optimizer"]["optimizers"][0], "rng": v2["rng"]["ranks"][0]}


def test_a_resumed_run_says_when_its_clock_starts_at_the_resume(tmp_path, capsys):
    """A version 1 checkpoint recorded no wall time: its resumed run counts from 0, and says so in a line; a
    checkpoint that recorded it (the version 2 fixture, upgraded as a resume reads it) gives no such line."""
    from checkpoint.format import upgrade
    from training.run import resumed_clock_notes

    root = tmp_path / "prepared"
    shutil.copytree(PREPARED_V1, root)
    out = tmp_path / "old-run"
    out.mkdir()
    v2 = torch.load(FIXTURE, map_location="cpu", weights_only=True)
    torch.save(version_1_of(v2), out / "ckpt.pt")
    res = loop.train(load_config([*FIXTURE_ARGV, f"--train.out_dir={out}", f"--data.root={root}",
                                   "--train.max_iters=4"]))
    assert res["iter"] == 4
    assert "did not record the wall time of its 3 steps" in capsys.readouterr().out
    assert v2["train"]["elapsed_s"] > 0 and resumed_clock_notes(upgrade(v2)) == []