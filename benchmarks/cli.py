"""`python bench.py`: its options, each checked before anything is measured (parse_args), and main, which
hands the checked options to the run of the sections (benchmarks/suite.py). What the command does, for its
user, is bench.py's docstring (the usage); the map of the rows is this package's __init__."""
from __future__ import annotations

import argparse
import contextlib
import math
import os
from pathlib import Path

from errors import ArgumentParser, UserError
from fileio import check_output_not_input, check_writable_dir, no_empty_dirs_left, output_target, file_arg, path_arg
from ownership import check_output
from training.float8 import RECIPES as FLOAT8_RECIPES

from . import nanogpt_own
from .budget import check_configs
from .suite import measure

# --help's description: what the command does (its usage: bench.py's docstring)
DESCRIPTION = ("One command, one table: this project's training step, decoding and data preparation against plain "
               "nanoGPT-style baselines, measured side by side in one process. The measuring lives in benchmarks/ "
               "(see its __init__ for the map).")

SECTIONS = ("train", "muon", "decode", "prepare", "loss")  # what runs by default
# asked for by name: minutes of training; a profile of the CPU step; preparing a generated multi-GB jsonl corpus
# (ours, a Pool + tiktoken script, a resume after a kill); DDP against FSDP on 2 gloo ranks; serve.py under load
EXTRA_SECTIONS = ("budget", "profile", "corpus", "fsdp", "serve")


# (least, most) of every count option. No warm-up and no RSS row (0) are meaningful, the rest not; the
# upper bounds are far past any useful run (hours at most), so a typo of a few zeros more is refused
# instead of running for ever. 2**20 tokens a corpus shard: 16k files at most for the largest corpus.
COUNT_BOUNDS = {"warmup": (0, 10_000), "iters": (1, 100_000), "rounds": (1, 1_000), "repeats": (1, 1_000),
                "new_tokens": (1, 1024), "prompt_len": (1, 1024), "loss_steps": (1, 100_000), "loss_noise_runs": (0, 16),
                "prepare_rss_mb": (0, 1 << 16), "corpus_mb": (1, 1 << 16), "corpus_shard_tokens": (1 << 20, 1 << 40),
                "corpus_procs": (0, 1024)}
