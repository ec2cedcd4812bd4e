"""Training and sampling never lose or overwrite a run's files, and every bad file, full disk or
interruption is one line: one writer per out_dir, earlier runs' files kept, half-valid checkpoints and
HF directories refused, non-UTF-8 prompts named, compile failures survived."""
from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from inference import sample_cli
from errors import UserError
from checkpoint import load_checkpoint, save_checkpoint
from tiny_runs import run, tiny_argv
from cli_lines import cli, an_error_line
import warm_runs

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


# ------------------------------------------------------------------------------------------ one writer

@pytest.mark.slow
def test_a_second_trainer_on_the_same_out_dir_stops_and_the_checkpoint_is_never_torn(tmp_path, data_root):
    out = tmp_path / "out"
    argv = tiny_argv(out, data_root, "--train.max_iters=100000", "--train.checkpoint_interval=2",
                     "--train.eval_interval=100000", "--train.log_interval=50")
    first = warm_runs.Process([ROOT / "train.py", *argv], env=ENV, stdout=tmp_path / "first.out",
                              stderr=tmp_path / "first.err")
    deadline = time.time() + 60
    while not (out / "ckpt.pt").exists():
        assert time.time() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.05)
    reads, torn = 0, []

    def reader():  # meanwhile ckpt.pt is rewritten every 2 steps: it must always load
        nonlocal reads
        while first.poll() is None and reads < 200:
            try:
                load_checkpoint(out)
            except UserError as e:
                torn.append(str(e))
            reads += 1

    t = threading.Thread(target=reader)
    t.start()
    second = warm_runs.run([ROOT / "train.py", *argv], env=ENV, timeout=120)
    t.join(timeout=60)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert second.returncode == 2 and "Traceback" not in second.stderr
    line = an_error_line(second.returncode, second.stderr, "another trainer", f"pid {first.pid}", "is writing to")
    assert os.uname().nodename in line
    assert reads >= 20 and torn == []
    assert first.returncode == 0 and not (out / ".train.lock").exists()  # released at the end


def test_a_lock_left_by_a_killed_trainer_does_not_block(tmp_path, data_root):
    import socket

    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / ".train.lock").write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    assert run(out, data_root, "--train.max_iters=2")["iter"] == 2


# ------------------------------------------------------------------------------------------ earlier runs' files

def test_resume_never_refuses_an_out_dir_holding_any_earlier_runs_file(tmp_path, data_root, capsys):
    for name in ("best.pt", "metrics.jsonl"):
        out = tmp_path / name
        out.mkdir()
        (out / name).write_bytes(b"earlier")
        code, _, err = cli(tiny_argv(out, data_root, "--train.resume=never"), capsys)
        an_error_line(code, err, f"holds an earlier run's {name}", "train.resume=never refuses")
        assert (out / name).read_bytes() == b"earlier"


def test_a_fresh_run_never_replaces_another_runs_best_checkpoint(tmp_path, data_root, capsys):
    """The reported case: out_dir with only best.pt (a good model) and resume=auto used to end with a
    worse best.pt and the old metrics.jsonl appended to."""
    out = tmp_path / "out"
    run(out, data_root, "--train.max_iters=4", "--train.eval_interval=2")
    (out / "ckpt.pt").unlink()
    before = {name: (out / name).read_bytes() for name in ("best.pt", "metrics.jsonl")}
    code, _, err = cli(tiny_argv(out, data_root, "--train.max_iters=2"), capsys)
    an_error_line(code, err, "holds an earlier run's best.pt, metrics.jsonl but no ckpt.pt", "new --train.out_dir")
    assert {name: (out / name).read_bytes() for name in before} == before


