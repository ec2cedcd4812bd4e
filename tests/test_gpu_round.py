"""benchmarks/gpu_round.sh, the GPU round, checked on the CPU: every command it runs parses as its program
parses it, before a GPU session spends its few device minutes on a step that dies of a renamed option.

A session is lent 15 device minutes at most, and the round's steps are where they go: a step that
fails in its first second (an option spelled as it was two refactors ago, a config key gone, a module
moved) wastes its slot and a call. Each step's command goes through its program's own parser here,
in-process: train.py's config (load_config, every --section.key checked), bench.py's options
(benchmarks/cli.py's parse_args with its bounds), sample.py's, the two GPU benchmark scripts' (and
the config overrides they pass on), and the Python the round runs with -c (compiled, each name it
imports looked up). nanoGPT's own steps are checked against nanoGPT's train.py as its configurator
reads it: the config file is there and each --key=value names one of its globals. And the round's picture
(benchmarks/gpu_curves.py) is drawn from synthetic stamped logs of the steps a round may have left.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, strategies as st

from benchmarks import auto_batch, cli as bench_cli, gpu_curves, gpu_step_profile
from cli_lines import an_error_line, cli
from code_reading import NANOGPT, PACKAGES, ROOT
from errors import UserError
from inference import sample_cli
from runtime.attention import fastest_kernel
from data.sources import open_source
from training.config.sections import load_config

ROUND = ROOT / "benchmarks" / "gpu_round.sh"


def steps(text: str) -> dict[str, list[str]]:
    """The round's `step NAME CAP_S COMMAND...` lines (continuations joined) -> NAME: the command's words, with
    the script's variables put in: $PY is python, $L and $OUT a logs folder, $A the anchors."""
    lines = re.sub(r"\\\n\s*", " ", text).splitlines()
    found = {}
    for i, line in enumerate(lines):
        m = re.match(r"step (\w+) (\d+) (.*)$", line.strip())
        if not m:
            continue
        command = m.group(3).replace("$PY", "python").replace('"$L/', '"/tmp/gpu_round/logs/')
        command = command.replace("$A", str(ROOT / ".anchors"))
        for more in lines[i + 1:] + [None]:  # a quoted argument over several lines (python -c "...")
            try:
                found[m.group(1)] = shlex.split(command)
                break
            except ValueError:
                assert more is not None, f"step {m.group(1)}: a quote never closed"
                command += "\n" + more
    return found


def commands(words: list[str]) -> list[list[str]]:
    """One step's programs: a `bash -c "a && b"` is each of a and b (a `cd` dropped); else the words as they are."""
    if words[:2] != ["bash", "-c"]:
        return [words]
    return [shlex.split(part) for part in words[2].split("&&") if not part.strip().startswith("cd ")]


def nanogpt_configure(args: list[str]) -> dict:
    """nanoGPT's train.py's settings after its configurator reads `args`, as its run does: its top-level
    assignments before `exec(open('configurator.py').read())`, then configurator.py itself, run on those globals
    with sys.argv set (it asserts the types, refuses unknown keys and splits each --key=value at its '='). The
    imports above them are not run (nanoGPT's model.py would shadow this project's model package)."""
    tree = ast.parse((NANOGPT / "train.py").read_text(encoding="utf-8"))
    cut = next(n.lineno for n in tree.body if "configurator.py" in ast.unparse(n))
    settings = ast.Module([n for n in tree.body if n.lineno < cut and isinstance(n, ast.Assign)], type_ignores=[])
    g = {"torch": torch}
    exec(compile(settings, "nanoGPT's train.py", "exec"), g)
    configurator = (NANOGPT / "configurator.py").read_text(encoding="utf-8")
    argv, cwd = sys.argv, os.getcwd()
    try:
        sys.argv = ["train.py", *args]
        os.chdir(NANOGPT)  # its config files are named from its folder
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(configurator, "configurator.py", "exec"), g)
    finally:
        sys.argv = argv
        os.chdir(cwd)
    return g


def is_nanogpt(words: list[str]) -> bool:
    """nanoGPT's own train.py is run with one of its config files."""
    return any(w.startswith("config/train_") for w in words)


