"""sample.py never writes its samples over a file it reads, and closed or failing standard streams are
one line (sample.py) or no matter at all (train.py, whose console output is a courtesy: metrics.jsonl and
the checkpoints are the record).

Most cases run in-process (run_cli, the CLI's exit code and stderr without the start-up); a closed
stream is a property of the process, so those run the real scripts with bash's `>&-` / `<&-`."""
from __future__ import annotations

import errno
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from training import cli as train_cli
from checkpoint import load_checkpoint
from sample_runs import ENV, make_char_checkpoint, run
from tiny_runs import tiny_argv
from cli_lines import one_error_line
from training.report.metrics import Console, Progress, console_guard

ROOT = Path(__file__).resolve().parents[1]
SUB_ENV = {**ENV, "PYTHONPATH": str(ROOT)}
FAST = ["--max-new-tokens", "5", "--seed", "1", "--dtype", "float32"]


@pytest.fixture(scope="module")
def ckpt_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "ckpt.pt"
    make_char_checkpoint(path)
    return path


@pytest.fixture
def out_dir(tmp_path, ckpt_file) -> Path:
    """A training out_dir of our own (ckpt.pt and best.pt), free to damage."""
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(ckpt_file, d / "ckpt.pt")
    shutil.copy(ckpt_file, d / "best.pt")
    return d


def bash(script: str, *args, **kw) -> subprocess.CompletedProcess:
    """`script` under bash, with "$@" = args: where a test needs a stream closed (`>&-`, `<&-`)."""
    return subprocess.run(["bash", "-c", script, "bash", *map(str, args)], capture_output=True, text=True,
                          env=SUB_ENV, timeout=120, cwd=ROOT, **kw)


# ---------------------------------------------------------------------------------- --out is no input

@pytest.mark.parametrize("spec,out", [
    ("run/ckpt.pt", "run/ckpt.pt"),  # the checkpoint file itself
    ("run", "run/ckpt.pt"),  # the out_dir's latest checkpoint
    ("run", "run/best.pt"),  # the out_dir's other checkpoint
    ("run", "run/../run/./ckpt.pt"),  # another spelling of it
    ("run", "link.txt"),  # a symlink to it
])
def test_out_naming_a_checkpoint_file_is_refused_and_the_checkpoint_is_unchanged(out_dir, capsys, spec, out):
    tmp = out_dir.parent
    (tmp / "link.txt").symlink_to(out_dir / "ckpt.pt")
    before = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    code, stdout, err = run(["--checkpoint", tmp / spec, "--out", tmp / out, *FAST], capsys)
    one_error_line(code, err, f"--out {tmp / out}", "checkpoint file", "choose another --out")
    assert {p.name: p.read_bytes() for p in out_dir.iterdir()} == before
    assert (tmp / "link.txt").is_symlink()


def test_out_inside_a_sharded_checkpoint_of_the_out_dir_is_refused_before_loading(out_dir, capsys):
    (out_dir / "ckpt.pt").unlink()
    shard = out_dir / "ckpt.dcp"
    shard.mkdir()
    (shard / ".metadata").write_bytes(b"metadata")
    (shard / "__0_0.distcp").write_bytes(b"shard 0")
    code, _, err = run(["--checkpoint", out_dir, "--out", shard / "__0_0.distcp", *FAST], capsys)
    one_error_line(code, err, "checkpoint file", "choose another --out")
    assert (shard / "__0_0.distcp").read_bytes() == b"shard 0"


