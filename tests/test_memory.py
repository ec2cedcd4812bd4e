"""Memory: runs that can't fit are refused at start in one line, with an estimate that tracks what a run
really uses; an allocation that fails anyway is one line too."""
from __future__ import annotations

import re

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from errors import run_cli
from model import GPTConfig
from runtime.memory import sampling_bytes, training_bytes

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    torch.set_num_threads(1)
    from model import GPT, GPTConfig
    from training.optim import make_optimizers
    from training.step import train_step
    from runtime.loss_path import LMLoss
    from benchmarks.timing import reset_peak_rss, rss_kb

    cfg = GPTConfig(**json.loads(sys.argv[2]))
    B, T = json.loads(sys.argv[3])
    # The peak is reset to the current RSS, so that a peak reached while importing torch (a CUDA build's is
    # larger) isn't counted as the run's.
    before = reset_peak_rss()
    model = GPT(cfg)
    opts = make_optimizers(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), device_type="cpu")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    x = torch.randint(0, cfg.vocab_size, (B, T))
    for _ in range(2):
        train_step(model, LMLoss(), opts, scaler, [(x, x)], amp=lambda: torch.autocast("cpu", enabled=False), grad_clip=1.0)
    print(int((rss_kb("VmHWM") - before) * 1024))
""")


def test_the_training_estimate_tracks_the_measured_peak():
    config = dict(n_layer=4, n_head=4, n_embd=256, block_size=256, vocab_size=8000)
    B, T = 8, 256  # ~500 MiB: far above the interpreter's own, in ~5 s
    r = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), json.dumps(config), json.dumps([B, T])],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    measured = int(r.stdout.strip())
    estimate = sum(training_bytes(GPTConfig(**config), batch_size=B, block_size=T, loss_chunk_rows=None).values())
    assert measured > 200 * 2**20  # big enough for the comparison to mean something
    assert 0.7 <= estimate / measured <= 3.0, (estimate / 2**20, measured / 2**20)  # on the safe side, not absurdly


def test_the_estimates_grow_with_what_the_user_can_lower():
    small = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=100)
    base = sum(training_bytes(small, batch_size=4, block_size=64, loss_chunk_rows=128).values())
    assert sum(training_bytes(small, batch_size=8, block_size=64, loss_chunk_rows=128).values()) > base
    assert sum(sampling_bytes(small, rows=100, prompt_len=10).values()) > sum(sampling_bytes(small, rows=1, prompt_len=10).values())


def _one_line(code, err, *words):
    assert code == 2 and "Traceback" not in err, err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize("override,words", [
    ("--train.batch_size=8000000", "activations"),  # 1.02e9 tokens a step: under the config's bound, not the memory's
    ("--model.n_embd=65536", "weights, gradients and AdamW state"),
    ("--model.block_size=5000000", "activations"),
])
def test_training_that_cannot_fit_is_refused_in_one_line_before_allocating(tmp_path, capsys, override, words):
    from training import cli as train_cli

    argv = ["--data.tokenizer=char", f"--data.root={tmp_path / 'prepared'}", f"--train.out_dir={tmp_path / 'out'}",
            "--model.n_head=4", "--wandb.mode=disabled", "--train.device=cpu", override]
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: train_cli.main(argv))
    _one_line(e.value.code, capsys.readouterr().err, "training needs about", words, "lower train.batch_size")
    assert not (tmp_path / "out" / "ckpt.pt").exists()


def test_sampling_that_cannot_fit_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    import runtime.memory
    from inference import sample_cli
    from sample_runs import make_char_checkpoint

    make_char_checkpoint(tmp_path / "ckpt.pt")
    # --num-samples is bounded by a count now (65536, sample.py's own check); under it, 1 MiB free is too little
    monkeypatch.setattr(runtime.memory, "available_bytes", lambda device: 2**20)
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: sample_cli.main(["--checkpoint", str(tmp_path / "ckpt.pt"), "--num-samples", "60000"]))
    _one_line(e.value.code, capsys.readouterr().err, "sampling needs about", "KV cache", "--num-samples")


@pytest.mark.parametrize("exc", [MemoryError(), RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried "
                                                              "to allocate 1000000000000 bytes")])
def test_an_allocation_that_fails_anyway_is_one_line(capsys, exc):
    def main():
        raise exc

    with pytest.raises(SystemExit) as e:
        run_cli(main)
    _one_line(e.value.code, capsys.readouterr().err, "out of memory")


def oom_fixes() -> dict[str, str]:
    """{entry script: the oom_fix its run_cli call passes}, read from the scripts' source."""
    import ast

    from code_reading import ROOT
    found = {}
    for entry in ("train.py", "sample.py", "chat.py", "serve.py", "data/prepare.py", "eval/hellaswag.py"):
        for node in ast.walk(ast.parse((ROOT / entry).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "run_cli":
                found[entry] = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "oom_fix"), None)
    return found


