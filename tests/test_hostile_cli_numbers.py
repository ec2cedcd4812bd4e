"""The number and string options of the other entry points, given any value: python -m eval.hellaswag
(--limit, --batch-size, --device), python -m eval.inspect (--layer, --head, --text) and python -m
data.prepare (--val-fraction, --shard-tokens, --tokenizer-sample-mb, --num-proc, --tokenizer), through
each CLI's main(argv) in-process, with the real tiny checkpoints of tests/hostile_world.py's world:
one `error:` line naming the option (status 2), or a working output; never a traceback, never past
HANG_S. python -m checkpoint.export, python -m checkpoint consolidate and python -m training.plot take
only paths and flags (tests/test_hostile_kinds.py gives those every kind of path).

Then the data defects found beside them: --val-dataset's messages, a refused --root leaving a folder
behind, a local hf:<folder> source with the root inside it, and data.shard_tokens=1.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

import data.build as data_build
import eval.hellaswag as hellaswag
import eval.inspect as inspect
from data import DataConfig, prepare_data
from data.prepare import main as prepare_main
from errors import UserError

from hostile_values import SPECIAL_FLOATS, SPECIAL_INTS, TEXTS
from hostile_world import make_kind, run_entry
from cli_lines import an_error_line



def int_values():
    return st.one_of(st.sampled_from(SPECIAL_INTS + [10**30, 2**63]), st.integers()).map(str) | st.sampled_from(TEXTS)


def float_values():
    return st.one_of(st.sampled_from(SPECIAL_FLOATS), st.floats()).map(repr) | st.sampled_from(TEXTS)


DEVICES = ["cpu", "auto", "cuda", "cuda:99", "cuda:-1", "cuda:1e9", "mps", "meta", "xla", "cpu:0", "", " ", "\x00",
           "CPU", "cuda:" + "9" * 5000, "é"]


def refused_or_worked(code: int, out: str, err: str, option: str, text: str) -> bool:
    """True where it worked; else the one `error:` line, naming the option (as --shard-tokens or as
    data.shard_tokens) where the value is not blank."""
    if code == 0:
        assert "Traceback" not in err, err
        return True
    line = an_error_line(code, err)
    names = (option, option.lstrip("-").replace("-", "_"))
    assert not text.strip() or "\x00" in text or any(n in line for n in names), (names, line)
    return False


# ------------------------------------------------------------------------------------------ eval.hellaswag

@pytest.mark.parametrize("option", ["--limit", "--batch-size", "--device"])
@settings(max_examples=max(5, settings().max_examples // 2))
@given(data=st.data())
def test_hellaswag_options_refuse_in_one_line_or_score(world, capsys, option, data):
    text = data.draw(st.sampled_from(DEVICES) if option == "--device" else int_values())
    argv = ["--checkpoint", world.gpt2, "--data", world.hellaswag, "--json", "--dtype", "float32",
            *([] if option == "--device" else ["--device", "cpu"]), f"{option}={text}"]
    code, out, err = run_entry(hellaswag.main, argv, capsys)
    if refused_or_worked(code, out, err, option, text):
        result = json.loads(out)
        assert result["items"] == 1 and 0 <= result["acc"] <= 1, result  # the world's one item, scored
        if option != "--device":
            assert int(float(text)) >= 1


# ------------------------------------------------------------------------------------------ eval.inspect

# "\udcff": the byte 0xff of a command line that is not UTF-8 (surrogateescape); no other lone surrogate
# can come from a command line, so the drawn texts have none
TEXT_VALUES = ["", " ", "\x00", "hear", "é" * 3, "\udcff", "a" * 5000, "\n\n", "ROMEO:"]
TEXTS_DRAWN = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@pytest.mark.parametrize("option", ["--layer", "--head", "--text"])
@settings(max_examples=max(5, settings().max_examples // 4))
@given(data=st.data())
def test_inspect_options_refuse_in_one_line_or_draw(world, capsys, tmp_path_factory, option, data):
    text = data.draw(st.sampled_from(TEXT_VALUES) | TEXTS_DRAWN if option == "--text" else int_values())
    out_dir = tmp_path_factory.mktemp("inspect")
    argv = ["--checkpoint", world.ckpt, "--out", out_dir, *([] if option == "--text" else ["--text", "hear"]),
            f"{option}={text}"]
    code, out, err = run_entry(inspect.main, argv, capsys)
    if refused_or_worked(code, out, err, option, text):
        assert (out_dir / "attention.png").read_bytes()[:4] == b"\x89PNG"
        if option != "--text":  # the model has 2 layers of 2 heads: an index it accepted is one of them
            assert int(text) in (0, 1), text


# ------------------------------------------------------------------------------------------ data.prepare

class Built(BaseException):
    """Raised where the build would start: the values were accepted."""


PREPARE_NUMBERS = {"--val-fraction": float, "--shard-tokens": int, "--tokenizer-sample-mb": int, "--num-proc": int}
TOKENIZERS = ["char", "gpt2", "bpe:300", "bpe:0", "bpe:-1", "bpe:1e9", "bpe:" + "9" * 5000, "", "nope", "bpe:",
              "CHAR"]


def prepare_argv(world, root: Path, option: str, text: str) -> list[str]:
    return ["--dataset", world.corpus, "--root", root, "--no-progress", *([] if option == "--tokenizer" else
                                                                         ["--tokenizer", "char"]), f"{option}={text}"]


@pytest.mark.parametrize("option", [*PREPARE_NUMBERS, "--tokenizer"])
@settings(max_examples=max(5, settings().max_examples // 2))
@given(data=st.data())
@example(data=None)
def test_prepare_options_refuse_in_one_line_or_prepare(world, capsys, tmp_path_factory, monkeypatch, option, data):
    """An accepted value prepares the world's small corpus (1,760 bytes): a prepared dir with meta.json,
    at most 1,760 / shard_tokens + 2 shard files, and a refusal creates nothing under --root."""
    if data is None:
        text = {"--shard-tokens": "1", "--num-proc": str(10**30), "--val-fraction": "5e-324",
                "--tokenizer-sample-mb": str(2**63), "--tokenizer": "bpe:" + "9" * 5000}[option]
    elif option == "--tokenizer":
        text = data.draw(st.sampled_from(TOKENIZERS))
    else:
        text = data.draw(float_values() if PREPARE_NUMBERS[option] is float else int_values())
    root = tmp_path_factory.mktemp("prepared") / "root"
    if option == "--num-proc" and text.strip().isascii() and text.strip().isdigit() and int(text) > 0:
        # accepted, it starts that many processes (seconds each): checked up to where the build starts them
        def built(*a, **k):
            raise Built
        monkeypatch.setattr(data_build, "write_build", built)
        try:
            code, out, err = run_entry(prepare_main, prepare_argv(world, root, option, text), capsys)
        except Built:
            assert int(text) <= 1024, text
            return
        monkeypatch.undo()
    else:
        code, out, err = run_entry(prepare_main, prepare_argv(world, root, option, text), capsys)
    if refused_or_worked(code, out, err, option, text):
        prepared = Path(out.strip())
        assert prepared.parent == root and (prepared / "meta.json").is_file()
        if option == "--shard-tokens":
            assert len(list(prepared.glob("*.bin"))) <= world.corpus.stat().st_size / int(text) + 2
        if option == "--num-proc":
            assert 0 <= int(text) <= 1024
    else:
        assert not root.exists(), list(root.rglob("*"))  # nothing left behind by a refusal


# ------------------------------------------------------------------------------------------ the data defects

@pytest.mark.parametrize("kind", ["fifo", "null_device", "socket", "symlink_loop", "missing"])
def test_val_dataset_refusals_name_data_val_dataset(world, tmp_path, capsys, kind):
    """They named data.dataset, which was fine; the bad one is data.val_dataset."""
    val = make_kind(kind, tmp_path / "val.txt")
    code, _, err = run_entry(prepare_main, ["--dataset", world.corpus, "--val-dataset", val, "--tokenizer", "char",
                                            "--root", tmp_path / "p", "--no-progress"], capsys)
    line = an_error_line(code, err, "data.val_dataset", str(val))
    assert "data.dataset" not in line, line
    if kind != "missing":  # what the path is, not "does not exist" (a symlink loop is there)
        assert "does not exist" not in line, line


def test_a_refused_prepare_leaves_no_root_behind(tmp_path, capsys, monkeypatch):
    """A refusal found after data.root was created (here: data.local_path is not tiny shakespeare, found
    while opening the sources) left the empty folders behind; now the ones it created are removed."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "input.txt").write_text("not shakespeare\n")
    monkeypatch.delenv("SMALLGPT_SHAKESPEARE", raising=False)
    root = source / "a" / "b" / "prepared"
    code, _, err = run_entry(prepare_main, ["--local-path", source / "input.txt", "--root", root, "--tokenizer", "char",
                                            "--no-progress"], capsys)
    an_error_line(code, err, "data.local_path")
    assert sorted(p.name for p in source.iterdir()) == ["input.txt"]


