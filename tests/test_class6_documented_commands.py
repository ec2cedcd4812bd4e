"""Class 6 (docs/reliability.md): every command README.md and docs/*.md show runs in CI. tests/doc_commands.py
extracts them (its docstring: the extraction rules; SKIP_RULES: what is not run, each with its reason);
each is one test case here, so pytest lists what ran and what was skipped and why (`-rs`).

Substitutions, the only changes made to a documented command before it runs (in a sandbox folder that
stands for the repository's root, in this process, through errors.run_cli as `python ...` would):
- tiny data and a tiny model: every train.py command gets TINY's overrides for each key it does not set
  itself (1 layer, 16 wide, 16 tokens of context, 2 steps, CPU, float32, no wandb); the steps it asks for
  (train.max_iters) become 2; a time budget stays (it sizes at most the 2 steps); a dataset from the HF
  hub becomes tiny shakespeare (the local copy); the chat chain's configs keep 96 tokens of context, so that a
  task conversation fits; sample.py writes 8 tokens a sample (--max-new-tokens,
  replaced) in float32 (--dtype, where not set: no timing of bf16 against it);
- each train.py command trains into a fresh out_dir of its own (out/doc-<line>), since the docs' commands
  would otherwise resume one another's runs with other settings, which train.py refuses, as documented;
- a checkpoint a command reads (out/small, out/small_modern, out/shakespeare_char, out/gpt2_xl_fsdp, and the chat chain's
  out/tasks_base and out/sft, after `python -m data.tasks --out tasks`) is a tiny run of that config trained
  first (the `sandbox` fixture); `gpt2`, the HF hub's GPT-2, is a tiny local GPT-2-tokenizer
  checkpoint of 6 layers and 2 heads (so --layer 5 --head 1 exist);
- a file a command reads that the docs assume (hellaswag_val.jsonl, snippet.txt) is a tiny one, made first;
- the environment: `export`s of the offline copies (TIKTOKEN_CACHE_DIR, SMALLGPT_SHAKESPEARE) keep the
  test's values; other variables are set for the command (read in this process, after torch's import).
A command of another entry point than those in ENTRIES (chat.py, serve.py when they land) runs as a
subprocess in the sandbox, with the same rules.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import cli as bench_cli
import eval.hellaswag as hellaswag
import eval.inspect as inspect_cli
from inference import sample_cli
from training import cli as train_cli
from checkpoint import __main__ as checkpoint_cli
from checkpoint import export as export_cli
from checkpoint import save_checkpoint
from data import prepare as prepare_cli
from data import tasks as tasks_cli
from doc_commands import ROOT, all_commands, documents, unlabelled_commands
from errors import run_cli
from model import GPT, GPTConfig
from training import plot
import warm_runs

COMMANDS = all_commands()
ENTRIES = {("train.py",): train_cli.main, ("sample.py",): sample_cli.main, ("bench.py",): bench_cli.main,
           ("-m", "eval.inspect"): inspect_cli.main, ("-m", "eval.hellaswag"): hellaswag.main,
           ("-m", "checkpoint.export"): export_cli.main, ("-m", "checkpoint"): checkpoint_cli.main,
           ("-m", "training.plot"): plot.main, ("-m", "data.prepare"): prepare_cli.main}
TINY = {"model.n_layer": "1", "model.n_head": "2", "model.n_embd": "16", "model.block_size": "16",
        "model.dropout": "0.0", "train.batch_size": "2", "train.grad_accum_steps": "1", "train.warmup_iters": "1",
        "train.eval_interval": "2", "train.eval_iters": "1", "train.log_interval": "1", "train.eval_full": "false",
        "train.checkpoint_interval": "0", "train.device": "cpu", "train.dtype": "float32", "train.compile": "false",
        "train.peak_flops": "1e11", "train.activation_checkpointing": "false", "wandb.mode": "disabled"}
STEPS = {"train.max_iters": "2"}  # replaced even where the command sets them
SAMPLE_TINY = {"--max-new-tokens": "8", "--dtype": "float32"}  # sample.py: 8 tokens (replaced), no dtype timing
HUB_DATA = {"data.dataset": "shakespeare", "data.hf_subset": "", "data.val_fraction": "0.1", "data.num_proc": "1"}
FILES = {"hellaswag_val.jsonl": json.dumps({"ctx": "A man sits down.", "label": 0,
                                            "endings": ["He eats.", "He runs.", "It rains.", "She sings."]}) + "\n",
         "snippet.txt": "To be, or not to be, that is the question.\n"}
TINY_GPT2 = "gpt2-tiny"
READ_RUNS = ("small", "small_modern", "shakespeare_char", "gpt2_xl_fsdp")
CHAT_RUNS = ("tasks_base", "sft")  # in this order: sft.yaml fine-tunes out/tasks_base
CHAT_TINY = {"model.block_size": "96"}  # a conversation of the tasks is up to ~90 characters: it must fit


def train_argv(argv: list[str], out_dir: str, config: str | None = None) -> list[str]:
    """A train.py command's words with the substitutions (the module's docstring)."""
    args = [a for a in argv if not any(a.startswith(f"--{k}=") for k in STEPS)]
    given = {a[2:].split("=", 1)[0] for a in args if a.startswith("--") and "=" in a}
    hub = config is not None and config.startswith("gpt2_xl") or any(a.startswith("--data.dataset=hf:") for a in args)
    tiny = {**TINY, **(CHAT_TINY if config is not None and config.removesuffix(".yaml") in CHAT_RUNS else {})}
    extra = {**{k: v for k, v in tiny.items() if k not in given}, **STEPS, "train.out_dir": out_dir,
             **(HUB_DATA if hub else {})}
    return [*args, *(f"--{k}={v}" for k, v in extra.items())]


def in_dir(folder: Path):
    """chdir for a block (the sandbox stands for the repository's root)."""
    class Here:
        def __enter__(self):
            self.old = os.getcwd()
            os.chdir(folder)

        def __exit__(self, *exc):
            os.chdir(self.old)
    return Here()


def run_main(main, argv: list[str]) -> int:
    try:
        run_cli(lambda: main(argv))
    except SystemExit as e:
        return e.code or 0
    return 0


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    """The repository's root as the docs assume it: the runs they read, trained tiny; the files they read."""
    root = tmp_path_factory.mktemp("docs")
    with in_dir(root):
        for name, text in FILES.items():
            Path(name).write_text(text)
        for config in READ_RUNS:
            code = run_main(train_cli.main, train_argv(["--config", config], f"out/{config}", config))
            assert code == 0, f"the tiny out/{config} the docs read did not train"
        # the chat chain the docs read: the task files, a base model, its fine-tune (out/sft, a chat model)
        assert run_main(tasks_cli.main, ["--out", "tasks"]) == 0, "the docs' tasks/ could not be written"
        for config in CHAT_RUNS:
            code = run_main(train_cli.main, train_argv(["--config", config], f"out/{config}", config))
            assert code == 0, f"the tiny out/{config} the docs read did not train"
        torch.manual_seed(0)
        cfg = GPTConfig(vocab_size=50257, block_size=16, n_layer=6, n_head=2, n_embd=8)
        save_checkpoint(Path(TINY_GPT2) / "ckpt.pt", {"model": GPT(cfg).state_dict(), "model_config": dataclasses.asdict(cfg),
                                                      "config": {}, "tokenizer": {"tokenizer": "gpt2", "chars": None}})
    return root


def substituted(cmd) -> tuple[object, list[str]]:
    """(the entry point's main, or None for a subprocess; the words to run it with)."""
    words = cmd.argv[1:] if cmd.argv[0] in ("python", "python3") else cmd.argv
    words = [TINY_GPT2 if w == "gpt2" and i and words[i - 1] == "--checkpoint" else w for i, w in enumerate(words)]
    for key, main in ENTRIES.items():
        if tuple(words[:len(key)]) == key:
            args = words[len(key):]
            if main is train_cli.main and "--help" not in args:
                config = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"), None)
                args = train_argv(args, f"out/doc-{Path(cmd.doc).stem}-{cmd.line}", config)
            if main is sample_cli.main:
                args = [a for i, a in enumerate(args) if a not in SAMPLE_TINY and (not i or args[i - 1] not in SAMPLE_TINY)]
                args += [w for kv in SAMPLE_TINY.items() for w in kv]
            return main, args
    return None, words


@pytest.mark.parametrize("cmd", COMMANDS, ids=str)
def test_class6_every_documented_command_runs(cmd, sandbox, capsys, monkeypatch):
    if cmd.skip:
        pytest.skip(cmd.skip)
    for key, value in cmd.env.items():
        if key not in os.environ:  # (the offline copies: the test's own values)
            monkeypatch.setenv(key, value)
    monkeypatch.chdir(sandbox)
    main, args = substituted(cmd)
    if main is None:  # another entry point: as a subprocess, in the sandbox
        run = warm_runs.run([ROOT / a if a.endswith(".py") else a for a in args], input=cmd.stdin or "", cwd=sandbox,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
        code, out, err = run.returncode, run.stdout, run.stderr
    else:
        if cmd.stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(cmd.stdin.encode())))
        code = run_main(main, args)
        out, err = capsys.readouterr()
    assert code == 0, f"{cmd} exited {code}:\n{err[-3000:]}"
    if cmd.stdout_to:
        (sandbox / cmd.stdout_to).write_text(out)