def test_a_resumed_run_refuses_a_best_checkpoint_of_another_run(tmp_path, data_root, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    run(a, data_root, "--train.max_iters=2", "--train.eval_interval=2")
    run(b, data_root, "--train.max_iters=2", "--train.eval_interval=2")
    (b / "best.pt").write_bytes((a / "best.pt").read_bytes())  # another run's best model, moved in by hand
    code, _, err = cli(tiny_argv(b, data_root, "--train.max_iters=4"), capsys)
    an_error_line(code, err, "best.pt belongs to another run", "worse model")


@pytest.fixture(scope="module")
def char_ckpt(tmp_path_factory) -> Path:
    from sample_runs import make_char_checkpoint

    path = tmp_path_factory.mktemp("ck") / "ckpt.pt"
    make_char_checkpoint(path)
    return path


# ------------------------------------------------------------------------------------------ filesystem

def test_an_out_dir_that_is_a_file_or_unwritable_is_one_line_at_start(tmp_path, data_root, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    code, _, err = cli(tiny_argv(tmp_path / "file", data_root), capsys)
    an_error_line(code, err, "train.out_dir=", "is a file")
    import fileio

    def denied(final):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(fileio, "temp_path", denied)  # tests run as root: an unwritable dir, simulated
    code, _, err = cli(tiny_argv(tmp_path / "ro", data_root), capsys)
    an_error_line(code, err, "train.out_dir=", "is not writable")


def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, data_root, capsys,
                                                                                      monkeypatch):
    import checkpoint.format

    out = tmp_path / "out"
    run(out, data_root, "--train.max_iters=2", "--train.eval_interval=2")
    before = (out / "ckpt.pt").read_bytes()
    real = torch.save

    def full(obj, f, *a, **k):
        real(obj, f, *a, **k)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.format.torch, "save", full)
    code, _, err = cli(tiny_argv(out, data_root, "--train.max_iters=4", "--train.eval_interval=100"), capsys)
    an_error_line(code, err, "cannot write", "No space left on device", "ckpt.pt, still holds iter 2")
    assert (out / "ckpt.pt").read_bytes() == before and not list(out.glob(".*.tmp"))


