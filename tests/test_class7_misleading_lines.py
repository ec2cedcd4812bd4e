"""Class 7 (docs/reliability.md): lines that mislead. Each line the issue found, in the case that showed
it: the new line says what is really the matter (and the old wording is gone). The symlinked lock's
`pid ? on host ?` is class 1's test_class1_a_symlinked_lock_names_the_link_not_pid_question_marks."""
from __future__ import annotations

import threading
import time
import warnings

import pytest
import torch

import ownership
from training import cli as train_cli
from checkpoint import load_checkpoint
from cli_lines import an_error_line
from data import holds
from entry_points import WRITERS, run_entry, train_argv
from eval.figures import Inspection, attention_figure, figure_png, surprisal_figure
from locks import DirLock
from managed_folders import KINDS, make_managed


def test_class7_init_from_with_other_characters_says_the_characters_differ(tmp_path, data_root, world, capsys):
    """Was: "trained with tokenizer 'char' (char vocab), but this data uses 'char' (char vocab)"."""
    corpus = tmp_path / "digits.txt"
    corpus.write_text("0123456789 +-=\n" * 200)
    argv = train_argv(tmp_path / "out", data_root, "--wandb.mode=disabled", f"--data.dataset={corpus}",
                      f"--data.root={tmp_path / 'prepared'}", f"--model.init_from={world.ckpt}")
    line = an_error_line(*run_entry(train_cli.main, argv, capsys)[::2])
    assert "but this data uses 'char'" not in line
    assert "other characters" in line and "only the source has" in line and "'+'" in line, line


def test_class7_a_v2_checkpoint_with_a_damaged_train_entry_names_train_not_plan(tmp_path, data_root, world, capsys):
    """Was: "has no 'plan' entry", an entry version 2 never had (its plan lived inside "train")."""
    payload = load_checkpoint(world.ckpt)
    payload.pop("plan", None)
    out = tmp_path / "single"  # (the world's run's out_dir name: its saved config resumes as it is)
    out.mkdir()
    torch.save({**payload, "version": 2, "train": "damaged"}, out / "ckpt.pt")
    line = an_error_line(*run_entry(train_cli.main, train_argv(out, data_root, "--wandb.mode=disabled"), capsys)[::2])
    assert "'plan'" not in line and "'train' entry is malformed" in line, line


def test_class7_a_rank_registering_as_a_reader_is_no_wait_for_a_preparation(tmp_path, capsys, monkeypatch):
    """Was: "waiting for pid N, which is preparing ..." on every 2-rank start, data up to date: the other
    rank held the prepare lock for the moment it took to register as a reader (hold_data; here that moment
    is stretched to 0.6 s, so that the two always meet)."""
    real = holds.atomic_write_bytes

    def slow(*args, **kw):
        time.sleep(0.6)
        return real(*args, **kw)
    monkeypatch.setattr(holds, "atomic_write_bytes", slow)
    other = threading.Thread(target=holds.hold_data, args=(tmp_path, "rank 1"))
    other.start()
    time.sleep(0.2)  # rank 1 holds the lock, registering
    holds.hold_data(tmp_path, "rank 0")
    other.join()
    assert len(list((tmp_path / holds.READERS).glob("*.json"))) == 1  # (both wrote this process's record)
    assert "waiting" not in capsys.readouterr().err


