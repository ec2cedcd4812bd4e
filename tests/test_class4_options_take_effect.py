"""Class 4 (docs/reliability.md): an option that cannot take effect is never silently ignored and then
recorded as if it had: it takes effect, or is refused, or is said in a line naming it; and the saved
config (which an export's model card repeats) records what really happened. Table: (the option, the
run it cannot apply to)."""
from __future__ import annotations

import pytest

from training import cli as train_cli
from checkpoint import load_checkpoint
from entry_points import run_entry, train_argv


def run(argv, capsys):
    code, out, err = run_entry(train_cli.main, argv, capsys)
    assert code == 0, err[-2000:]
    return out


def test_class4_init_from_on_a_resumed_run_is_said_and_not_recorded(tmp_path, data_root, world, capsys):
    """The issue's example: --model.init_from given to a resumed run (here a source with another
    tokenizer) was ignored, yet the new checkpoint's config recorded it."""
    out = tmp_path / "out"
    run(train_argv(out, data_root, "--wandb.mode=disabled"), capsys)
    log = run(train_argv(out, data_root, "--wandb.mode=disabled", "--train.max_iters=4",
                         f"--model.init_from={world.gpt2}"), capsys)
    said = [ln for ln in log.splitlines() if "model.init_from" in ln and "not applied" in ln]
    assert len(said) == 1 and str(world.gpt2) in said[0], log[-2000:]
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["train"]["iter"] == 4
    assert ckpt["config"]["model"]["init_from"] == "scratch"


@pytest.fixture(scope="module")
def from_source(tmp_path_factory, data_root, world):
    """A run initialised from the world's char run, asking for a vocab_size the source does not have."""
    out = tmp_path_factory.mktemp("vocab") / "out"
    return out, train_argv(out, data_root, "--wandb.mode=disabled", f"--model.init_from={world.ckpt}",
                           "--model.vocab_size=128")


def test_class4_vocab_size_with_init_from_is_said_and_the_saved_config_records_the_sources(from_source, world,
                                                                                            capsys):
    """The issue's example: --model.vocab_size with init_from trained the source's vocabulary while the
    saved config kept the requested value."""
    out, argv = from_source
    log = run(argv, capsys)
    source_vocab = load_checkpoint(world.ckpt)["model_config"]["vocab_size"]
    assert source_vocab != 128
    said = [ln for ln in log.splitlines() if "model.vocab_size=128" in ln]
    assert len(said) == 1 and "not applied" in said[0] and str(source_vocab) in said[0], log[-2000:]
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["model_config"]["vocab_size"] == source_vocab
    assert ckpt["config"]["model"]["vocab_size"] == source_vocab


def test_class4_the_same_command_resumes_a_run_whose_vocabulary_came_from_its_source(from_source, capsys):
    """What the saved config now records must not make the same command's resume refuse (vocab_size is a
    key a resume may not change: the source's value is as saved)."""
    out, argv = from_source
    if not (out / "ckpt.pt").exists():
        run(argv, capsys)
    run([*argv, "--train.max_iters=4"], capsys)
    assert load_checkpoint(out / "ckpt.pt")["train"]["iter"] == 4