def test_out_naming_a_prompt_file_is_refused_and_the_prompt_is_unchanged(ckpt_file, tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("All:\n")
    code, _, err = run(["--checkpoint", ckpt_file, "--prompt-file", prompt, "--out", prompt, *FAST], capsys)
    one_error_line(code, err, "prompt file", "choose another --out")
    assert prompt.read_text() == "All:\n"


def test_out_naming_the_file_on_stdin_is_refused_and_the_file_is_unchanged(ckpt_file, tmp_path, capsys, monkeypatch):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("All:\n")
    with open(prompt) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        code, _, err = run(["--checkpoint", ckpt_file, "-", "--out", prompt, *FAST], capsys)
    one_error_line(code, err, "stdin", "choose another --out")
    assert prompt.read_text() == "All:\n"


def test_out_beside_the_checkpoint_under_a_new_name_is_still_written(out_dir, capsys):
    code, _, err = run(["--checkpoint", out_dir, "--out", out_dir / "samples.txt", *FAST], capsys)
    assert code == 0, err
    assert (out_dir / "samples.txt").read_text().strip()
    assert load_checkpoint(out_dir / "ckpt.pt")["model_config"]["n_layer"] == 2


# ---------------------------------------------------------------------------------- closed streams, sample.py

@pytest.mark.slow
def test_sample_with_stdout_closed_is_one_line_asking_for_out(ckpt_file):
    r = bash('exec "$@" >&-', sys.executable, ROOT / "sample.py", "--checkpoint", ckpt_file, *FAST)
    one_error_line(r.returncode, r.stderr, "stdout is closed", "--out")


def test_sample_with_stdout_closed_writes_to_out(ckpt_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)  # what Python makes of a stdout closed at start
    code, _, err = run(["--checkpoint", ckpt_file, "--out", tmp_path / "s.txt", *FAST], capsys)
    assert code == 0, err
    assert (tmp_path / "s.txt").read_text().strip()


@pytest.mark.slow
def test_sample_with_stdin_closed_and_a_stdin_prompt_is_one_line(ckpt_file):
    r = bash('exec "$@" <&-', sys.executable, ROOT / "sample.py", "--checkpoint", ckpt_file, "-", *FAST)
    one_error_line(r.returncode, r.stderr, "stdin is closed", "--prompt")


@pytest.mark.parametrize("argv", [["-"], ["--prompt", "-"], ["--prompt-file", "-"]])
def test_every_way_of_reading_a_closed_stdin_is_one_line(ckpt_file, capsys, monkeypatch, argv):
    monkeypatch.setattr(sys, "stdin", None)
    code, _, err = run(["--checkpoint", ckpt_file, *argv, *FAST], capsys)
    one_error_line(code, err, "stdin is closed")


def test_sample_notes_never_go_into_the_samples_when_stderr_is_closed(ckpt_file, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stderr", None)  # print(file=None) would write to stdout
    code, out, _ = run(["--checkpoint", ckpt_file, *FAST], capsys)
    assert code == 0 and "sample.py:" not in out


# ---------------------------------------------------------------------------------- closed or full stdout, train.py

class FullAfter(io.StringIO):
    """A stdout on a disk that fills up after `room` characters."""

    def __init__(self, room: int):
        super().__init__()
        self.room = room

    def write(self, s: str) -> int:
        if self.tell() + len(s) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(s)


def test_console_gives_up_a_failing_stdout_with_one_warning_and_never_raises(capsys):
    full = FullAfter(10)
    console = Console(full)
    console.write("12345")
    for _ in range(3):
        console.write("more than fits\n")
        console.flush()
    err = capsys.readouterr().err
    assert full.getvalue() == "12345"
    assert err.count("warning: cannot write to stdout") == 1 and "No space left" in err and "\n" == err[-1]


def test_console_over_a_closed_stdout_discards_and_is_no_terminal():
    console = Console(None)
    assert console.write("x") == 1 and not console.isatty()
    console.flush()


def test_progress_with_stdout_closed_prints_nothing_and_does_not_fail(monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)
    progress = Progress(2, 0)
    progress.update()
    progress.show(1, "loss 1.0")
    progress.close()


def test_console_guard_restores_stdout(monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)
    with console_guard():
        assert isinstance(sys.stdout, Console)
        print("discarded", flush=True)
    assert sys.stdout is None


def test_training_goes_on_when_stdout_fills_up_mid_run(tmp_path, data_root, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", FullAfter(300))  # the config dump alone is longer
    out = tmp_path / "out"
    train_cli.main(tiny_argv(out, data_root, "--train.max_iters=4", "--train.eval_interval=4", "--train.eval_iters=1"))
    err = capsys.readouterr().err
    assert err.count("warning: cannot write to stdout") == 1
    assert load_checkpoint(out / "ckpt.pt")["train"]["iter"] == 4
    assert [json.loads(line)["iter"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


def _train_script(out: Path, data_root: Path) -> list[str]:
    return [sys.executable, ROOT / "train.py",
            *tiny_argv(out, data_root, "--train.max_iters=3", "--train.eval_interval=3", "--train.eval_iters=1")]


@pytest.mark.slow
def test_train_with_stdout_closed_finishes_and_writes_its_checkpoint(tmp_path, data_root):
    out = tmp_path / "out"
    r = bash('exec "$@" >&-', *_train_script(out, data_root))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert load_checkpoint(out / "ckpt.pt")["train"]["iter"] == 3


@pytest.mark.slow
def test_train_with_stdout_on_a_full_device_finishes_with_one_warning(tmp_path, data_root):
    out = tmp_path / "out"
    r = bash('exec "$@" >/dev/full', *_train_script(out, data_root))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("warning: cannot write to stdout") == 1 and "No space left" in r.stderr
    assert load_checkpoint(out / "ckpt.pt")["train"]["iter"] == 3
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3


def test_a_cli_error_with_stderr_closed_never_lands_on_stdout(monkeypatch, capsys):
    from errors import UserError, run_cli

    def fails():
        raise UserError("bad input; fix it")
    monkeypatch.setattr(sys, "stderr", None)
    with pytest.raises(SystemExit) as e:
        run_cli(fails)
    assert e.value.code == 2 and capsys.readouterr().out == ""  # before: "error: ..." on stdout