def test_class7_a_long_wait_says_what_the_holder_does(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(holds, "SAY_AFTER_S", 0.05)
    other = DirLock(tmp_path, holds.PREPARE_LOCK, what="preparing")
    assert other.try_acquire() is None
    threading.Timer(1.2, other.release).start()  # (the waiter looks every 0.5 s)
    holds.wait_for_lock(DirLock(tmp_path, holds.PREPARE_LOCK), tmp_path).release()
    err = capsys.readouterr().err
    assert err.count("waiting for pid") == 1 and "which is preparing" in err, err


def test_class7_inspect_interval_with_block_size_1_is_refused_not_nan(tmp_path, data_root, capsys):
    """Was: `nan bits/token` every inspect_interval, for a text of one token that eval.inspect refuses."""
    argv = train_argv(tmp_path / "out", data_root, "--wandb.mode=disabled", "--model.block_size=1",
                      "--eval.inspect_interval=1")
    code, out, err = run_entry(train_cli.main, argv, capsys)
    line = an_error_line(code, err)
    assert "eval.inspect_interval" in line and "block_size" in line and "nan" not in out, line


def cjk_inspection() -> Inspection:
    labels = ["中", "文", "字", "符", "日本", "語", "한", "국"]
    t = len(labels)
    attention = torch.tril(torch.ones(1, 1, t, t)) / torch.arange(1, t + 1).view(1, 1, t, 1)
    return Inspection(list(range(t)), labels, attention, [float("nan")] + [1.0] * (t - 1),
                      [[(0, "中", 0.5), (1, "文", 0.25)]] * t, 100, "cjk")


def test_class7_cjk_tokens_draw_without_a_warning_per_glyph_and_say_so_once(capsys):
    """Was: dozens of matplotlib "Glyph ... missing from font(s)" warnings on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            insp = cjk_inspection()
            figure_png(attention_figure(insp))
            figure_png(surprisal_figure(insp))
    glyphs = [str(w.message) for w in caught if "missing from" in str(w.message) or "Glyph" in str(w.message)]
    assert glyphs == [], glyphs[:3]
    err = capsys.readouterr().err
    assert err.count("drawn as escaped code points") <= 1, err  # once per process (an earlier test may have said it)


@pytest.mark.parametrize("kind", [None, *KINDS])
@pytest.mark.parametrize("writer", [w for w in WRITERS if w.makes == "file"], ids=str)
def test_class7_a_file_writer_given_a_folder_suggests_a_file_it_then_takes(writer, kind, world, capsys, tmp_path,
                                                                          monkeypatch):
    """Was: sample.py --out out/small said "is a directory; name a file, e.g. out/small/samples.txt", and that
    file was refused next: it lies in a training out_dir. The file a writer suggests passes its own gate."""
    monkeypatch.chdir(tmp_path)
    folder = make_managed(kind, tmp_path / "managed") if kind else tmp_path / "plain"
    folder.mkdir(exist_ok=True)
    code, _, err = run_entry(writer.main, writer.argv(folder, world), capsys)
    if code == 0:
        return  # a writer that takes a folder (training.plot writes curves.png in it)
    line = an_error_line(code, err)
    if "e.g. " not in line:
        return  # refused without a suggestion (a managed folder named as such by the gate)
    suggested = line.split("e.g. ", 1)[1].split()[0].rstrip(";,)")
    ownership.check_output(suggested, "--out")  # the one gate every writer calls takes it (no rerun: bench.py's is 7 s)


@pytest.mark.parametrize("entry", ["sample.py", "chat.py", "eval.inspect", "checkpoint.export", "model.init_from"])
def test_class7_a_hub_style_name_that_is_no_path_says_which_hub_names_are_read(entry, tmp_path, data_root, capsys,
                                                                               monkeypatch):
    """Was (found from outside): `--model.init_from=someorg/some-model` said only "checkpoint someorg/some-model
    does not exist ... train first", while openai-community/gpt2 is fetched from the hub: an owner/name where no
    folder `owner` is here now also says which hub names are read. A local path's line stays as it was."""
    import importlib

    monkeypatch.chdir(tmp_path)
    mains = {"sample.py": ("inference.sample_cli", ["--checkpoint"]), "chat.py": ("inference.chat_cli", ["--checkpoint"]),
             "eval.inspect": ("eval.inspect", ["--text", "x", "--out", str(tmp_path / "i"), "--checkpoint"]),
             "checkpoint.export": ("checkpoint.export", ["--out", str(tmp_path / "e"), "--checkpoint"])}
    for name, words in (("someorg/some-model", ("only GPT-2's models are read", "openai-community/")),
                        (str(tmp_path / "no_such_run"), ("does not exist",))):
        if entry == "model.init_from":
            code, _, err = run_entry(train_cli.main, train_argv(tmp_path / "out", data_root, f"--model.init_from={name}"),
                                     capsys)
        else:
            module, argv = mains[entry]
            code, _, err = run_entry(importlib.import_module(module).main, [*argv, name], capsys)
        line = an_error_line(code, err, name, *words)
        assert ("only GPT-2's models" in line) == (name == "someorg/some-model"), line