def test_each_entry_points_out_of_memory_line_names_what_its_user_can_lower(capsys):
    """Every entry point said "lower the batch size, the block size or the model's size", which sample.py,
    chat.py and serve.py don't have: each names its own options, and each option named is one it takes."""
    import dataclasses

    from entry_points import PARSERS
    from training.config.sections import load_config

    fixes = oom_fixes()
    assert all(fixes.values()), fixes  # no entry point falls back to the generic line
    cfg = load_config([])
    keys = {f"{s.name}.{f.name}" for s in dataclasses.fields(cfg) for f in dataclasses.fields(getattr(cfg, s.name))}
    for entry, fix in fixes.items():
        named = re.findall(r"--[a-z][a-z-]*", fix) if entry != "train.py" else re.findall(r"\b[a-z]+\.[a-z_]+\b", fix)
        assert named, (entry, fix)
        if entry == "train.py":
            assert set(named) <= keys, (set(named) - keys)
        else:
            name = {"data/prepare.py": "python -m data.prepare", "eval/hellaswag.py": "python -m eval.hellaswag"}.get(entry, entry)
            options = {o for a in PARSERS[name][0]()._actions for o in a.option_strings}
            assert set(named) <= options, (entry, set(named) - options)
        with pytest.raises(SystemExit):
            run_cli(lambda: (_ for _ in ()).throw(MemoryError()), oom_fix=fix)
        assert capsys.readouterr().err == f"error: out of memory (MemoryError); {fix}\n"


def test_other_runtime_errors_are_not_mistaken_for_memory():
    def main():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run_cli(main)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_keeping_freed_memory_stops_the_page_faults_of_reallocating_a_steps_buffers():
    """Three 26 MB buffers allocated and freed 10 times (as a CPU step does with the head's logits chunk and
    gradients). glibc starts by mapping such blocks afresh with mmap (its 128 KiB threshold, which it
    then moves by heuristics, so the default count varies from run to run: the test pins the start) and
    gives them back when freed, so every step faults ~19,000 pages in again; with keep_freed_memory()
    they are reused."""
    code = textwrap.dedent("""
        import ctypes, resource, sys, torch
        from runtime.memory import keep_freed_memory
        if sys.argv[1] == "keep":
            assert keep_freed_memory()
        else:  # glibc's starting point, held there: M_MMAP_THRESHOLD = 128 KiB
            assert ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)
        def step():
            bufs = [torch.ones(6_500_000) for _ in range(3)]  # 26 MB each, then freed
            return sum(b.sum() for b in bufs)
        for i in range(3):
            step()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for i in range(10):
            step()
        print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 10)
    """)
    faults = {}
    for mode in ("mapped", "keep"):
        r = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
        assert r.returncode == 0, r.stderr[-2000:]
        faults[mode] = float(r.stdout.split()[-1])
    # 3 x 26 MB is ~19,000 pages of 4 KiB. Kept memory faults ~0 times on a quiet machine; a kernel that reclaims
    # idle pages proactively (DAMON on this CI's VMs) can take some back between steps, hence the margin
    assert faults["mapped"] > 15000 and faults["keep"] < faults["mapped"] / 4, faults


@given(first=st.lists(st.sampled_from(["must be", "at most 5,", "e.g.", "i.e.", "etc.", "vs.", "64", "x"]), min_size=1,
                      max_size=6).map(" ".join),
       rest=st.lists(st.sampled_from(["Then", "more", "words"]), max_size=3).map(" ".join))
def test_short_error_keeps_the_first_sentence_whole_abbreviations_included(first, rest):
    """errors.short_error cut at every '. ', so "…, e.g. 64. More" kept "…, e.g" and lost the example the hint
    gave. The first sentence ends at a full stop that is no abbreviation's dot (this list written by hand)."""
    from errors import short_error

    message = f"{first}. {rest}" if rest else first
    assert short_error(ValueError(message)) == f"ValueError: {first}"