def test_class6_the_docs_show_commands_and_every_skip_has_a_rule():
    """What the suite runs: the listing (pytest -s prints it). The extraction finds the docs' commands
    (a regression in it would run nothing and pass), and most of them run."""
    ran = [c for c in COMMANDS if not c.skip]
    for c in COMMANDS:
        print(f"{'skipped' if c.skip else 'runs   '}  {c}" + (f"  ({c.skip})" if c.skip else ""))
    assert len(COMMANDS) >= 40 and len(ran) >= 20, (len(COMMANDS), len(ran))
    shown = {c.doc for c in COMMANDS}
    assert {"README.md", "docs/training.md", "docs/sampling.md", "docs/inspect.md"} <= shown, shown


def test_class6_the_inspect_example_text_holds_a_newline():
    """The issue's example: `--text "ROMEO:\\nBut soft"` reached the model as a backslash and an n, which a
    char model lacks. The doc now writes bash's $'...', which the extraction decodes as bash does."""
    cmd = next(c for c in COMMANDS if "eval.inspect" in c.argv and "--text" in c.argv)
    text = cmd.argv[cmd.argv.index("--text") + 1]
    assert "\n" in text and "\\n" not in text, text


def test_class6_no_command_hides_in_a_block_that_is_not_run(tmp_path):
    """An unlabelled block is output, so a command in it was never run: each one is in a bash block."""
    assert [f for doc in documents() for f in unlabelled_commands(doc)] == []
    shown = tmp_path / "doc.md"
    shown.write_text("```\npython train.py --config small\n```\n```\n$ python sample.py\niter 1\n```\n")
    assert [f.split(": ", 1)[1] for f in unlabelled_commands(shown)] == ["python train.py --config small"]
