"""One command, one table: this project's training step, decoding and data preparation against plain
nanoGPT-style baselines, measured side by side in one process. The measuring lives in benchmarks/
(see its __init__ for the map); this file parses the options and prints the report.

    python bench.py                                    # CPU: everything (~5 min on a quiet 2-core CPU)
    python bench.py --device cuda                      # GPU: GPT-2 124M rows, decode, same-loss check
    python bench.py --json benchmarks/results/results-cpu.json # also write the results as JSON
    python bench.py --only budget                      # quality in nanoGPT's time (minutes)
    python bench.py --only profile                     # where a CPU training step's time goes
    python bench.py --only fsdp                        # DDP vs FSDP: 2 gloo ranks, ~95M params, RSS and step time
    python bench.py --only serve                       # python serve.py under 1 and 8 streaming clients
    python bench.py --compile                          # add torch.compile rows on a CPU
    python bench.py --quick                            # smoke run: seconds, figures meaningless
    python bench.py --only train --only muon --isa-avx2  # also re-run them as on an AVX2-only CPU

Offline, point tiktoken and tiny shakespeare at local copies first:

    export TIKTOKEN_CACHE_DIR=../shared/tiktoken_cache SMALLGPT_SHAKESPEARE=../shared/data/tinyshakespeare/input.txt

Not a test: nothing asserts a speed. On a shared machine every figure is low; the ratios hold better.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.budget import bench_budget, check_configs
from benchmarks.decode import bench_decode
from benchmarks.fsdp import bench_fsdp
from benchmarks import nanogpt_own
from benchmarks.muon import muon_vs_adamw
from benchmarks.machine import CoreUse, cpu_busy_fraction, cpu_info, gpu_info
from benchmarks.prepare import bench_corpus, bench_prepare, prepare_peak_rss
from benchmarks.profile import profile_step
from benchmarks.serve import bench_serve
from benchmarks.report import print_report
from benchmarks.timing import peak_rss_mb
from benchmarks.train import (
    CPU_SHAPES, GPT2_124M, QUICK_GPU, auto_dtype_for, bench_shape, largest_batch, loss_check, ours_step,
    random_batches, reference_weights, with_batch,
)
from data import DataConfig, prepare_data
from errors import ArgumentParser, UserError, run_cli, short_error
from fileio import (_start_time, atomic_write_bytes, check_output_not_input, check_writable_dir, no_empty_dirs_left,
                    output_target, path_arg)
from ownership import check_output
from locks import pid_alive
from runtime.device import resolve_device, use_device
from runtime.precision import cpu_native_bf16, dtype_name, training_dtype
from training.float8 import RECIPES as FLOAT8_RECIPES, check_float8
from training.report.mfu import peak_flops

SECTIONS = ("train", "muon", "decode", "prepare", "loss")  # what runs by default
# the AVX2-only class (AMD Zen 3, most laptops) emulated on any x86: oneDNN and ATen kernels capped at AVX2,
# and oneDNN then reports no native bf16 (set before torch is imported, so in a child process)
AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
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
    p = ArgumentParser(prog="python bench.py", description=__doc__.split("\n\n")[0])
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
    p.add_argument("--json", default=None, type=path_arg, help="also write the results to this file")
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


TEMP_PREFIX = "smallgpt-bench-"


def remove_stale_bench_dirs() -> None:
    """Remove the temp folders of bench runs killed before they could clean up (`smallgpt-bench-<pid>-<start>-*`
    whose process is gone): an interrupted bench leaves nothing behind for long."""
    for path in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*-*"):
        parts = path.name[len(TEMP_PREFIX):].split("-")
        if len(parts) >= 3 and parts[0].isdigit() and not pid_alive(int(parts[0]), parts[1] if parts[1] != "0" else None):
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def bench_temp_dir():
    """A temp folder removed on every exit, SIGTERM and SIGHUP included (turned into KeyboardInterrupt
    here, as Ctrl-C is); its name carries this process's pid and start time for remove_stale_bench_dirs."""
    def stop(signum, frame):
        raise KeyboardInterrupt
    saved = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        remove_stale_bench_dirs()
        me = f"{os.getpid()}-{_start_time(os.getpid()) or 0}-"
        with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX + me) as tmp:
            yield tmp
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def say(msg: str) -> None:
    """Progress, on stderr (with seconds since start): stdout holds only the report."""
    print(f"[{time.perf_counter() - _T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


_T0 = time.perf_counter()


def main(argv=None) -> int:
    with contextlib.ExitStack() as made:
        return measure(parse_args(argv, made), argv)


def measure(args: argparse.Namespace, argv=None) -> int:
    """Every section asked for, its rows printed as they come and written to --json at the end (`argv`: to run
    again under --isa-avx2's variables)."""
    t_start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.loss_deterministic:  # read when cuBLAS makes its handle, at the first matmul: before any
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    device = resolve_device(args.device, option="--device")
    cuda = device.type == "cuda"
    for recipe in args.float8_recipes:  # one line now, not after minutes of other rows
        check_float8(recipe, device, option="--float8")
    if cuda and args.nanogpt_dir:
        raise UserError("--nanogpt-dir times nanoGPT's CPU recipe; add --device cpu")
    if cuda and "profile" in args.sections:  # refused before any other section spends minutes
        raise UserError("--only profile profiles the CPU training step; on a GPU use --device cpu, or "
                        "torch.profiler with CUDA activity")
    compile_ = cuda if args.compile is None else args.compile
    busy_before = cpu_busy_fraction(0.2 if args.quick else 1.0)
    use = CoreUse()
    machine = cpu_info() | (gpu_info(device) if cuda else {})
    use_device(device)  # train.py's settings; process-wide, so the baseline rows get them too (ratios conservative)

    # the dtypes timed, and the peaks MFU is measured against (on a CPU a matmul probe of each dtype)
    auto_dtype = training_dtype("auto", device)[0]  # on CUDA; on a CPU each shape times its own (below)
    # on a CPU bf16 rows only where bf16 is native: an emulated dtype is never timed (it costs minutes)
    dtypes = ([torch.float32] + ([torch.bfloat16] if cpu_native_bf16() else [])) if not cuda else [auto_dtype]
    peaks, sources = {}, set()
    for dt in dict.fromkeys(dtypes + [torch.float32]):
        peaks[dt], src = peak_flops(device, dt, cache=False)  # probed in this run, like every row
        sources.add(src.split("(", 1)[-1].rstrip(")"))
    report: dict = {"settings": {k: v for k, v in vars(args).items() if k != "json"}, "machine": machine, "rows": [],
                    "notes": [], "dtype_auto": {},
                    "peak_flops": {dtype_name(k): v for k, v in peaks.items()}, "peak_source": "; ".join(sorted(sources))}
    timing = dict(warmup=args.warmup, iters=args.iters, rounds=args.rounds, say=say)

    with bench_temp_dir() as tmp:
        if "train" in args.sections:
            if cuda:
                bench_gpu_train(args, device, auto_dtype, compile_, peaks, report, timing)
            else:
                for shape in CPU_SHAPES:
                    rows, report["dtype_auto"][shape.label] = bench_shape(
                        shape, device=device, dtypes=dtypes, compiled=[False] + ([True] if compile_ else []),
                        peaks=peaks, other_loss_path=args.loss_paths, loss_chunks=args.loss_chunk_sizes, **timing)
                    report["rows"] += rows
        if args.nanogpt_dir:  # right after our rows, in the same environment
            report["nanogpt_own"] = nanogpt_own.step_ms(Path(args.nanogpt_dir), Path(tmp) / "nanogpt-out", say,
                                                        threads=args.threads or None)
            bpe = CPU_SHAPES[0]  # what no step of that shape can beat: its LM head's three products alone
            report["nanogpt_own"]["head_floor"] = nanogpt_own.head_products_floor(
                bpe.batch_size * bpe.block_size, bpe.n_embd, bpe.vocab_size, calls=2 if args.quick else 5)
        if "muon" in args.sections:
            rows, report["muon"] = muon_vs_adamw(device, quick=args.quick, **timing)
            report["rows"] += rows
        if "decode" in args.sections:
            rows, info = bench_decode(device=device, quick=args.quick, repeats=args.repeats, new_tokens=args.new_tokens,
                                      prompt_len=args.prompt_len, use_hf=not args.no_hf and not args.quick,
                                      compile=compile_, say=say)
            report["rows"] += rows
            report["decode"] = info
        data_dir = None
        if "prepare" in args.sections:
            try:
                rows, report["prepare"], data_dir = bench_prepare(Path(tmp), args.repeats, say)
                report["rows"] += rows
                if args.prepare_rss_mb:
                    report["prepare_rss"] = prepare_peak_rss(Path(tmp), args.prepare_rss_mb, say)
            except UserError as e:  # no tiny shakespeare or tiktoken files here
                report["notes"].append(f"prepare skipped: {e}")
        if "loss" in args.sections:
            if data_dir is None:
                with contextlib.suppress(UserError):
                    data_dir = prepare_data(DataConfig(root=str(Path(tmp) / "loss")), progress=False)
            shape = (QUICK_GPU if args.quick else GPT2_124M) if cuda else CPU_SHAPES[0]
            was = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms(args.loss_deterministic or was, warn_only=True)  # warn: ops without run
            try:
                report["loss_check"] = loss_check(
                    shape, device=device, dtype=auto_dtype if cuda else None, compiled=compile_, steps=args.loss_steps,
                    eval_batches=2 if args.quick else 20, data_dir=data_dir, tolerance=args.loss_tol, say=say,
                    noise_runs=(1 if cuda else 0) if args.loss_noise_runs is None else args.loss_noise_runs)
            finally:
                torch.use_deterministic_algorithms(was)

        if "corpus" in args.sections:
            procs = args.corpus_procs or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                          else os.cpu_count() or 1)
            rows, report["corpus"] = bench_corpus(Path(tmp), args.corpus_mb, procs, args.corpus_shard_tokens, say)
            report["rows"] += rows
        if "profile" in args.sections:
            for shape in CPU_SHAPES:
                report.setdefault("profile", {})[shape.label] = profile_shape(shape, device, say)
        if "fsdp" in args.sections:
            report["fsdp"] = bench_fsdp(quick=args.quick, warmup=args.warmup, iters=args.iters, say=say)
        if "serve" in args.sections:
            report["serve"] = bench_serve(device=device, quick=args.quick, repeats=args.repeats,
                                          threads=args.threads or None, say=say)
        if "budget" in args.sections:
            report["budget"] = bench_budget(args.budget_config_list, Path(tmp), device, args.budget_s, say)

    report.update(busy={"before": busy_before, "during_others": use.others_fraction(),
                        "after": cpu_busy_fraction(0.2 if args.quick else 1.0)},
                  peak_rss_mb=peak_rss_mb(), wall_s=time.perf_counter() - t_start)
    report["targets"] = targets(report)
    print_report(report)
    if args.isa_avx2:
        report["isa_avx2"] = run_under_avx2(argv if argv is not None else sys.argv[1:], Path(tempfile.mkdtemp()))
    if args.json:
        try:
            atomic_write_bytes(Path(args.json), (json.dumps(report, indent=2, default=str) + "\n").encode(), "--json",
                               follow=True)
        except OSError as e:
            raise UserError(f"cannot write --json {args.json} ({short_error(e)}); the report is printed above") from None
    return 0


