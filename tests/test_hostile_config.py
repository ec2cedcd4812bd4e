"""The training config given hostile values and hostile YAML.

1. Every numeric key of every config section (enumerated from the dataclasses, not listed here), given
   any value (zero, negative, subnormal, tiny, huge, inf, nan; ints past 64 bits), on the command line
   and in a YAML file: load_config refuses it in one line naming the key, or the start-up arithmetic
   that follows stays finite: the memory check with a small and a huge vocabulary, the lr schedule at
   the run's first, middle and last steps, the time budget's plan. Bounds written here as plain numbers.
2. YAML documents of every shape yaml.safe_load takes (non-string keys, sequences and mappings as keys,
   explicit tags, deep flows, duplicate keys, anchors and aliases, a billion-laughs bomb, empty and
   multiple documents, top-level scalars): `--config` with each works or is one UserError line naming
   the file or the key, within a few seconds.
3. The defects these found, and the small ones reported beside them, each with its own test.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import time
import typing
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from errors import UserError
from training.timing import budget
from training.builders import check_memory
from training.config.sections import Config, load_config
from training.report.metrics import MetricsLog
from training.timing.schedule import lr_at

from hostile_values import SPECIAL_FLOATS, SPECIAL_INTS
from cli_lines import an_error_line
import warm_runs

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("model", "data", "train", "eval", "wandb")
WORDS = (*[f"{s}." for s in SECTIONS], "n_layer", "n_embd", "vocab_size", "n_head")  # a message names a key


def numeric_keys() -> list[tuple[str, str, type]]:
    """(section, key, int or float) for every int, float and `int | str` field of every config section."""
    out = []
    for s in dataclasses.fields(Config):
        hints = typing.get_type_hints(type(getattr(Config(), s.name)))
        for f in dataclasses.fields(getattr(Config(), s.name)):
            t = hints[f.name]
            if t in (int, float) or set(typing.get_args(t)) == {int, str}:
                out.append((s.name, f.name, float if t is float else int))
    return out


KEYS = numeric_keys()
MORE_INTS = [2**62, 10**30, 10**400]  # past 2**63, and past what a float holds


def value_texts(kind: type):
    ints = st.one_of(st.sampled_from(SPECIAL_INTS + MORE_INTS), st.integers()).map(str)
    floats = st.one_of(st.sampled_from(SPECIAL_FLOATS), st.floats()).map(repr)
    return floats | ints if kind is float else ints | st.sampled_from(["1e30", "nan", "5e-324", "2.5"])


class Hang(BaseException):
    pass


def bounded(fn, seconds: int = 10):
    """fn() under an alarm: a case that runs past `seconds` fails the test, it does not hang it."""
    def alarm(signum, frame):
        raise Hang(f"ran past {seconds} s")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def an_error_line(e: UserError, *names: str) -> str:
    msg = str(e)
    assert "\n" not in msg and msg.strip(), msg
    assert any(n in msg for n in names), (names, msg)
    return msg


def yaml_value(text: str) -> str:
    """The value as YAML reads a number (nan, inf as .nan, .inf; others as written)."""
    return {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}.get(text, text)


def start_up_is_finite(cfg: Config) -> None:
    """The set-up arithmetic before anything big is allocated: one-line refusals or finite numbers."""
    for vocab in (65, 2**40):
        try:
            check_memory(cfg, vocab, None, torch.device("cpu"))
        except UserError as e:
            an_error_line(e, "train.", "model.", "vocab", "n_layer", "n_embd", "memory")
    t = cfg.train
    for step in {0, 1, t.warmup_iters, t.max_iters // 2, t.max_iters - 1, t.max_iters}:
        lr = lr_at(step, lr=t.lr, min_lr=t.min_lr, warmup_iters=t.warmup_iters, max_iters=t.max_iters)
        assert math.isfinite(lr) and 0 <= lr <= t.lr, (step, lr)
    timing = budget.Timing(setup_s=1.0, step_s=1e-3, eval_s=0.5, checkpoint_s=0.1)
    try:
        n, warmup = budget.plan(600.0, timing, max_iters=t.max_iters, warmup_iters=t.warmup_iters,
                                eval_interval=t.eval_interval, sample_interval=cfg.eval.sample_interval,
                                inspect_interval=cfg.eval.inspect_interval)
        assert 1 <= n <= min(t.max_iters, 600_000) and 0 <= warmup <= n, (n, warmup)
    except UserError as e:
        an_error_line(e, "train.time_budget")
    # the tokens of one optimizer step: at most 2**30 (Config.validate's bound, written out here)
    if t.batch_size != "auto":
        assert t.batch_size * t.grad_accum_steps * cfg.model.block_size <= 2**30


def load(section: str, key: str, text: str, how: str, tmp: Path) -> Config:
    if how == "cli":
        return load_config([f"--{section}.{key}={text}"])
    path = tmp / "cfg.yaml"
    path.write_text(f"{section}:\n  {key}: {yaml_value(text)}\n")
    return load_config(["--config", str(path)])


def check_key(section: str, key: str, text: str, how: str, tmp: Path) -> None:
    try:
        cfg = bounded(lambda: load(section, key, text, how, tmp))
    except UserError as e:
        an_error_line(e, f"{section}.{key}", key, *(("model.",) if section == "model" else ()))
        return
    start_up_is_finite(cfg)


@pytest.mark.parametrize("how", ["cli", "yaml"])
@settings(max_examples=settings().max_examples * 10)
@given(data=st.data())
def test_every_numeric_key_is_refused_in_one_line_or_starts_finite(tmp_path, how, data):
    section, key, kind = data.draw(st.sampled_from(KEYS), label="key")
    text = data.draw(value_texts(kind), label="value")
    check_key(section, key, text, how, tmp_path)


def test_every_numeric_key_takes_every_special_value(tmp_path):
    """The sweep hypothesis may not draw in CI: each key x each special value x CLI and YAML."""
    assert len(KEYS) >= 30 and ("train", "lr", float) in KEYS and ("data", "shard_tokens", int) in KEYS
    for section, key, kind in KEYS:
        texts = [repr(v) for v in SPECIAL_FLOATS] if kind is float else []
        texts += [str(v) for v in SPECIAL_INTS + MORE_INTS]
        for text in texts:
            for how in ("cli", "yaml"):
                check_key(section, key, text, how, tmp_path)


@pytest.mark.parametrize("argv, words", [
    (["--train.lr=1e308"], "train.lr must be at most 1e+30"),  # lr * (step + 1) / warmup was inf
    (["--train.muon_lr=1e31"], "train.muon_lr must be at most 1e+30"),
    ([f"--train.max_iters={10**400}"], "train.max_iters must be at most 1,000,000,000, got a 401-digit number"),  # lr_at:
    ([f"--train.warmup_iters={2**63}"], "train.warmup_iters must be at most 1,000,000,000"),  # OverflowError
    ([f"--eval.sample_interval={10**30}"], "eval.sample_interval must be at most 1,000,000,000"),
    ([f"--train.time_budget={'9' * 400}h"], "at most 1e+09 s"),  # inf s: OverflowError in plan
    ([f"--train.collective_timeout={'9' * 400}"], "at most 1e+09 s"),  # timedelta
    (["--train.collective_timeout=99999999999"], "at most 1e+09 s"),
    (["--data.num_proc=1000000000000000000000000000000"], "data.num_proc must be a whole number from 0 to 1024"),
    (["--model.logit_softcap=5e-324"], "model.logit_softcap must be 0 (off) or from 1e-6 to 1e6"),  # 0 in float32:
    (["--model.logit_softcap=1e308"], "model.logit_softcap must be 0 (off) or from 1e-6 to 1e6"),  # nan at step 0
])
def test_values_that_overflowed_the_start_up_are_refused(argv, words):
    with pytest.raises(UserError) as e:
        load_config(argv)
    assert words in an_error_line(e.value, words)


def test_the_largest_accepted_values_keep_the_schedule_finite():
    """lr at its bound and the step counts at theirs (10**9, settings.MAX_ITERS): the schedule's peak is lr,
    finite, and lr_at stays finite for any step a 64-bit counter holds."""
    cfg = load_config(["--train.lr=1e30", f"--train.max_iters={10**9}", f"--train.warmup_iters={10**9 - 1}"])
    t = cfg.train
    assert lr_at(10**9 - 2, lr=t.lr, min_lr=t.min_lr, warmup_iters=t.warmup_iters, max_iters=t.max_iters) == 1e30
    assert lr_at(10**9 - 1, lr=t.lr, min_lr=t.min_lr, warmup_iters=t.warmup_iters, max_iters=t.max_iters) == 1e30
    with pytest.raises(UserError, match="at most 1,000,000,000"):
        load_config([f"--train.max_iters={10**9 + 1}"])


def test_a_run_at_lr_1e30_stops_at_the_non_finite_guard(tmp_path, data_root):
    """End to end, the most extreme lr accepted: the weights blow up, and the run stops with the guard's
    one line (status 2), not a traceback and not a run of nan."""
    from hostile_world import train_argv

    argv = train_argv(tmp_path / "out", data_root, "--train.lr=1e30", "--train.max_iters=4", "--train.warmup_iters=0",
                      "--train.grad_clip=0")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = warm_runs.run([ROOT / "train.py", *argv], env=env, cwd=tmp_path)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "non-finite" in errors[0], errors[0]


def test_a_run_with_the_other_extreme_accepted_values_trains_finite(tmp_path, data_root):
    """End to end, the extremes that are accepted and train: a subnormal lr and grad clip, eps and the
    rope base at 1e308, the soft-cap at its bound. It ends (status 0) with finite logged losses."""
    from hostile_world import train_argv

    argv = train_argv(tmp_path / "out", data_root, "--train.lr=5e-324", "--train.min_lr=0", "--train.grad_clip=5e-324",
                      "--model.layer_norm_eps=1e308", "--model.pos_embedding=rope", "--model.rope_base=1e308",
                      "--model.logit_softcap=1e6", "--train.weight_decay=0", "--train.max_iters=3")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = warm_runs.run([ROOT / "train.py", *argv], env=env, cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    losses = [rec[k] for rec in map(json.loads, (tmp_path / "out" / "metrics.jsonl").read_text().splitlines())
              for k in rec if k.endswith("loss")]
    assert losses and all(isinstance(v, float) and math.isfinite(v) for v in losses), losses


# ------------------------------------------------------------------------------------------ YAML shapes

SCALARS = ["1", "-1", "0", "1.5", ".inf", "-.inf", ".nan", "null", "~", "true", "no", "''", '"x"', "abc", "1e3",
           "0x1f", "0o17", "0b101", "1_000", "190:20:30", "2001-12-14", "!!str 1", "!!int 3", "!!int abc",
           "!!float 1.5", "!!float abc", "!!binary aGVsbG8=", "!!binary '%%'", "!!timestamp 2001-12-14",
           "!!timestamp 2001-13-45", "!!bool yes", "!!null ''", '"\\ud800"', "1" * 5000, "0x" + "f" * 5000,
           "!!python/object:os.system ls", "!foo bar", "&a 1", "*a", "'" + "k" * 2000 + "'"]
KEY_NAMES = ["model", "data", "train", "eval", "wandb", "lr", "max_iters", "out_dir", "sample_prompts", "run_name",
             "block_size", "val_fraction", "1", "1.5", "null", "true", ".nan", "[a, b]", "{a: 1}", "!!set {a}",
             "!!binary aGVsbG8="]


def flow(children) -> st.SearchStrategy[str]:
    seq = st.lists(children, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]")
    mapping = st.lists(st.tuples(st.sampled_from(KEY_NAMES), children), max_size=4).map(
        lambda kv: "{" + ", ".join(f"? {k} : {v}" for k, v in kv) + "}")
    tagged = st.sampled_from(["!!set {a, b}", "!!omap [a: 1, b: 2]", "!!pairs [a: 1]", "!!seq [1]", "!!map {a: 1}"])
    return seq | mapping | tagged


VALUES = st.recursive(st.sampled_from(SCALARS), flow, max_leaves=12)


@st.composite
def documents(draw) -> str:
    """A YAML document as text: a block mapping of sections of settings (keys and values of any shape),
    or one of the shapes around it."""
    shape = draw(st.sampled_from(["sections", "sections", "sections", "top", "deep", "bomb", "multi", "empty"]))
    if shape == "top":
        return draw(VALUES) + "\n"
    if shape == "deep":
        n = draw(st.sampled_from([33, 1000, 100_000]))
        return draw(st.sampled_from(["[" * n + "]" * n, "{a: " * n + "1" + "}" * n, "- " * min(n, 3000) + "1"]))
    if shape == "bomb":
        levels = draw(st.integers(2, 9))
        lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
        return "\n".join(lines) + "\n"
    if shape == "empty":
        return draw(st.sampled_from(["", "\n", "# only a comment\n", "---\n", "...\n", "--- !!map {}\n", "---\n..."]))
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        lines.append(f"{draw(st.sampled_from(KEY_NAMES))}:")
        for _ in range(draw(st.integers(0, 3))):
            lines.append(f"  ? {draw(st.sampled_from(KEY_NAMES))}\n  : {draw(VALUES)}")
    text = "\n".join(lines) + "\n"
    return text + "---\n" + text if shape == "multi" else text


def check_yaml(text: str, path: Path) -> None:
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    started = time.monotonic()
    try:
        bounded(lambda: load_config(["--config", str(path)]), seconds=5)
    except UserError as e:
        an_error_line(e, str(path), *WORDS)
    assert time.monotonic() - started < 5


@given(text=documents())
@settings(max_examples=settings().max_examples * 10)
@example(text="? [a, b]\n: 1\n")
@example(text="train:\n  lr: !!float abc\n")
def test_every_yaml_shape_loads_or_is_one_line_naming_the_file(tmp_path, text):
    check_yaml(text, tmp_path / "cfg.yaml")



def yaml11_other_base() -> st.SearchStrategy[tuple[str, int | float]]:
    """A number as YAML 1.1 (PyYAML) reads it in base 60 (`1:20`, `-2:05:30.5`) or octal (`012`), with its value
    there, which is not the decimal reading a command line gives the same characters."""
    sexagesimal = st.tuples(st.sampled_from(["", "-", "+"]), st.integers(1, 99), st.lists(st.integers(0, 59), min_size=1,
                                                                                        max_size=3),
                            st.sampled_from(["", ".5"])).map(
        lambda t: (f"{t[0]}{t[1]}" + "".join(f":{d:02d}" for d in t[2]) + t[3],
                   (-1 if t[0] == "-" else 1) * (sum(d * 60 ** i for i, d in enumerate(reversed([t[1], *t[2]])))
                                                 + (0.5 if t[3] else 0))))
    octal = st.integers(8, 10**6).map(lambda v: ("0" + format(v, "o"), v))
    return st.one_of(sexagesimal, octal)


@given(key=st.sampled_from(KEYS), number=yaml11_other_base())
def test_a_number_yaml_reads_in_base_60_or_octal_is_one_line(tmp_path, key, number):
    """`time_budget: 1:20` was 80 s and `max_iters: 0100` 64 steps, without a word: YAML 1.1 reads those
    characters in base 60 and octal, a command line in decimal. Every numeric key, in a YAML config."""
    (section, name, _), (text, value) = key, number
    path = tmp_path / "cfg.yaml"
    path.write_text(f"{section}:\n  {name}: {text}\n")
    with pytest.raises(UserError) as e:
        load_config(["--config", str(path)])
    line = an_error_line(e.value, str(path), "line 2", "base 60" if ":" in text else "octal", "quote it")
    assert repr(value) in line or str(value) in line  # the number YAML would have read, said



@pytest.mark.parametrize("text, value", [("07", 7), ("00", 0), ("0x10", 16), ("0b101", 5), ("1_000", 1000), ("-12", -12),
                                         ("!!float 012", 12.0), ("007.5", 7.5), ("1e3", "1e3"), ('"1:20"', "1:20")])
def test_numbers_yaml_reads_as_a_command_line_does_still_load(tmp_path, text, value):
    """The refusal above is no wider than its class: where YAML's reading is the decimal one (or the characters are
    text), the file reads as before."""
    from training.config.reading import read_yaml

    path = tmp_path / "cfg.yaml"
    path.write_text(f"train:\n  max_iters: {text}\n")
    got = read_yaml(path)["train"]["max_iters"]
    assert got == value and type(got) is type(value)


YAML_CASES = [
    ("? [a, b]\n: 1\n", "the key at line 1 is a list"),  # was TypeError: unhashable type: 'list'
    ("train:\n  ? {a: 1}\n  : 1\n", "the key at line 2 is a dict"),
    ("train:\n  ? !!set {a}\n  : 1\n", "the key at line 2 is a set"),
    ("train:\n  lr: !!float abc\n", "the value at line 2 is not a valid !!float"),  # was ValueError
    ("wandb:\n  run_name: !!timestamp 2001-13-45\n", "not a valid !!timestamp"),  # was ValueError: month...
    ("train:\n  max_iters: !!int abc\n", "not a valid !!int"),  # said "too many characters for an integer"
    ("train:\n  max_iters: 0x" + "f" * 5000 + "\n", "too many for an integer"),  # was ValueError printing it
    ("train:\n  lr: 0x" + "f" * 300 + "\n", "train.lr expects a finite float"),  # was OverflowError
    ("a: &a [x, x, x, x, x, x, x, x, x]\nb: [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n", "uses a YAML alias"),
    ("[" * 100_000 + "]" * 100_000, "nested more than"),
    # "\ud800" is valid YAML, and a string no encoder takes: a prompt with it was a traceback in the tokenizer
    ('eval:\n  sample_prompts: ["\\ud800x"]\n', "the string at line 2 holds a lone surrogate"),
    ('wandb:\n  run_name: "\\udcff"\n', "the string at line 2 holds a lone surrogate"),
]


@pytest.mark.parametrize("text, words", YAML_CASES, ids=[f"{i}-{w}" for i, (_, w) in enumerate(YAML_CASES)])
def test_yaml_that_raised_a_traceback_is_one_line(tmp_path, text, words):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        bounded(lambda: load_config(["--config", str(path)]), seconds=5)
    assert words in an_error_line(e.value, str(path), "train.")


def test_a_prompt_that_is_not_utf8_is_refused_before_the_run():
    """A command line's bytes that are not UTF-8 arrive as surrogate escapes ("\\udcff"): the prompt was
    accepted, and the first sampling round raised UnicodeEncodeError in the tokenizer."""
    with pytest.raises(UserError) as e:
        load_config(["--eval.sample_prompts=\udcffROMEO:"])
    assert "eval.sample_prompts prompt 1 is not valid UTF-8" in an_error_line(e.value, "eval.sample_prompts")


@pytest.mark.parametrize("kind", ["fifo", "null_device", "socket", "symlink_loop", "directory"])
def test_config_that_is_not_a_file_is_named_by_its_kind(tmp_path, kind):
    """--config given a FIFO, a device, a socket, a symlink loop: it said 'not found', though it is there."""
    from hostile_world import make_kind

    path = make_kind(kind, tmp_path / "cfg.yaml")
    expected = {"fifo": "a FIFO", "null_device": "a device", "socket": "a socket",
                "symlink_loop": "a symlink to nothing (or a loop)", "directory": "a directory"}[kind]
    with pytest.raises(UserError) as e:
        bounded(lambda: load_config(["--config", str(path)]), seconds=5)
    msg = an_error_line(e.value, str(path))
    assert f"is {expected}, not a YAML file" in msg and "not found" not in msg, msg


# ------------------------------------------------------------------------------------------ metrics.jsonl

def test_resume_drops_a_metrics_line_nested_too_deep(tmp_path, capsys):
    """A line of 100,000 nested lists: json.loads raised RecursionError (a traceback on resume); now it
    is one more damaged line, dropped with the note, and the good records stay."""
    good = {"iter": 1, "train/loss": 2.5}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(good) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    kept = list(MetricsLog(tmp_path).resume_at(5))
    assert kept == [good]
    assert "dropped 1 damaged line" in capsys.readouterr().out
    assert (tmp_path / "metrics.jsonl").read_text() == json.dumps(good) + "\n"


def test_resume_keeps_only_records_whose_iter_is_a_whole_number(tmp_path):
    """JSON's true is Python's True, an int: a record with "iter": true was kept as iteration 1 (and sent to
    wandb as step 1). Only an integer iter counts; the others are not records of a step."""
    lines = [{"iter": v, "x": 1.0} for v in (True, False, 2.0, "2", None, [2])] + [{"iter": 2, "x": 2.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert list(MetricsLog(tmp_path).resume_at(5)) == [{"iter": 2, "x": 2.0}]


def test_resume_refuses_a_metrics_file_past_the_bound_unread(tmp_path, monkeypatch):
    """The read is bounded: a file over the limit (here 1 KiB instead of 1 GiB) is one line, untouched."""
    import training.report.metrics as metrics

    monkeypatch.setattr(metrics, "MAX_METRICS_BYTES", 1024)
    path = tmp_path / "metrics.jsonl"
    path.write_text((json.dumps({"iter": 1, "x": 1.0}) + "\n") * 100)
    before = path.read_bytes()
    with pytest.raises(UserError) as e:
        MetricsLog(tmp_path).resume_at(5)
    an_error_line(e.value, str(path))
    assert path.read_bytes() == before


DURATION_KEYS = ("train.time_budget", "train.collective_timeout")
NUMBERS = st.one_of(st.sampled_from(["0", "0.0", "1e30", "0.0001", "-5", "nan", "inf", "9" * 400, "1.", ".5", "00"]),
                    st.floats(allow_nan=True).map(repr), st.integers(-10**12, 10**12).map(str))
UNITS = st.sampled_from(["", "s", "sec", "m", "min", "h", "d", "ms", " min", "S", "hours"])


@given(key=st.sampled_from(DURATION_KEYS), number=NUMBERS, unit=UNITS)
def test_each_duration_key_states_its_own_range_and_the_value_as_written(key, number, unit):
    """Before: train.collective_timeout=1e30s was told 'must be a duration like 90s, 8m or 1h (0 = off)' (0
    is refused there), and train.time_budget=0.0001s 'train.time_budget=0s leaves no time to train' (0s
    is 'off'). A duration is accepted within its key's range or refused with that range and the value as
    the user wrote it; a budget too small to train says the budget as written."""
    text = number + unit
    try:
        cfg = load_config([f"--{key}={text}"])
    except UserError as e:
        msg = an_error_line(e, key)
        assert repr(text)[:60] in msg, msg
        assert ("0 = off" in msg) == (key == "train.time_budget") and "at most 1e+09 s" in msg, msg
        return
    seconds = budget.parse_duration(getattr(cfg.train, key.split(".")[1]), key)
    assert 0 <= seconds <= 1e9 and (seconds > 0 or key == "train.time_budget"), (text, seconds)
    if key == "train.time_budget" and seconds:
        slow = budget.Timing(setup_s=2e9, step_s=1.0, eval_s=1.0, checkpoint_s=1.0)  # nothing fits
        with pytest.raises(UserError) as e:
            budget.plan(seconds, slow, max_iters=10, warmup_iters=1, eval_interval=5, as_written=text.strip())
        assert f"train.time_budget={text.strip()} leaves no time" in an_error_line(e.value, key)


@given(batch=st.integers(1, 2**40), accum=st.integers(1, 2**40), block=st.integers(1, 2**24),
       auto=st.booleans())
@example(batch=10**9, accum=1, block=64, auto=False)  # the case found: lower train.grad_accum_steps, it said
def test_too_many_tokens_per_step_names_the_factor_that_makes_them(batch, accum, block, auto):
    """The fix names the largest factor of the product, with every factor's value (found from outside: batch_size
    1e9 with grad_accum_steps 1 was told to lower train.grad_accum_steps)."""
    factors = ({"train.global_batch_size": batch} if auto else {"train.batch_size": batch, "train.grad_accum_steps": accum})
    factors["model.block_size"] = block
    argv = [f"--{k}={v}" for k, v in factors.items()] + (["--train.batch_size=auto"] if auto else [])
    tokens = batch * block * (1 if auto else accum)
    try:
        load_config(argv)
    except UserError as e:
        msg = an_error_line(e, "tokens per optimizer step")
        assert tokens > 2**30, (tokens, msg)
        named = msg.rsplit("; lower ", 1)[1]
        assert factors[named] == max(factors.values()), (factors, msg)
        assert all(f"{k} ({v:,})" in msg for k, v in factors.items()), msg
        return
    assert tokens <= 2**30, tokens