def test_root_inside_a_local_hf_folder_is_refused(tmp_path, capsys):
    """hf:<a local folder> reads that folder; a --root inside it was written into it (the next prepare
    would read the prepared files as a source). Refused like a root inside any other source."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("To be, or not to be.\n" * 20)
    code, _, err = run_entry(prepare_main, ["--dataset", f"hf:{source}", "--root", source / "prepared",
                                            "--tokenizer", "char", "--no-progress"], capsys)
    an_error_line(code, err, "data.root", "inside the source")
    assert sorted(p.name for p in source.iterdir()) == ["a.txt"]


def test_shard_tokens_that_would_write_over_100k_files_is_refused_before_the_prepare(tmp_path, shakespeare_path):
    """data.shard_tokens=1 wrote one file per token (1.1M for tiny shakespeare, 1,115,394 bytes). The bound:
    the sources' bytes / shard_tokens <= 100,000 files; the smallest value that works is
    ceil(1,115,394 / 100,000) = 12, written out."""
    root = tmp_path / "p"
    cfg = DataConfig(tokenizer="char", root=str(root), local_path=str(shakespeare_path), shard_tokens=11)
    with pytest.raises(UserError) as e:
        prepare_data(cfg, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "data.shard_tokens=11" in msg and "at least 12" in msg, msg
    assert not root.exists()
    assert shakespeare_path.stat().st_size == 1_115_394 and math.ceil(1_115_394 / 100_000) == 12




# ------------------------------------------------------------------------------------------ --device, every command

def _device_options():
    """Every command's device option (a new command with --device adds its row): (name, main, argv of a value)."""
    from benchmarks import cli as bench_cli
    from inference import chat_cli, sample_cli
    from server import cli as serve_cli
    from training import cli as train_cli
    from hostile_world import train_argv
    return {
        "sample.py --device": (sample_cli.main, lambda w, v: ["--checkpoint", w.ckpt, "--device", v]),
        "chat.py --device": (chat_cli.main, lambda w, v: ["--checkpoint", w.ckpt, "--device", v]),
        "serve.py --device": (serve_cli.main, lambda w, v: ["--checkpoint", w.ckpt, "--device", v]),
        "eval.hellaswag --device": (hellaswag.main, lambda w, v: ["--checkpoint", w.gpt2, "--data", w.hellaswag,
                                                                   "--device", v]),
        "bench.py --device": (bench_cli.main, lambda w, v: ["--device", v, "--quick", "--only", "loss"]),
        "train.py train.device": (train_cli.main, lambda w, v: train_argv(w.root / "never", w.data_root,
                                                                           f"--train.device={v}",
                                                                           "--wandb.mode=disabled")),
    }


