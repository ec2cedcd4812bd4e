"""The entry points, listed once for the reliability classes' tests (docs/reliability.md): what each parses
(its path options are enumerated from the parser, by fileio's path_arg types, and from the config fields
marked path=True), and what each writes (its output option, and the kind of folder it manages there).

A new entry point adds one row to PARSERS (every entry point) and, if it writes, one to WRITERS: the class
tests then cover it. E.g. on merging chat.py and serve.py:

    PARSERS["chat.py"] = (chat_cli.build_parser, chat_cli.main)
    WRITERS.append(Writer("chat.py --save", chat_cli.main, lambda out, w: ["--checkpoint", w.ckpt, "--save", out], "file"))
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Callable

from benchmarks import cli as bench_cli
from inference import chat_cli
import eval.chat_tasks as chat_tasks
import eval.hellaswag as hellaswag
import eval.inspect as inspect_cli
from inference import sample_cli
from training import cli as train_cli
from checkpoint import __main__ as checkpoint_cli
from checkpoint import export as export_cli
from data import prepare as prepare_cli
from data import tasks as tasks_cli
from ownership import DATA, EXPORT, OUT_DIR
from server import cli as serve_cli
from settings import path_fields
from training import plot
from training.config.sections import Config

from hostile_world import SAMPLE_FAST, run_entry, train_argv  # noqa: F401  (run_entry: for the tests)

Main = Callable[[list[str]], "int | None"]

# entry point -> (its argparse parser, its main): every path option is found in the parser
PARSERS: dict[str, tuple[Callable[[], argparse.ArgumentParser], Main]] = {
    "sample.py": (sample_cli.build_parser, sample_cli.main),
    "python -m eval.inspect": (inspect_cli.build_parser, inspect_cli.main),
    "python -m eval.hellaswag": (hellaswag.build_parser, hellaswag.main),
    "python -m training.plot": (plot.build_parser, plot.main),
    "bench.py": (bench_cli.build_parser, bench_cli.main),
    "python -m checkpoint": (checkpoint_cli.build_parser, checkpoint_cli.main),
    "python -m checkpoint.export": (export_cli.build_parser, export_cli.main),
    "python -m data.prepare": (prepare_cli.build_parser, prepare_cli.main),
    "chat.py": (chat_cli.build_parser, chat_cli.main),
    "serve.py": (serve_cli.build_parser, serve_cli.main),  # (serve.py is the thin entry to server/cli.py)
    "python -m data.tasks": (tasks_cli.build_parser, tasks_cli.main),
    "python -m eval.chat_tasks": (chat_tasks.build_parser, chat_tasks.main),
}
# Modules run as scripts that are not a user's entry point: each with the reason, so that a new entry point
# can't go unlisted (tests/test_class2_one_gate.py checks every `__main__` block is in PARSERS or here)
NOT_ENTRY_POINTS = {
    "train.py": "its path options are config fields (path_fields), not argparse options: covered through Config",
    "benchmarks/auto_batch.py": "a GPU benchmark script (gpu_round.sh); its --json is gated and typed path_arg",
    "benchmarks/fsdp.py": "bench.py's FSDP row starts it as a rank worker, with argv bench.py writes",
    "benchmarks/gpu_curves.py": "draws the GPU round's logs (gpu_round.sh); its output is gated",
    "benchmarks/gpu_step_profile.py": "a GPU profile script (gpu_round.sh); writes nothing but stdout",
    "benchmarks/pool_prepare.py": "bench.py's corpus row runs it into a temp folder: the baseline, unchecked on purpose",
    "benchmarks/sft_batches.py": "a timing script; writes nothing but stdout",
}


@dataclasses.dataclass(frozen=True)
class PathOption:
    entry: str
    option: str  # "--out", or a positional's name
    main: Main
    prefix: tuple[str, ...]  # what comes before it (a subcommand)
    positional: bool
    empty_ok: bool  # '' is the option's "none" (its default)

    def argv(self, value: str) -> list[str]:
        return [*self.prefix, value] if self.positional else [*self.prefix, self.option, value]

    def __str__(self) -> str:
        return f"{self.entry} {self.option}"


def _path_actions(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _path_actions(sub, (*prefix, name))
        elif getattr(action.type, "checks_path", False):
            yield action, prefix


def path_options() -> list[PathOption]:
    """Every path option of every entry point: argparse options typed by fileio's path_arg, train.py's
    --config, and every config key marked path=True (as --section.key=VALUE)."""
    out = []
    for entry, (build, main) in PARSERS.items():
        for action, prefix in _path_actions(build()):
            name = action.option_strings[-1] if action.option_strings else action.dest
            out.append(PathOption(entry, name, main, prefix, not action.option_strings,
                                  getattr(action.type, "empty_ok", False)))
    out.append(PathOption("train.py", "--config", train_cli.main, (), False, False))
    for section in dataclasses.fields(Config):
        for f in path_fields(getattr(Config(), section.name)):
            out.append(TrainKey(f"--{section.name}.{f.name}"))
    return out


class TrainKey(PathOption):
    """A config key of kind path, given on train.py's command line as --section.key=VALUE."""

    def __init__(self, option: str):
        super().__init__("train.py", option, train_cli.main, (), False, True)  # (empty: each key's own rule)

    def argv(self, value: str) -> list[str]:
        return [f"{self.option}={value}", "--wandb.mode=disabled"]


# ------------------------------------------------------------------------------------------ the writers

@dataclasses.dataclass(frozen=True)
class Writer:
    """An entry point that writes: `argv(out, world)` has it write `out` (a file or a folder: `makes`),
    reading the world's tiny checkpoints; `manages`: the ownership kind of the folder it writes (None: a
    user's file or folder)."""
    name: str
    main: Main
    argv: Callable[[Path, object], list[str]]
    makes: str  # "file" or "folder"
    manages: str | None = None
    file_name: str = "out.txt"  # the name of a file output in the tests (its suffix decides some writers)

    def __str__(self) -> str:
        return self.name


WRITERS: list[Writer] = [
    Writer("sample.py --out", sample_cli.main, lambda o, w: ["--checkpoint", w.ckpt, "--out", o, *SAMPLE_FAST], "file"),
    Writer("eval.inspect --out", inspect_cli.main,
           lambda o, w: ["--checkpoint", w.ckpt, "--text", "hear me", "--out", o], "folder"),
    Writer("training.plot --out", plot.main, lambda o, w: [w.run, "--out", o], "file", file_name="curves.png"),
    Writer("bench.py --json", bench_cli.main, lambda o, w: ["--device", "cpu", "--quick", "--only", "decode", "--no-hf",
                                                           "--json", o], "file"),  # its quickest section: ~2 s
    Writer("checkpoint consolidate --out", checkpoint_cli.main,
           lambda o, w: ["consolidate", w.run / "ckpt.dcp", "--out", o], "file"),
    Writer("checkpoint.export --out", export_cli.main, lambda o, w: ["--checkpoint", w.gpt2, "--out", o], "folder",
           EXPORT),
    Writer("data.prepare --root", prepare_cli.main,
           lambda o, w: ["--dataset", w.corpus, "--tokenizer", "char", "--root", o, "--no-progress"], "folder", DATA),
    Writer("data.tasks --out", tasks_cli.main,
           lambda o, w: ["--out", o, "--train", "2", "--heldout", "0", "--pretrain-lines", "0"], "folder"),
    Writer("train.py train.out_dir", train_cli.main, lambda o, w: train_argv(o, w.data_root, "--wandb.mode=disabled"),
           "folder", OUT_DIR),
]