def check(words: list[str], json_dir: Path) -> None:
    """Raises (UserError, argparse's SystemExit, AssertionError) where the command would not start."""
    words = [w.replace("/tmp/gpu_round/logs", str(json_dir)) for w in words]
    if words[0] == "env":  # env NAME=VALUE ... python ...: each name one that torch reads (a typo would set nothing)
        while "=" in words[1]:
            name = words.pop(1).split("=")[0]
            assert name in torch_environment_names(), f"{name} is not an environment variable torch reads"
        words = words[1:]
    assert words[0] == "python", words
    if words[1:3] == ["-m", "cProfile"]:  # python -m cProfile -o FILE script args...
        words = ["python", *words[5:]]
    program, args = words[1], words[2:]
    if program == "train.py" and is_nanogpt(words):  # from its folder, its configurator's rules, then its data
        settings = nanogpt_configure(args)
        assert (NANOGPT / "data" / settings["dataset"] / "train.bin").is_file(), settings["dataset"]
    elif program == "train.py":  # its config, then its data source found (the run's first seconds)
        cfg = load_config(args)
        if not cfg.data.dataset.startswith("hf:"):  # a hub dataset is the network's: not here
            open_source(cfg.data)
    elif program == "bench.py":
        bench_cli.parse_args(args)
    elif program == "sample.py":
        sample_cli.validate_args(sample_cli.build_parser().parse_args(args))
    elif program == "-m" and args[0] == "benchmarks.gpu_step_profile":
        gpu_step_profile.checked(args[1:])  # the checks its main makes before the first profile
    elif program == "-m" and args[0] == "benchmarks.auto_batch":
        auto_batch.checked(args[1:])  # the checks its main makes before the GPU is touched
    elif program == "-c":
        check_python(args[0])
    else:
        raise AssertionError(f"the round runs {program}, which this test does not know: add its parser here")


@functools.cache
def torch_environment_names() -> set[str]:
    """The variables torch's Inductor reads at import (`os.environ.get("NAME")` in torch/_inductor/config.py)."""
    import torch._inductor.config as inductor_config

    source = Path(inductor_config.__file__).read_text(encoding="utf-8")
    return set(re.findall(r"""environ\.get\(\s*["']([A-Z0-9_]+)["']""", source))


def check_python(code: str) -> None:
    """python -c CODE: it compiles, each project name it imports is there, and fastest_kernel's call binds."""
    compile(code, "<gpu_round -c>", "exec")
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in PACKAGES:
            module = importlib.import_module(node.module)
            missing = [a.name for a in node.names if not hasattr(module, a.name)]
            assert not missing, f"{node.module} has no {missing}"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "fastest_kernel":
            inspect.signature(fastest_kernel).bind(*node.args, **{k.arg: k.value for k in node.keywords})


def side_by_side(text: str) -> dict[str, list[str]]:
    """../shared/anchors/gpu_side_by_side.sh, the device tool's own round, runs this project's commands too:
    each `$PY ...` line up to its redirection, named by its place."""
    found = {}
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        m = re.search(r"\$PY (.*?)(?: [0-9]?>.*)?$", line)
        if m and not m.group(1).startswith("-c"):
            command = "python " + m.group(1).replace('"$OUT/', '"/tmp/gpu_round/logs/')
            found[f"command {len(found) + 1}"] = shlex.split(command.rstrip(")"))
    return found


ROUND_STEPS = steps(ROUND.read_text(encoding="utf-8"))
SIDE_BY_SIDE = NANOGPT.parent / "gpu_side_by_side.sh"
SIDE_STEPS = side_by_side(SIDE_BY_SIDE.read_text(encoding="utf-8")) if SIDE_BY_SIDE.is_file() else {}


def test_the_round_is_read_whole():
    """The reader itself: it finds every step of the round, continuations joined (or the tests below pass on
    fewer), each name once (a name twice would also overwrite its log)."""
    text = ROUND.read_text(encoding="utf-8")
    named = re.findall(r"^\s*step\s+(\S+)\s", text, re.M)
    assert len(named) == len(set(named)) == len(ROUND_STEPS), (named, sorted(ROUND_STEPS))
    assert {"decode", "sdpa", "nanogpt_124m", "ours_124m", "ours_char_graph", "startup", "small_profile", "loss",
            "auto_16gb", "float8"} <= set(ROUND_STEPS), sorted(ROUND_STEPS)
    assert ROUND_STEPS["ours_124m"][-1] == "--train.out_dir=/tmp/gr_124m"  # after two continuation lines


