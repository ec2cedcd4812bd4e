"""Class 3 (docs/reliability.md): the edge values of a path. Every path option of every entry point
(enumerated: tests/entry_points.py's path_options, from the parsers and the config fields of kind path)
given an empty value, a NUL byte, a name over 255 bytes, a path over 4096 bytes, or bytes that are not
UTF-8 (argv's surrogateescape'd bytes) ends in one `error:` line naming the option, exit 2, no traceback
and nothing written."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ownership
from training import cli as train_cli
from entry_points import PARSERS, TrainKey, _path_actions, path_options, run_entry, train_argv
from errors import UserError
from fileio import NAME_MAX, PATH_MAX, check_path_value, path_problem
from training.config.sections import load_config

OPTIONS = path_options()
SAFE = st.text(alphabet="abcXYZ019_-.", min_size=1, max_size=8)  # a harmless part of a path around the fault
FAULTS = {
    "empty": lambda a, b: "",
    "nul": lambda a, b: f"{a}\0{b}",
    "long_name": lambda a, b: f"{a}/{'n' * (NAME_MAX + 1 + len(b))}",
    "long_path": lambda a, b: "/".join([a] + ["d" * 200] * (PATH_MAX // 200 + 1)),
    "not_utf8": lambda a, b: f"{a}{os.fsdecode(bytes([0x80 + len(b) * 13 % 0x80]))}{b}",
}


def test_class3_the_table_lists_every_path_option():
    """The enumeration found every writer's output and every config key of kind path (a parser whose
    path options lost their path_arg type would drop out of the property silently)."""
    names = {str(o) for o in OPTIONS}
    for expected in ("sample.py --out", "python -m eval.inspect --out", "python -m training.plot --out",
                     "bench.py --json", "python -m checkpoint --out", "python -m checkpoint.export --out",
                     "python -m data.prepare --root", "train.py --train.out_dir", "train.py --data.root",
                     "train.py --model.init_from", "train.py --config", "python -m training.plot runs"):
        assert expected in names, (expected, sorted(names))


def check_one_line(option, fault: str, a: str, b: str, capsys, folder: Path) -> None:
    if fault == "empty" and option.empty_ok:
        return  # '' is this option's "none" (its default), not a fault
    before = set(folder.iterdir())
    code, out, err = run_entry(option.main, option.argv(FAULTS[fault](a, b)), capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert option.option.lstrip("-") in lines[0], lines[0]
    assert set(folder.iterdir()) == before  # (`--out ''` wrote into the current folder)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("option", OPTIONS, ids=str)
def test_class3_path_edge_values_are_one_line_in_every_path_option(option, fault, capsys, tmp_path, monkeypatch):
    """The table: every (path option, fault) pair, once."""
    monkeypatch.chdir(tmp_path)
    check_one_line(option, fault, "out", "x", capsys, tmp_path)


@given(option=st.sampled_from(OPTIONS), fault=st.sampled_from(sorted(FAULTS)), a=SAFE, b=SAFE)
def test_class3_path_edge_values_property(option, fault, a, b, capsys, tmp_path, monkeypatch):
    """The property: any option, any fault, around any harmless text (the profile's max_examples)."""
    monkeypatch.chdir(tmp_path)
    check_one_line(option, fault, a, b, capsys, tmp_path)


@pytest.mark.parametrize("value, words", [
    ("", "is empty"), ("a\0b", "NUL"), ("x" * 256, "256 bytes"), ("/".join(["d" * 250] * 17), "over the 4096"),
    (os.fsdecode(b"caf\xe9"), "not valid UTF-8 (byte 0xe9"),
])
def test_class3_path_problem_names_each_fault(value, words):
    assert words in path_problem(value)
    with pytest.raises(UserError, match="--out"):
        check_path_value(value, "--out")


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1,
               max_size=60))
def test_class3_an_ordinary_path_passes_unchanged(text):
    """Any UTF-8 text without NUL, within the lengths, is a path (spaces, dashes, non-ASCII letters)."""
    assert path_problem(text) is None
    assert check_path_value(text, "--out") == Path(os.path.expanduser(text))


def test_class3_a_name_over_255_bytes_in_the_gate_is_one_line_not_a_traceback(tmp_path):
    """The issue's example: `OSError: File name too long` from Path.is_dir() in ownership._managed_below."""
    with pytest.raises(UserError, match="over the 255"):
        ownership.check_target(tmp_path / ("x" * 300), ownership.OUT_DIR, "train.out_dir")
    assert list(ownership._managed_below(tmp_path / ("x" * 300))) == []  # reached otherwise: nothing, no OSError


def test_class3_out_empty_writes_nothing_into_the_current_folder(world, capsys, tmp_path, monkeypatch):
    """The issue's example: `--out ''` wrote into the current directory (eval.inspect's pictures)."""
    import eval.inspect as inspect_cli

    monkeypatch.chdir(tmp_path)
    code, _, err = run_entry(inspect_cli.main, ["--checkpoint", world.ckpt, "--text", "hear", "--out", ""], capsys)
    assert code == 2 and "--out" in err and "is empty" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", [o for o in OPTIONS if str(o) != "train.py --config"], ids=str)
def test_class3_a_home_path_means_home_in_every_path_option(option, tmp_path, monkeypatch):
    """`~/x` is $HOME/x in every path option and config key of kind path, as the gate (ownership.check_output)
    checks it: train.py wrote `--train.out_dir=~/runs/x` into ./~/runs/x of the current folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if isinstance(option, TrainKey):
        section, key = option.option.lstrip("-").split(".")
        got = getattr(getattr(load_config([f"{option.option}=~/x"]), section), key)
    else:
        parser = dict((e, build) for e, (build, _) in PARSERS.items())[option.entry]()
        action = next(a for a, prefix in _path_actions(parser)
                      if (a.option_strings[-1] if a.option_strings else a.dest) == option.option)
        got = action.type("~/x")
    assert os.fspath(got) == str(tmp_path / "home" / "x")


def test_class3_train_writes_a_home_out_dir_in_home(world, tmp_path, monkeypatch, capsys):
    """End to end: a tiny run with `--train.out_dir=~/runs/x` writes under $HOME, and nothing named ~ appears
    in the current folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    code, _, err = run_entry(train_cli.main, train_argv(Path("~/runs/x"), world.data_root, "--wandb.mode=disabled"),
                             capsys)
    assert code == 0, err
    assert (tmp_path / "home" / "runs" / "x" / "ckpt.pt").is_file() and not (tmp_path / "~").exists()