def targets(report: dict) -> dict:
    """Issue 20's targets, from the rows of this run: the BPE fp32 step's MFU against the fp32 matmul
    probe (>= 65%) and its speed-up over nanoGPT's loop (>= 2.0x), and over nanoGPT's own train.py where
    --nanogpt-dir ran it (also for the dtype `auto` picks); a Muon step against an AdamW step (<= 1.5x
    without native bf16, <= 1.3x with it)."""
    out = {}
    own = report.get("nanogpt_own", {}).get("median_ms")
    for r in report["rows"]:
        # the first such row: the loss path train.py takes (the --loss-chunks variants come after it)
        if r["section"] == "BPE train" and r["precision"] == "float32" and not r.get("compiled") and "bpe_fp32" not in out:
            out["bpe_fp32"] = {"mfu": r.get("ours_mfu"), "mfu_target": 0.65, "speedup": r["speedup"],
                               "speedup_target": 2.0}
            if own:
                out["bpe_fp32"]["speedup_own"] = own / r["ours"]
                floor = report["nanogpt_own"].get("head_floor", {}).get("total_ms")
                if floor:  # what 2.0x leaves beside the LM head's products, and what the rest takes in ours
                    out["bpe_fp32"]["head_floor"] = {"needed_ms": own / 2.0, "head_ms": floor,
                                                     "left_ms": own / 2.0 - floor, "rest_ms": r["ours"] - floor}
        # the row train.py's `auto` runs: the first in its dtype, eager, on the loss path it picks
        if r["section"] == "BPE train" and r.get("auto") and not r.get("compiled") and own and "bpe_auto" not in out:
            out["bpe_auto"] = {"precision": r["precision"], "speedup_own": own / r["ours"]}
    if "muon" in report:
        out["muon"] = {"ratio": report["muon"]["ratio"], "target": report["muon"]["target"]}
    return out


