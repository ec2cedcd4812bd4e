"""The benchmark's run, for `python bench.py` (its options: benchmarks/cli.py): every section asked for, in
one process and one temp folder, its rows printed as they come and written to --json at the end; the targets
read from the rows; under --isa-avx2 the same sections again in a child process."""
from __future__ import annotations

import argparse
import contextlib
import json
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

from data import DataConfig, prepare_data
from errors import UserError, no_deterministic_algorithm, short_error
from fileio import _start_time, atomic_write_bytes
from locks import pid_alive
from runtime.device import resolve_device, use_device
from runtime.precision import cpu_native_bf16, dtype_name, training_dtype
from training.float8 import check_float8
from training.report.mfu import peak_flops

from . import nanogpt_own
from .budget import bench_budget
from .decode import bench_decode
from .fsdp import bench_fsdp
from .machine import CoreUse, cpu_busy_fraction, cpu_info, gpu_info
from .muon import muon_vs_adamw
from .prepare import bench_corpus, bench_prepare, prepare_peak_rss
from .profile import profile_step
from .report import print_report
from .serve import bench_serve
from .timing import peak_rss_mb
from .train import (
    CPU_SHAPES, GPT2_124M, QUICK_GPU, auto_dtype_for, bench_shape, largest_batch, loss_check, ours_step,
    random_batches, reference_weights, with_batch,
)

ROOT = Path(__file__).resolve().parents[1]

# the AVX2-only class (AMD Zen 3, most laptops) emulated on any x86: oneDNN and ATen kernels capped at AVX2,
# and oneDNN then reports no native bf16 (set before torch is imported, so in a child process)
AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
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
            was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
            # Not warn_only: under it SDPA's cuDNN and flash backwards keep their atomic adds (the H100, 2026-11-28:
            # the baseline's own re-run parted from it at step 1 with the warning printed); strict, they take their
            # deterministic algorithms, and an op that has none is refused in one line
            torch.use_deterministic_algorithms(args.loss_deterministic or was,
                                               warn_only=not args.loss_deterministic and was_warn)
            try:
                report["loss_check"] = loss_check(
                    shape, device=device, dtype=auto_dtype if cuda else None, compiled=compile_, steps=args.loss_steps,
                    eval_batches=2 if args.quick else 20, data_dir=data_dir, tolerance=args.loss_tol, say=say,
                    noise_runs=(1 if cuda else 0) if args.loss_noise_runs is None else args.loss_noise_runs)
            except RuntimeError as e:
                if not (args.loss_deterministic and no_deterministic_algorithm(e)):
                    raise
                raise UserError(f"--loss-deterministic: {short_error(e)} (run the check without "
                                f"--loss-deterministic)") from None
            finally:
                torch.use_deterministic_algorithms(was, warn_only=was_warn)

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
    r = subprocess.run([sys.executable, str(ROOT / "bench.py"), *child, "--json", str(out)],
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