# not a device on any machine (cpu:1, an index of the CPU, picks nothing): train.py refused them, sample.py took cpu:1
NOT_DEVICES = ["cpu:0", "cpu:1", "mps:0", "meta", "xla", "CPU", "cuda:-1", "cuda:1e9", "", "é"]


@pytest.mark.parametrize("value", NOT_DEVICES)
@pytest.mark.parametrize("option", ["sample.py --device", "chat.py --device", "serve.py --device",
                                    "eval.hellaswag --device", "bench.py --device", "train.py train.device"])
def test_every_device_option_refuses_what_is_no_device_in_one_line(world, capsys, option, value):
    main, argv = _device_options()[option]
    code, out, err = run_entry(lambda a: main(a) and 0, argv(world, value), capsys)
    line = an_error_line(code, err)
    assert "device" in line, line
    assert not (world.root / "never").exists()


@pytest.mark.parametrize("value", list(dict.fromkeys(DEVICES + NOT_DEVICES)))
def test_a_device_string_has_one_rule_for_train_py_and_the_other_commands(value):
    """What train.device's check refuses as no device, runtime.device.resolve_device (sample, chat, serve, eval,
    bench) refuses too (cpu:1 was taken as cpu). Whether a device is there is another question: cuda on a CPU
    machine, or an index past the GPUs, is refused by both later."""
    from runtime.device import resolve_device
    from training.config.sections import _device
    try:
        resolve_device(value, option="--device")
        spelled = True
    except UserError as e:
        spelled = "unknown" not in str(e)
    if _device(value) is not None:
        assert not spelled, value