def run_under_avx2(argv: list[str], tmp: Path) -> dict | None:
    """The same bench.py command in a child process with AVX2_ENV; its report printed after ours.
    Returns its JSON report (None where it failed)."""
    child = [a for a in argv if a != "--isa-avx2"]
    if "--json" in child:  # the child writes its own JSON where we read it
        i = child.index("--json")
        del child[i:i + 2]
    child = [a for a in child if not a.startswith("--json=")]
    out = tmp / "avx2.json"
    say("[isa-avx2] the same sections again under " + " ".join(f"{k}={v}" for k, v in AVX2_ENV.items()))
    print("\n" + "=" * 100 + "\nunder " + " ".join(f"{k}={v}" for k, v in AVX2_ENV.items())
          + " (the AVX2-only class, EMULATED on this CPU: other kernels than a real AVX2 machine's may run)\n", flush=True)
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), *child, "--json", str(out)],
                       env={**os.environ, **AVX2_ENV})
    if r.returncode or not out.exists():
        print(f"note: the AVX2 run failed (exit status {r.returncode})")
        return None
    return json.loads(out.read_text())


def bench_gpu_train(args, device, auto_dtype, compile_: bool, peaks: dict, report: dict, timing: dict) -> None:
    """The GPT-2 124M rows: each vocab at each micro-batch; 'max' is estimated from the first batch's
    peak memory and then run."""
    base_shape = QUICK_GPU if args.quick else GPT2_124M
    vocabs = args.vocab_list if not args.quick else [base_shape.vocab_size]
    for vocab in vocabs:
        shape = replace(base_shape, vocab_size=vocab)
        done: list[dict] = []
        for size in args.batch_size_list:  # checked by parse_args: 'max' comes after a number
            if size == "max":
                b = largest_batch(done, shape, device)
                report["largest_batch"] = {"batch": b, "from_batch": done[0]["batch"], "headroom": 0.9}
            else:
                b = size
            rows, report["dtype_auto"][shape.label] = bench_shape(
                with_batch(shape, b), device=device, dtypes=[auto_dtype], compiled=[compile_], peaks=peaks,
                other_loss_path=args.loss_paths, float8=args.float8_recipes, **timing)
            report["rows"] += rows
            done += rows
            torch.cuda.empty_cache()


def profile_shape(shape, device, say) -> dict:
    """The profile of ours in the dtype train.py's dtype=auto picks for this shape."""
    weights, batches = reference_weights(shape), random_batches(shape, device)
    dtype = auto_dtype_for(shape, weights, device, batches[0])[0]
    say(f"[profile] {shape.label}, ours in {dtype_name(dtype)}: 3 warm-up + 10 profiled steps")
    step = ours_step(shape, weights, device, dtype, False, lambda i: batches[i % len(batches)])
    return profile_step(step, shape.vocab_size) | {"dtype": dtype_name(dtype)}


if __name__ == "__main__":
    run_cli(main)