DECODE_CONTEXT = 1024  # the decode rows' model is GPT-2 124M
MAX_SECONDS = 1e6  # --budget-s: eleven days
MAX_LISTED = 1 << 20  # a batch size, a vocabulary, a chunk of rows in --batch-sizes, --vocabs, --loss-chunks


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python bench.py", description=DESCRIPTION)
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    p.add_argument("--only", action="append", choices=SECTIONS + EXTRA_SECTIONS,
                   help="run only these sections (repeatable); 'budget', 'profile', 'corpus', 'fsdp' and 'serve' run "
                   "only when named here")
    p.add_argument("--skip", action="append", default=[], choices=SECTIONS, help="leave a section out (repeatable)")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny shapes, a few steps; the figures mean nothing")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile ours and the GPU baseline (default: on for CUDA, off on a CPU)")
    p.add_argument("--batch-sizes", default="16,max", help="CUDA: micro-batches of the GPT-2 rows; 'max' = the "
                   "largest that fits (default: %(default)s)")
    p.add_argument("--vocabs", default="50304,50257", help="CUDA: vocab sizes of the GPT-2 rows (default: %(default)s)")
    p.add_argument("--float8", default="", help="CUDA: also time ours with train.float8 set to these recipes, e.g. "
                   "tensorwise,rowwise (torchao; compute capability 8.9+)")
    p.add_argument("--loss-paths", action="store_true", help="also time ours with the loss path this device does not choose")
    p.add_argument("--loss-chunks", default="", help="CPU: also time ours with the fused loss in chunks of these row "
                   "counts, e.g. 64,256 (the default comes from runtime/loss_path.py's CHUNK_BYTES)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps per variant (default 5; quick 2)")
    p.add_argument("--iters", type=int, default=None, help="timed steps per variant (default 30; quick 3)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds the timed steps are split into")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per decode/prepare row (default 3; quick 1)")
    p.add_argument("--new-tokens", type=int, default=None, help="decode: new tokens (default 128; quick 8)")
    p.add_argument("--prompt-len", type=int, default=16, help="decode: prompt tokens (default %(default)s)")
    p.add_argument("--no-hf", action="store_true", help="decode: leave out transformers' generate")
    p.add_argument("--loss-steps", type=int, default=None, help="steps of the same-loss check (default 200; quick 5)")
    p.add_argument("--loss-tol", type=float, default=0.02, help="same-loss tolerance in nats (default %(default)s)")
    p.add_argument("--loss-noise-runs", type=int, default=None, help="same-loss check: the baseline run again this many "
                   "times, its spread beside ours (default 1 on a GPU, 0 on a CPU, where runs are bitwise equal)")
    p.add_argument("--loss-deterministic", action="store_true", help="same-loss check: torch's deterministic "
                   "algorithms (and cuBLAS's fixed workspace, for the whole process: use it with --only loss): runs on "
                   "a GPU then differ only where the math does")
    p.add_argument("--prepare-rss-mb", type=int, default=0, help="also prepare a synthetic source of this many MB "
                   "and report its peak RSS (default: off)")
    p.add_argument("--corpus-mb", type=int, default=4096, help="corpus: size of the generated jsonl corpus in MB "
                   "(default: %(default)s)")
    p.add_argument("--corpus-shard-tokens", type=int, default=100_000_000, help="corpus: tokens per shard, both "
                   "preparations (default: %(default)s; a resume keeps finished shards)")
    p.add_argument("--corpus-procs", type=int, default=0, help="corpus: processes for both preparations (0 = one per core)")
    p.add_argument("--budget-s", type=float, default=None, help="budget: W in seconds instead of measuring it "
                   "with nanoGPT's CPU recipe")
    p.add_argument("--budget-configs", default="shakespeare_char,shakespeare_char_modern,small,small_modern",
                   help="budget: the configs to run (default: %(default)s)")
    p.add_argument("--nanogpt-dir", default=None, type=path_arg, help="CPU: a checkout of karpathy/nanoGPT; after the train "
                   "section its own train.py runs the BPE shape's recipe (100 steps) and the BPE rows are compared "
                   "with its per-iteration time (benchmarks/nanogpt_own.py)")
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    p.add_argument("--isa-avx2", action="store_true", help="after the native run, run the same sections again in a "
                   "child process under ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 (the AVX2-only class, "
                   "emulated) and print both reports")
    p.add_argument("--json", default=None, type=file_arg, help="also write the results to this file")
    return p