@pytest.mark.parametrize("name", sorted(ROUND_STEPS))
def test_each_step_of_the_gpu_round_parses_as_its_program_parses_it(name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the round runs from the project's root
    for words in commands(ROUND_STEPS[name]):
        if is_nanogpt(words) and not NANOGPT.is_dir():
            pytest.skip(f"nanoGPT's anchors are not beside the checkout ({NANOGPT}): CI has them in ../shared")
        check(words, tmp_path)


@pytest.mark.skipif(not SIDE_BY_SIDE.is_file(), reason=f"the anchors are not beside the checkout ({SIDE_BY_SIDE})")
@pytest.mark.parametrize("name", sorted(SIDE_STEPS) or ["none found"])
def test_each_command_of_the_side_by_side_round_parses(name, tmp_path, monkeypatch):
    """The anchors' own round (train.py small.yaml and gpt2_124m, sample.py, bench.py decode, nanoGPT's two runs)."""
    monkeypatch.chdir(ROOT)
    check(SIDE_STEPS[name], tmp_path)


def test_the_side_by_side_round_is_read_whole():
    if not SIDE_BY_SIDE.is_file():
        pytest.skip(f"the anchors are not beside the checkout ({SIDE_BY_SIDE}): CI has them in ../shared")
    runs = [ln for ln in SIDE_BY_SIDE.read_text(encoding="utf-8").splitlines() if "$PY " in ln and "$PY -c" not in ln]
    assert len(SIDE_STEPS) == len(runs), (sorted(SIDE_STEPS), runs)
    programs = sorted({words[1] for words in SIDE_STEPS.values()})
    assert programs == ["bench.py", "sample.py", "train.py"], programs
    assert sum(is_nanogpt(words) for words in SIDE_STEPS.values()) == 2


@pytest.mark.parametrize("line, refused", [
    ("step x 10 $PY train.py --config small.yaml --train.no_such_key=1", UserError),
    ("step x 10 $PY bench.py --device cuda --only no_such_section", UserError),  # the project's ArgumentParser
    ("step x 10 $PY bench.py --device cuda --only loss --loss-steps 0", UserError),
    ("step x 10 $PY -m benchmarks.gpu_step_profile --config shakespeare_char_gpu --set train.no_such=1", UserError),
    ("step x 10 $PY -m benchmarks.gpu_step_profile --modes eager,no_such_mode", UserError),
    ("step x 10 $PY -m benchmarks.auto_batch --memory-gigabytes 16", SystemExit),
    ("step x 10 $PY -m benchmarks.auto_batch --memory-gb 16 --global-batch 100000000", UserError),
    ("step x 10 $PY train.py --config small.yaml --data.dataset=shakespear", UserError),
    ("step x 10 $PY sample.py --checkpoint /tmp/x --max-new-tokens=-1", UserError),
    ("step x 10 env TORCHINDUCTOR_COORDINATE_DESCENT_TUNNING=1 $PY train.py --config small.yaml", AssertionError),
    ("step x 10 env TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1 $PY train.py --config small.yaml --train.no_such=1", UserError),
    ("step x 10 $PY -c \"from runtime.attention import no_such_function\"", AssertionError),
    ("step x 10 $PY -c \"from runtime.attention import fastest_kernel; fastest_kernel(1, no_such=2)\"", TypeError),
    ("step x 10 bash -c \"cd $A/nanogpt && $PY train.py config/train_gpt2.py --no_such_key=1\"", ValueError),
    ("step x 10 bash -c \"cd $A/nanogpt && $PY train.py config/train_gpt2.py --iter_num=1\"", ValueError),  # set later
    ("step x 10 bash -c \"cd $A/nanogpt && $PY train.py config/train_gpt2.py --bias=true\"", AssertionError),  # a str
    ("step x 10 bash -c \"cd $A/nanogpt && $PY train.py config/train_gpt2.py --max_iters=2500.0\"", AssertionError),
    ("step x 10 bash -c \"cd $A/nanogpt && $PY train.py config/train_gpt2.py --compile\"", AssertionError),
    ("step x 10 bash -c \"cd $A/nanogpt && $PY train.py config/train_gpt2.py --out_dir=a=b\"", ValueError),
    ("step x 10 bash -c \"cd $A/nanogpt && $PY train.py config/train_gpt2.py --dataset=shakespeare_chars\"",
     AssertionError),  # no such prepared data
])
def test_a_step_that_would_not_start_is_found(line, refused, tmp_path, monkeypatch, capsys):
    """The check must be able to fail: a misspelled option, a gone key or a moved function, each refused."""
    if "nanogpt" in line and not NANOGPT.is_dir():
        pytest.skip(f"nanoGPT's anchors are not beside the checkout ({NANOGPT}): CI has them in ../shared")
    monkeypatch.chdir(ROOT)
    with pytest.raises(refused):
        for words in commands(steps(line)["x"]):
            check(words, tmp_path)


# ------------------------------------------------------------------ the round's picture: benchmarks/gpu_curves.py

def stamped(lines: list[tuple[float, str]]) -> str:
    """A log as gpu_round.sh's `stamp` writes it: each line behind the seconds since the command started."""
    return "".join(f"{s:8.2f} {text}\n" for s, text in lines)


def test_the_curves_draw_the_logs_a_round_left_and_say_when_each_reached_the_target(tmp_path, capsys):
    """The first prepared call runs nanogpt_char and ours_char_graph, not ours_char: the picture drew only
    ours_char.log and nanogpt_char.log, so after that call it was a traceback (no such file). Now each log
    present is drawn. The reference: the seconds and steps written into the synthetic logs."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "nanogpt_char.log").write_text(stamped([
        (0.5, "tokens per iteration will be: 16,384"), (20.0, "step 250: train loss 1.9000, val loss 1.9500"),
        (81.7, "step 2250: train loss 1.3000, val loss 1.4690"), (90.0, "step 2500: train loss 1.2000, val loss 1.4720")]))
    (logs / "ours_char_graph.log").write_text(stamped([
        (3.0, "run plan (decided once, saved in the checkpoint):"), (15.5, "iter 250: train loss 1.8000, val loss 1.9000"),
        (38.25, "iter 1000: train loss 1.4000, val loss 1.4650"), (44.0, "iter 1250: train loss 1.3000, val loss 1.4400")]))
    (logs / "ours_bpe.log").write_text(stamped([(30.0, "iter 250: train loss 5.0000, val loss 5.1000")]))
    code, out, err = cli([str(logs), str(tmp_path / "curves.png")], capsys, main=gpu_curves.main)
    assert code == 0, err
    assert out.splitlines() == [
        "nanoGPT: train_shakespeare_char.py: best 1.4690 at step 2250, 81.7 s; val 1.4690 <= 1.47 at step 2250, 81.7 s",
        "ours: shakespeare_char_gpu.yaml, CUDA graph, no compile: best 1.4400 at step 1250, 44.0 s; val 1.4650 <= 1.47 "
        "at step 1000, 38.2 s",
        "ours: shakespeare_gpu.yaml (GPT-2 BPE), CUDA graph: best 5.1000 at step 250, 30.0 s"]
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png", "logs"]  # no temp left


def test_the_curves_leave_out_a_log_cut_before_its_first_eval_and_keep_a_bars_frames_apart(tmp_path, capsys):
    """A step cut before its first eval (likely for a run never tried on a GPU) is left out with a note, the
    others drawn; an eval line written after a progress bar's \r frames within one stamped line is still read;
    an .svg is written as SVG; the title names the card of summary.txt."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "summary.txt").write_text("######## 2026-11-27T03:39:12Z NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04\n")
    (logs / "ours_char_graph.log").write_text(stamped([(2.0, "capturing the step...")]))
    (logs / "ours_char.log").write_text(stamped([(9.5, "train:  10%|#   | 100/1000\riter 100: train loss 2.0000, val "
                                                       "loss 2.1000"), (30.0, "iter 900: train loss 1.3000, val loss 1.4600")]))
    code, out, err = cli([str(logs), str(tmp_path / "curves.svg")], capsys, main=gpu_curves.main)
    assert code == 0, err
    assert out.splitlines() == ["ours: shakespeare_char_gpu.yaml (compiled): best 1.4600 at step 900, 30.0 s; val "
                                "1.4600 <= 1.47 at step 900, 30.0 s"]
    assert "ours_char_graph.log holds no val loss line" in err and "left out" in err
    svg = (tmp_path / "curves.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "NVIDIA H100 80GB HBM3" in svg


def test_the_curves_of_several_folders_draw_each_run_from_the_last_that_holds_it(tmp_path, capsys):
    """A round of several calls or sessions (2026-11-28: nanoGPT's char run in one folder, the char config's new
    schedule and the BPE runs in another): one picture, each run's log from the last folder that holds it, the
    folder named in its label; two cards are both named. The reference: the synthetic logs' own numbers."""
    first, second = tmp_path / "h100-a", tmp_path / "h100-b"
    for folder, card in ((first, "NVIDIA H100 80GB HBM3"), (second, "NVIDIA H200")):
        folder.mkdir()
        (folder / "summary.txt").write_text(f"######## 2026-11-28T02:23:14Z {card}, 81559 MiB, 580.159.04\n")
    (first / "nanogpt_char.log").write_text(stamped([(81.7, "step 2250: train loss 1.3000, val loss 1.4690")]))
    (first / "ours_char_graph.log").write_text(stamped([(33.5, "iter 750: train loss 1.1000, val loss 1.4680")]))
    (second / "ours_char_graph.log").write_text(stamped([(24.1, "iter 625: train loss 1.1600, val loss 1.4673")]))
    (second / "nanogpt_bpe.log").write_text(stamped([(45.5, "step 300: train loss 3.5800, val loss 4.8837")]))
    code, out, err = cli([str(first), str(second), str(tmp_path / "curves.svg")], capsys, main=gpu_curves.main)
    assert code == 0, err
    assert out.splitlines() == [
        "nanoGPT: train_shakespeare_char.py (h100-a): best 1.4690 at step 2250, 81.7 s; val 1.4690 <= 1.47 at step "
        "2250, 81.7 s",
        "ours: shakespeare_char_gpu.yaml, CUDA graph, no compile (h100-b): best 1.4673 at step 625, 24.1 s; val 1.4673 "
        "<= 1.47 at step 625, 24.1 s",
        "nanoGPT: its baby-GPT recipe on GPT-2 BPE (h100-b): best 4.8837 at step 300, 45.5 s"]
    svg = (tmp_path / "curves.svg").read_text()
    assert "NVIDIA H100 80GB HBM3 / NVIDIA H200" in svg
    code, _, err = cli([str(first), str(tmp_path / "nowhere"), str(tmp_path / "c.png")], capsys, main=gpu_curves.main)
    an_error_line(code, err, "nowhere is not a folder")


@pytest.mark.parametrize("logs, words", [
    ("missing", ["is not a folder"]),
    ("empty", ["holds none of the round's training logs"]),
    ("cut", ["holds none of the round's training logs with a val loss line"]),
    ("out is a folder", ["is a folder; name the picture's file"]),
])
def test_the_curves_of_a_folder_without_them_are_one_line(logs, words, tmp_path, capsys):
    folder = tmp_path / "logs"
    if logs != "missing":
        folder.mkdir()
    if logs in ("cut", "out is a folder"):
        (folder / "ours_char.log").write_text(stamped([(2.0, "compiling the model...")] if logs == "cut" else
                                                      [(9.0, "iter 100: train loss 2.0000, val loss 2.1000")]))
    out = tmp_path / ("pictures" if logs == "out is a folder" else "curves.png")
    if logs == "out is a folder":
        out.mkdir()
    code, _, err = cli([str(folder), str(out)], capsys, main=gpu_curves.main)
    an_error_line(code, err, *words)
    assert not (tmp_path / "curves.png").exists() and not list(tmp_path.rglob("*.png"))


def _round(only: str, out: Path):
    env = {**os.environ, "ONLY": only, "OUT": str(out), "PY": "true", "PATH": os.environ["PATH"]}
    return subprocess.run(["bash", str(ROUND), "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@given(name=st.one_of(st.from_regex(r"[a-z0-9_]{1,12}", fullmatch=True),
                      st.sampled_from(sorted(ROUND_STEPS)).map(lambda s: s + "x"),
                      st.sampled_from(sorted(ROUND_STEPS)).map(lambda s: s[:-1])))
def test_an_only_name_that_is_no_step_is_one_line_before_anything_is_written(name, tmp_path_factory):
    """Before: ONLY="ours_124m ours_bpee" ran ours_124m and said nothing of the other (a device call spent on
    a typo). Each name ONLY gives that is not one of the round's `step NAME` lines (as this file reads them) is
    refused in one line naming it, and no logs folder is made."""
    if name in ROUND_STEPS:
        return
    out = tmp_path_factory.mktemp("round") / "out"
    r = _round(f"{sorted(ROUND_STEPS)[0]} {name}", out)
    line = an_error_line(r.returncode, r.stderr, f"ONLY names '{name}'", "no step")
    assert r.stderr.count("\n") == 1 and all(s in line for s in ROUND_STEPS), line
    assert not out.exists()


def test_each_step_name_is_taken_by_only(tmp_path):
    """The other side: every step's name passes the check (with a 1 s budget each is then skipped, said in the
    summary, and nothing runs)."""
    r = _round(" ".join(sorted(ROUND_STEPS)), tmp_path / "out")
    assert r.returncode == 0 and "error:" not in r.stderr, r.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert sorted(re.findall(r"== (\w+): skipped", summary)) == sorted(ROUND_STEPS), summary