class _FillsUp(io.RawIOBase):
    """A file that takes `room` bytes, then fails as a full disk does (torch's zip writer then raises a
    RuntimeError "unexpected pos" while handling the OSError, as on a real full tmpfs)."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def writable(self):
        return True

    def write(self, b):
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(b)
        return self.f.write(b)


def test_a_disk_that_fills_up_inside_torch_save_is_one_line_and_its_advice_works(tmp_path, data_root, capsys,
                                                                                 monkeypatch):
    import checkpoint.format

    real_open = checkpoint.format.open_own  # how TorchFile opens the temp it writes (never through a link)

    def filling(path, mode="wb", *a, **k):
        f = real_open(path, mode, *a, **k)
        return _FillsUp(f, 4096) if "w" in mode else f
    monkeypatch.setattr(checkpoint.format, "open_own", filling)
    out = tmp_path / "out"
    argv = tiny_argv(out, data_root, "--train.max_iters=2", "--train.eval_interval=2")
    code, _, err = cli(argv, capsys)
    # the first checkpoint failed: nothing to resume, and the advice says how the rerun gets past the log left behind
    an_error_line(code, err, "cannot write", "No space left on device", "nothing to resume", "new --train.out_dir",
             "metrics.jsonl away")
    assert not (out / "ckpt.pt").exists() and not list(out.glob(".*.tmp"))
    monkeypatch.undo()  # space freed
    (out / "metrics.jsonl").rename(tmp_path / "failed-metrics.jsonl")  # as the line says
    code, _, err = cli(argv, capsys)
    assert code == 0 and (out / "ckpt.pt").exists(), err


def test_a_metrics_file_that_is_a_directory_is_one_line(tmp_path, data_root, capsys):
    out = tmp_path / "out"
    run(out, data_root, "--train.max_iters=2")
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").mkdir()
    code, _, err = cli(tiny_argv(out, data_root, "--train.max_iters=3"), capsys)
    an_error_line(code, err, "metrics.jsonl is not a file")


@pytest.mark.slow
def test_sampling_into_a_full_device_is_one_line(char_ckpt):
    r = warm_runs.run([ROOT / "sample.py", "--checkpoint", char_ckpt, "--max-new-tokens", "50", "--seed", "1"],
                      stdout="/dev/full", env=ENV)
    an_error_line(r.returncode, r.stderr, "cannot write the samples to stdout", "No space left on device")


# ------------------------------------------------------------------------------------------ half-valid files

@pytest.mark.parametrize("damage,words", [
    (lambda ck: ck.pop("optimizer"), "no 'optimizer' entry"),
    (lambda ck: ck.pop("rng"), "no 'rng' entry"),
    (lambda ck: ck.pop("loader"), "no 'loader' entry"),
    (lambda ck: ck.pop("train"), "no 'train' entry"),
    (lambda ck: ck.update(rng={"ranks": "nonsense"}), "its 'rng' entry is malformed"),
    (lambda ck: ck["train"].update(iter="ten"), "its 'train' entry is malformed"),
])
def test_a_checkpoint_with_a_missing_or_malformed_entry_is_one_line(tmp_path, data_root, capsys, damage, words):
    out = tmp_path / "out"
    run(out, data_root, "--train.max_iters=2")
    ck = load_checkpoint(out)
    damage(ck)
    save_checkpoint(out / "ckpt.pt", ck)
    code, _, err = cli(tiny_argv(out, data_root, "--train.max_iters=4"), capsys)
    an_error_line(code, err, words)


def test_a_checkpoint_with_nan_weights_is_one_line_in_sample(tmp_path, capsys):
    from sample_runs import make_char_checkpoint

    make_char_checkpoint(tmp_path / "ckpt.pt")
    ck = load_checkpoint(tmp_path / "ckpt.pt")
    ck["model"]["transformer.h.0.mlp.c_fc.weight"][0, 0] = float("nan")
    save_checkpoint(tmp_path / "ckpt.pt", ck)
    code, _, err = cli(["--checkpoint", str(tmp_path / "ckpt.pt"), "--max-new-tokens", "3"], capsys, main=sample_cli.main)
    an_error_line(code, err, "non-finite weights", "transformer.h.0.mlp.c_fc.weight")


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("case", ["pickle_bin", "corrupt_safetensors", "config_missing_keys", "config_a_list"])
def test_init_from_a_bad_hf_directory_is_one_line_in_train_and_sample(tmp_path, data_root, capsys, case):
    transformers = pytest.importorskip("transformers")
    hf = tmp_path / "hf"
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=1, n_embd=8, n_positions=32))
    model.save_pretrained(hf)
    marker = tmp_path / "MARKER"
    if case == "pickle_bin":
        (hf / "model.safetensors").unlink()
        torch.save({"x": _Evil(marker)}, hf / "pytorch_model.bin")
    elif case == "corrupt_safetensors":
        (hf / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken")
    elif case == "config_missing_keys":
        (hf / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    else:
        (hf / "config.json").write_text("[1, 2, 3]")
    code, _, err = cli(tiny_argv(tmp_path / "out", data_root, "--data.tokenizer=gpt2", f"--model.init_from={hf}"), capsys)
    train_line = an_error_line(code, err)
    code, _, err = cli(["--checkpoint", str(hf), "--max-new-tokens", "2"], capsys, main=sample_cli.main)
    sample_line = an_error_line(code, err)
    assert str(hf) in train_line and str(hf) in sample_line
    assert not marker.exists()  # the pickle's code never ran


# ------------------------------------------------------------------------------------------ prompts

@pytest.mark.parametrize("where", ["argv", "stdin", "file"])
def test_a_non_utf8_prompt_is_one_line_naming_the_byte_offset_on_every_input_path(char_ckpt, tmp_path, where):
    """One rule everywhere: before, char checkpoints crashed with UnicodeEncodeError and gpt2 ones
    silently turned the bytes into '?'."""
    bad = b"ROMEO:\xff\xfe"
    args = [ROOT / "sample.py", "--checkpoint", char_ckpt, "--max-new-tokens", "2"]
    kw = {}
    if where == "argv":
        args += ["--prompt", os.fsdecode(bad)]
    elif where == "stdin":
        args += ["-"]
        kw["input"] = bad
    else:
        (tmp_path / "p.txt").write_bytes(bad)
        args += ["--prompt-file", str(tmp_path / "p.txt")]
    r = warm_runs.run(args, env=ENV, text=False, **kw)
    an_error_line(r.returncode, r.stderr.decode(), "not valid UTF-8: byte 0xff at byte offset 6")


# ------------------------------------------------------------------------------------------ compile, Ctrl-C

def test_a_compile_failure_falls_back_to_eager_with_one_line(tmp_path, data_root, capsys, monkeypatch):
    class CppCompileError(Exception):
        """What Inductor raises on a CPU without a C++ compiler."""
    CppCompileError.__module__ = "torch._inductor.exc"

    class Broken(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *a, **k):
            raise CppCompileError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", lambda m, **k: Broken(m))
    eager = run(tmp_path / "eager", data_root, "--train.max_iters=3")
    capsys.readouterr()
    compiled = run(tmp_path / "compiled", data_root, "--train.max_iters=3", "--train.compile=true")
    warnings = [ln for ln in capsys.readouterr().out.splitlines() if "torch.compile failed" in ln]
    assert len(warnings) == 1 and "no C++ compiler found" in warnings[0]
    assert compiled["losses"] == eager["losses"]  # the failed step was redone from the same state


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train.py", "sample.py"])
def test_ctrl_c_during_start_up_is_one_line_not_a_traceback(script, tmp_path):
    proc = subprocess.Popen([sys.executable, str(ROOT / script), "--train.out_dir=x" if script == "train.py" else
                             "--max-new-tokens=1"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    time.sleep(0.3)  # inside the imports (torch alone takes longer than this)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "interrupted", err


# ------------------------------------------------------------------------------------------ leftovers of killed writers

def test_a_run_removes_the_temps_of_killed_writers_and_says_so(tmp_path, data_root, capsys):
    """A writer killed mid-save leaves a whole checkpoint as a temp file (or a temp dir, for a sharded
    writer). The next trainer of the out_dir removes those of dead writers, including one whose pid now
    belongs to an unrelated live process (its start time differs from the one in the name), keeps a
    live writer's of another name, and says what it removed in one line."""
    from fileio import _start_time

    out = tmp_path / "out"
    run(out, data_root, "--train.max_iters=2", "--train.eval_interval=2")
    dead_pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                                  text=True).stdout)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        while _start_time(live.pid) is None:
            time.sleep(0.01)
        stale = [out / f".ckpt.pt.{dead_pid}.1234abcd.tmp",  # a name of the earlier format: pid only
                 out / f".best.pt.{live.pid}-1.5678abcd.tmp"]  # the pid, reused by a process started later
        stale[0].write_bytes(b"x" * 700_000)
        stale[1].write_bytes(b"x" * 500_000)
        shards = out / f".ckpt.pt.{dead_pid}-7.9abcdef0.tmp"  # a temp directory of a killed sharded writer
        shards.mkdir()
        (shards / "shard-0").write_bytes(b"x" * 300_000)
        # a live writer's temp of another name (a consolidate beside the run): kept; of a checkpoint's name it would
        # be an orphan under the lock whatever its pid (tests/test_hostile_outputs.py)
        alive = out / f".consolidated.pt.{live.pid}-{_start_time(live.pid)}.aaaaaaaa.tmp"
        alive.write_bytes(b"y")
        capsys.readouterr()
        res = run(out, data_root, "--train.max_iters=4", "--train.eval_interval=2")
        printed = [ln for ln in capsys.readouterr().out.splitlines() if "leftover" in ln]
        assert printed == ["removed 3 leftover temp files from a killed run (1.5 MB)"]
        assert not any(p.exists() for p in (*stale, shards)) and alive.exists()
        assert res["iter"] == 4 and load_checkpoint(out)["train"]["iter"] == 4
    finally:
        live.kill()
        live.wait()


def test_a_full_disk_when_taking_the_run_lock_is_one_line_and_leaves_no_empty_lock(tmp_path, data_root, monkeypatch):
    """ENOSPC while writing .train.lock: before, the error was a traceback and a 0-byte .train.lock stayed."""
    import fileio

    real_write = fileio.write_synced

    def disk_full(path, data, *a, **k):
        if b'"pid"' in data:  # the lock's content
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, data, *a, **k)
    monkeypatch.setattr(fileio, "write_synced", disk_full)
    out = tmp_path / "out"
    with pytest.raises(UserError, match=r"cannot write the lock file .*\.train\.lock .*No space left on device.*free "
                                        r"some space"):
        run(out, data_root, "--train.max_iters=2")
    assert not (out / ".train.lock").exists() and not (out / "ckpt.pt").exists()