def parse_args(argv=None, made: contextlib.ExitStack | None = None) -> argparse.Namespace:
    """The checked arguments; `made`, where given, removes the --json's folder this makes if the run leaves it
    empty (refused, or failed)."""
    args = build_parser().parse_args(argv)
    q = args.quick
    for k, v in dict(warmup=2 if q else 5, iters=3 if q else 30, repeats=1 if q else 3, new_tokens=8 if q else 128,
                     loss_steps=5 if q else 200).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    for k, (least, most) in COUNT_BOUNDS.items():  # every count bounded: each row's work is, before any is built
        if getattr(args, k) is None:  # decided later by the device (--loss-noise-runs)
            continue
        if getattr(args, k) < least:
            raise UserError(f"--{k.replace('_', '-')} must be >= {least}, got {getattr(args, k)}")
        if getattr(args, k) > most:
            raise UserError(f"--{k.replace('_', '-')} must be at most {most}, got {getattr(args, k)}")
    if args.prompt_len + args.new_tokens > DECODE_CONTEXT:
        raise UserError(f"--prompt-len + --new-tokens must be at most {DECODE_CONTEXT} (GPT-2's context, past which "
                        f"HF's generate fails), got {args.prompt_len} + {args.new_tokens}")
    for k in ("loss_tol", "budget_s"):  # argparse's float() takes nan and inf, which no comparison refuses
        value = getattr(args, k)
        if value is not None and not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
            raise UserError(f"--{k.replace('_', '-')} must be a positive, finite number, got {value} (at most "
                            f"{MAX_SECONDS:g})")
    args.batch_size_list = _positive_ints(args.batch_sizes, "--batch-sizes", also=("max",))
    if args.batch_size_list[0] == "max":
        raise UserError("--batch-sizes: 'max' needs a numeric batch size before it, e.g. 16,max")
    args.vocab_list = _positive_ints(args.vocabs, "--vocabs")
    args.budget_config_list = check_configs(args.budget_configs.split(","), "--budget-configs")
    try:
        args.loss_chunk_sizes = tuple(int(n) for n in args.loss_chunks.split(",") if n.strip())
    except ValueError:
        args.loss_chunk_sizes = (0,)
    if any(not 1 <= n <= MAX_LISTED for n in args.loss_chunk_sizes):
        raise UserError(f"--loss-chunks must be positive row counts separated by commas, e.g. 64,256; got {args.loss_chunks!r}")
    args.float8_recipes = tuple(r.strip() for r in args.float8.split(",") if r.strip())
    if any(r not in FLOAT8_RECIPES for r in args.float8_recipes):
        raise UserError(f"--float8 takes recipes from {', '.join(FLOAT8_RECIPES)} separated by commas, got {args.float8!r}")
    args.sections = [s for s in (args.only or SECTIONS) if s not in args.skip]
    cores = os.cpu_count() or 1
    if not 0 <= args.threads <= cores:  # torch segfaults on 100000 threads
        raise UserError(f"--threads must be 0 (torch's default) or 1..{cores} (this machine's cores), got {args.threads}")
    if args.json:  # checked now, not after minutes of measuring; never over what the run reads
        if made is not None:  # the folder as given ("new/../x.json" makes new), and a link's target's
            for folder in {Path(args.json).parent, Path(os.path.realpath(args.json)).parent}:
                made.enter_context(no_empty_dirs_left(folder))
        check_json_path(Path(args.json))
        read = [(f"the config {c}", c) for c in args.budget_config_list if Path(c).is_file()]
        check_output_not_input(Path(args.json), [*read, ("the nanoGPT checkout", args.nanogpt_dir or "")], "--json")
    if args.nanogpt_dir:
        if "train" not in args.sections:
            raise UserError("--nanogpt-dir compares nanoGPT's own train.py with the train section's BPE rows; "
                            "add --only train")
        nanogpt_own.check_dir(Path(args.nanogpt_dir))
    return args


def _positive_ints(text: str, option: str, also: tuple[str, ...] = ()) -> list:
    """A comma-separated list of positive integers up to MAX_LISTED (and the words in `also`), or a one-line
    UserError."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    words = " or ".join(["positive integers", *(repr(w) for w in also)])
    if not items or any(t not in also and not (t.isascii() and t.isdigit() and 0 < int(t) <= MAX_LISTED) for t in items):
        raise UserError(f"{option} takes {words} separated by commas (each at most {MAX_LISTED}), got {text!r}")
    return [t if t in also else int(t) for t in items]


def check_json_path(path: Path) -> None:
    check_output(path, "--json")  # the gate: in no folder another command manages (an out_dir, prepared data)
    if path.is_dir():
        raise UserError(f"--json {path} is a directory; name a file, e.g. {path / 'bench.json'}")
    target, straight = output_target(path, "--json")  # a device or a FIFO is written straight into
    if not straight:
        check_writable_dir(target.parent if str(target.parent) else Path("."), "--json's folder")


def main(argv=None) -> int:
    with contextlib.ExitStack() as made:
        return measure(parse_args(argv, made), argv)
