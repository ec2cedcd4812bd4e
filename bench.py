"""One command, one table: this project's training, decoding and data preparation against a plain
nanoGPT-style PyTorch baseline, measured side by side in one process.

    python bench.py                                    # everything (~4 min on a quiet 2-core CPU)
    python bench.py --json benchmarks/results-cpu.json # also write the results as JSON
    python bench.py --compile                          # add torch.compile rows (slow to compile on a CPU)
    python bench.py --quick --no-loss-check            # smoke run: a few seconds, figures meaningless

Offline (no network), point tiktoken and the tiny shakespeare source at local copies first:

    export TIKTOKEN_CACHE_DIR=../shared/tiktoken_cache SMALLGPT_SHAKESPEARE=../shared/data/tinyshakespeare/input.txt

The plain baseline (the "base" columns) is what a nanoGPT-style loop does: fp32, eager, no compile,
`attn_backend="manual"` (the textbook softmax(QK^T)V), the unfused loss (`model(x, y)`: full
(B, T, V) logits, then F.cross_entropy) and torch's default AdamW (neither fused nor foreach on a
CPU: the per-parameter loop; foreach on CUDA). "Ours" is the project's training path: SDPA, the fused
chunked LM-head loss (`return_logits=False`), fused AdamW (training.optim.make_optimizer) and the
precision train.py's dtype=auto picks (training.precision.resolve_dtype); the other precision is
shown for information. Both clip the gradient norm to 1.0, as train.py and nanoGPT do.

Timing: W warm-up steps per variant, then N timed steps per variant in R rounds; each round runs
every variant for N/R steps, in a rotated order, so a noisy neighbour slows all variants alike.
Figures are medians. MFU = model.flops_per_token(T) x tokens/s over the device peak: on a CPU the
1024^3 matmul probe of training/precision.py, taken at the start of this run (fp32 peak for fp32
rows, bf16-autocast peak for bf16 rows); on CUDA the table in training/mfu.py.
Not a test: nothing asserts a speed. On a shared machine every figure is low; the ratios hold better.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.bench_decode import (  # noqa: E402
    cpu_busy_fraction, hf_runner, make_decode_models, ours_runner, uncached_runner,
)
from model import GPT, GPTConfig  # noqa: E402
from training.compile import apply_compile  # noqa: E402
from training.mfu import peak_flops  # noqa: E402
from training.optim import make_optimizer, param_groups  # noqa: E402
from training.precision import allow_tf32, autocast, make_scaler, resolve_dtype  # noqa: E402

# the training shapes of issue 6 (nanoGPT's CPU recipe): 4 layers, 4 heads, 128 wide, block 64, batch 12
TRAIN_SHAPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0)
BATCH_SIZE = 12
TRAIN_CONFIGS = (("BPE train", 50257), ("char train", 65))
LR, WEIGHT_DECAY, BETAS, GRAD_CLIP = 1e-3, 0.1, (0.9, 0.99), 1.0  # training/config.py's defaults
DECODE_SHAPE: dict = {}  # GPTConfig's defaults: GPT-2-124M
QUICK_DECODE_SHAPE = dict(n_layer=2, n_head=2, n_embd=64)  # --quick: a tiny model with GPT-2's vocab
SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 2 warm-up + 3 timed steps in 3 rounds, a tiny decode model with 8 new tokens, "
                        "no HF, 5 loss-check steps (the figures mean nothing)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps per variant (default 5; quick 2)")
    p.add_argument("--iters", type=int, default=None, help="timed steps per variant (default 30; quick 3)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds the timed steps are split into (default 3)")
    p.add_argument("--decode-repeats", type=int, default=None, help="timed generate calls per decode variant (default 3; quick 1)")
    p.add_argument("--new-tokens", type=int, default=None, help="decode: new tokens (default 128; quick 8)")
    p.add_argument("--prompt-len", type=int, default=16, help="decode: prompt tokens (default %(default)s)")
    p.add_argument("--loss-steps", type=int, default=None, help="steps of the same-loss check (default 200; quick 5)")
    p.add_argument("--loss-tol", type=float, default=0.02,
                   help="the same-loss check passes when |val loss ours - baseline| <= this (default %(default)s nats)")
    p.add_argument("--no-loss-check", action="store_true", help="skip the same-loss-after-N-steps check")
    p.add_argument("--compile", action="store_true", help="add rows with the model torch.compile'd (ours, auto dtype)")
    p.add_argument("--no-hf", action="store_true", help="decode: skip transformers' generate")
    p.add_argument("--skip", action="append", default=[], choices=["bpe", "char", "decode", "prepare"],
                   help="leave a section out (repeatable)")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    q = args.quick
    defaults = dict(warmup=2 if q else 5, iters=3 if q else 30, rounds=3, decode_repeats=1 if q else 3,
                    new_tokens=8 if q else 128, loss_steps=5 if q else 200)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    for k in ("warmup", "iters", "rounds", "decode_repeats", "new_tokens", "prompt_len", "loss_steps"):
        if getattr(args, k) < (0 if k == "warmup" else 1):
            p.error(f"--{k.replace('_', '-')} must be >= {0 if k == 'warmup' else 1}, got {getattr(args, k)}")
    args.rounds = min(args.rounds, args.iters)
    if q:
        args.no_hf = True
    return args


_T0 = time.perf_counter()


def say(msg: str) -> None:
    """Progress, on stderr (with seconds since start): stdout holds only the report."""
    print(f"[{time.perf_counter() - _T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ machine

def cpu_info() -> dict:
    """CPU model, core counts, torch version and threads, and the CPU's AMX / AVX512-BF16 flags."""
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model is None:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu": model, "cores": os.cpu_count(), "usable_cores": usable, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "amx": any(fl.startswith("amx") for fl in flags), "avx512_bf16": "avx512_bf16" in flags,
        "flags_known": bool(flags),
    }


class CoreUse:
    """How much CPU other processes used while this one ran: /proc/stat's busy time of all cores minus
    this process's own CPU time, over the cores' total time."""

    def __init__(self):
        self.start = self._read()

    @staticmethod
    def _read():
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except OSError:
            return None
        hz = os.sysconf("SC_CLK_TCK")
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        own_s = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
        total = sum(fields[:8]) / hz  # user nice system idle iowait irq softirq steal
        idle = (fields[3] + fields[4]) / hz
        return total, idle, own_s

    def others_fraction(self) -> float | None:
        end = self._read()
        if self.start is None or end is None:
            return None
        total, idle, own = (e - s for e, s in zip(end, self.start))
        return max(0.0, min(1.0, (total - idle - own) / max(total, 1e-9)))


# ------------------------------------------------------------------------------------------ timing

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Variant:
    name: str  # row label
    step: Callable[[int], None]  # one timed unit of work (a training step, a generate call, a prepare)
    times: list[float] = field(default_factory=list)
    first: float | None = None  # the first warm-up call (compile time for compiled variants)
    peak_mb: float | None = None  # how far one warm-up call raised the process's peak RSS (Linux)


def _rss_kb(key: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


_peak_rss_kb = 0.0  # the process's peak RSS before the last reset of the kernel's mark


def _reset_peak_rss() -> float | None:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS and return that RSS in KiB; None
    where /proc/self/clear_refs is not available (non-Linux, old kernels). The reset also resets
    getrusage's ru_maxrss, so the peak so far is kept here first (see peak_rss_mb)."""
    global _peak_rss_kb
    _peak_rss_kb = max(_peak_rss_kb, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _rss_kb("VmRSS")


def peak_rss_mb() -> float:
    """Peak RSS of this process over the whole run, in MB (Linux reports KiB)."""
    return max(_peak_rss_kb, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


def run_interleaved(variants: list[Variant], warmup: int, iters: int, rounds: int, device: torch.device) -> None:
    """Warm each variant up, then time `iters` calls of each, split into `rounds` blocks per variant,
    the variants' order rotating every round. Fills each variant's times (seconds per call)."""
    def timed(v: Variant, i: int) -> float:
        _sync(device)
        t0 = time.perf_counter()
        v.step(i)
        _sync(device)
        return time.perf_counter() - t0

    for v in variants:
        for i in range(warmup):
            measure = i == min(1, warmup - 1)  # the second warm-up call: steady state (optimizer state exists)
            before = _reset_peak_rss() if measure else None
            dt = timed(v, i)
            v.first = dt if v.first is None else v.first
            if measure and before is not None:
                v.peak_mb = max(0.0, _rss_kb("VmHWM") - before) / 1024
    sizes = [iters // rounds + (r < iters % rounds) for r in range(rounds)]
    for r, size in enumerate(sizes):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            for _ in range(size):
                v.times.append(timed(v, len(v.times)))


def median(xs: list[float]) -> float:
    return statistics.median(xs)


# ------------------------------------------------------------------------------------------ training

@contextlib.contextmanager
def tf32(device: torch.device, enabled: bool):
    """TF32 for ours on CUDA (train.py turns it on); the plain baseline runs true fp32."""
    if device.type != "cuda":
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if enabled:
        allow_tf32(device)
    else:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def make_pair_models(vocab: int, device: torch.device, seed: int = 1337) -> tuple[GPT, Callable[[str], GPT]]:
    """(reference init, make(backend) -> a fresh model with exactly those weights and that attention)."""
    torch.manual_seed(seed)
    ref = GPT(GPTConfig(vocab_size=vocab, attn_backend="manual", **TRAIN_SHAPE))
    state = ref.state_dict()

    def make(backend: str) -> GPT:
        m = GPT(GPTConfig(vocab_size=vocab, attn_backend=backend, **TRAIN_SHAPE))
        m.load_state_dict(state)
        return m.to(device).train()
    return ref, make


def baseline_optimizer(model: GPT) -> torch.optim.AdamW:
    """torch's default AdamW (nanoGPT on a CPU): the same parameter groups as ours, no fused/foreach flag."""
    return torch.optim.AdamW(param_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS)


def our_optimizer(model: GPT, device: torch.device) -> torch.optim.AdamW:
    return make_optimizer(model, lr=LR, weight_decay=WEIGHT_DECAY, betas=BETAS, device_type=device.type)


def train_step_fn(model, raw_model: GPT, opt, dtype: torch.dtype, fused_loss: bool, device: torch.device,
                  get_batch: Callable[[int], tuple], ours: bool) -> Callable[[int], torch.Tensor]:
    """step(i) -> the (detached) loss of one training step on get_batch(i): forward, backward, clip,
    AdamW step, zero_grad. No host sync: the loss stays a tensor. Ours goes through a GradScaler as
    train.py does (enabled for fp16 only; a pass-through otherwise)."""
    params = [p for p in raw_model.parameters() if p.requires_grad]
    scaler = make_scaler(device, dtype) if ours else None

    def step(i: int) -> torch.Tensor:
        x, y = get_batch(i)
        with tf32(device, ours), autocast(device, dtype):
            if fused_loss:
                _, loss = model(x, y, return_logits=False)
            else:
                _, loss = model(x, y)  # full logits, then F.cross_entropy
        if scaler is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def bench_train(label: str, vocab: int, args, device, auto_dtype, peaks: dict, report: dict) -> None:
    """Rows for one training shape: ours in each precision worth having (+ compiled) vs the baseline."""
    B, T = BATCH_SIZE, TRAIN_SHAPE["block_size"]
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):
        d = torch.randint(0, vocab, (B, T + 1), generator=gen)
        batches.append((d[:, :-1].contiguous().to(device), d[:, 1:].contiguous().to(device)))

    def get_batch(i):
        return batches[i % len(batches)]
    ref, make = make_pair_models(vocab, device)
    fpt = ref.flops_per_token(T)
    n_params = ref.num_params(non_embedding=False)
    del ref

    base_model = make("manual")
    variants = [Variant("baseline", train_step_fn(base_model, base_model, baseline_optimizer(base_model),
                                                  torch.float32, False, device, get_batch, ours=False))]
    dtypes = [auto_dtype] + ([d for d in (torch.float32, torch.bfloat16) if d != auto_dtype] if device.type == "cpu" else [])
    kinds = {}
    for dt in dtypes:
        m = make("sdpa")
        name = f"ours {SHORT[dt]}" + (" (auto)" if dt == auto_dtype else "")
        variants.append(Variant(name, train_step_fn(m, m, our_optimizer(m, device), dt, True, device, get_batch, ours=True)))
        kinds[name] = dt
    if args.compile:
        m = make("sdpa")
        name = f"ours {SHORT[auto_dtype]} compiled"
        variants.append(Variant(name, train_step_fn(apply_compile(m, True), m, our_optimizer(m, device), auto_dtype,
                                                    True, device, get_batch, ours=True)))
        kinds[name] = auto_dtype
    say(f"[{label}] vocab {vocab}: {', '.join(v.name for v in variants)}; "
        f"{args.warmup} warm-up + {args.iters} timed steps each, {args.rounds} rounds")
    run_interleaved(variants, max(args.warmup, 2 if args.compile else 0), args.iters, args.rounds, device)

    base = variants[0]
    base_s = median(base.times)
    tokens = B * T
    for v in variants[1:]:
        dt = kinds[v.name]
        s = median(v.times)
        row = {
            "section": label, "name": v.name, "precision": SHORT[dt], "unit": "ms/iter",
            "ours": s * 1e3, "base": base_s * 1e3,
            "ours_tok_s": tokens / s, "base_tok_s": tokens / base_s,
            "ours_flops": fpt * tokens / s, "base_flops": fpt * tokens / base_s,
            "ours_mfu": _mfu(fpt * tokens / s, peaks.get(dt)), "base_mfu": _mfu(fpt * tokens / base_s, peaks.get(torch.float32)),
            "speedup": base_s / s, "ours_step_mb": v.peak_mb, "base_step_mb": base.peak_mb,
            "ours_times_ms": [t * 1e3 for t in v.times], "base_times_ms": [t * 1e3 for t in base.times],
        }
        if "compiled" in v.name:
            row["compile_s"] = v.first
        report["rows"].append(row)
    report["train_shapes"][label] = {"vocab_size": vocab, "batch_size": B, "block_size": T, "params": n_params,
                                     "flops_per_token": fpt, **{k: v for k, v in TRAIN_SHAPE.items() if k != "block_size"}}


def _mfu(flops: float, peak: float | None) -> float | None:
    return flops / peak if peak else None


# ------------------------------------------------------------------------------------------ decode

def bench_decode(args, device, report: dict) -> None:
    """Ours = sample.py's default path on this device (its dtype=auto pick, prepacked bf16 weights on a
    CPU) vs the plain uncached fp32 loop; HF generate (fp32) for information."""
    import copy

    from model.generate import prepack_for_cpu
    from sample import pick_dtype

    shape = QUICK_DECODE_SHAPE if args.quick else DECODE_SHAPE
    model, hf = make_decode_models(use_hf=not args.no_hf, shape=shape)
    model, hf = model.to(device), (hf.to(device) if hf is not None else None)
    n_params = sum(p.numel() for p in model.parameters())
    dtype = pick_dtype("auto", device, n_params)
    ours = copy.deepcopy(model).to(dtype)
    packed = prepack_for_cpu(ours)  # sample.py: `not args.compile and prepack_for_cpu(model)`
    new, P = args.new_tokens, args.prompt_len
    prompt = torch.randint(0, ours.config.vocab_size, (P,), generator=torch.Generator().manual_seed(0)).tolist()

    ours_name = f"ours {SHORT[dtype]}{' prepacked' if packed else ''} (sample.py default)"
    variants = [Variant("baseline", lambda i: uncached_runner(model, prompt, new)(warmup=False)),
                Variant(ours_name, lambda i: ours_runner(ours, prompt, new)(warmup=False))]
    if hf is not None:
        variants.append(Variant("HF generate fp32", lambda i: hf_runner(hf, prompt, new)(warmup=False)))
    # one short warm-up call each (bench_decode's warm-up), then the timed calls, interleaved
    for run in (uncached_runner(model, prompt, new), ours_runner(ours, prompt, new)) + (
            (hf_runner(hf, prompt, new),) if hf is not None else ()):
        run(warmup=True)
    shape_txt = "GPT-2-124M shape" if not shape else "tiny model (--quick)"
    say(f"[decode] {shape_txt}, {n_params / 1e6:.1f}M params, batch 1, prompt {P}, {new} new tokens, greedy: "
        f"{', '.join(v.name for v in variants)}; {args.decode_repeats} call(s) each")
    run_interleaved(variants, 0, args.decode_repeats, args.decode_repeats, device)
    base_s = median(variants[0].times)
    for v in variants[1:]:
        s = median(v.times)
        report["rows"].append({
            "section": "decode", "name": v.name, "precision": SHORT[dtype] if v.name == ours_name else "fp32",
            "unit": "ms/tok", "ours": s / new * 1e3, "base": base_s / new * 1e3,
            "ours_tok_s": new / s, "base_tok_s": new / base_s, "speedup": base_s / s,
            "ours_times_s": v.times, "base_times_s": variants[0].times,
        })
    report["decode"] = {"shape": shape or "GPT-2-124M", "params": n_params, "prompt_len": P, "new_tokens": new,
                        "dtype": SHORT[dtype], "prepacked": packed, "hf": hf is not None}


# ------------------------------------------------------------------------------------------ prepare

def plain_prepare(text_path: Path, out_dir: Path) -> int:
    """nanoGPT's data/shakespeare/prepare.py: first 90% of the characters -> train, the rest -> val,
    each encoded with tiktoken's gpt2 in one call and written as uint16. Returns the token count."""
    import tiktoken

    data = text_path.read_text(encoding="utf-8")
    n = len(data)
    enc = tiktoken.get_encoding("gpt2")
    train_ids = enc.encode_ordinary(data[: int(n * 0.9)])
    val_ids = enc.encode_ordinary(data[int(n * 0.9):])
    np.array(train_ids, dtype=np.uint16).tofile(out_dir / "train.bin")
    np.array(val_ids, dtype=np.uint16).tofile(out_dir / "val.bin")
    return len(train_ids) + len(val_ids)


def bench_prepare(args, device, work: Path, report: dict) -> Path | None:
    """Seconds to turn tiny shakespeare into gpt2 token bins: data.prepare_data (bench_data.time_prepare)
    vs nanoGPT's prepare.py; and the tokenize call alone (bench_data.time_tokenize) vs tiktoken's plain
    encode_ordinary of the whole text. Returns a prepared dir (for the loss check), or None when the
    source or the tokenizer is unavailable."""
    try:
        from benchmarks.bench_data import time_prepare, time_tokenize
        from data.sources import shakespeare_path

        src = shakespeare_path()
        import tiktoken

        enc = tiktoken.get_encoding("gpt2")  # loading the BPE ranks is not part of either figure
    except Exception as e:  # UserError (no file, no network), ImportError
        say(f"[prepare] skipped: {e}")
        report["notes"].append(f"prepare skipped: {e}")
        return None
    text = src.read_text(encoding="utf-8")
    n_tokens = len(enc.encode_ordinary(text))
    reps = args.decode_repeats
    say(f"[prepare] tiny shakespeare -> gpt2 bins ({n_tokens} tokens); {reps} call(s) each")
    times = {k: [] for k in ("base_full", "ours_full", "base_tok", "ours_tok")}
    prepared = None

    def base_full(r):
        d = work / f"base-{r}"
        d.mkdir(parents=True)
        t0 = time.perf_counter()
        plain_prepare(src, d)
        return time.perf_counter() - t0

    def ours_full(r):
        nonlocal prepared
        seconds, prepared = time_prepare(work / f"ours-{r}")  # a fresh root: nothing is up to date
        return seconds

    def base_tok(r):
        t0 = time.perf_counter()
        enc.encode_ordinary(text)
        return time.perf_counter() - t0

    def ours_tok(r):
        return time_tokenize()  # the encode call alone (file and tokenizer loaded outside its clock)

    fns = {"base_full": base_full, "ours_full": ours_full, "base_tok": base_tok, "ours_tok": ours_tok}
    time_tokenize()  # warm-up: tokenizer objects, page cache
    for r in range(reps):  # interleaved, the order alternating
        for pair in (("base_full", "ours_full"), ("base_tok", "ours_tok")):
            for name in (pair if r % 2 == 0 else pair[::-1]):
                times[name].append(fns[name](r))
    for name, base_key, ours_key in (("ours prepare_data", "base_full", "ours_full"),
                                     ("ours tokenize only", "base_tok", "ours_tok")):
        base_s, s = median(times[base_key]), median(times[ours_key])
        report["rows"].append({
            "section": "prepare", "name": name, "precision": "-", "unit": "s",
            "ours": s, "base": base_s, "ours_tok_s": n_tokens / s, "base_tok_s": n_tokens / base_s,
            "speedup": base_s / s, "ours_times_s": times[ours_key], "base_times_s": times[base_key],
        })
    report["prepare"] = {"source": str(src), "tokens": n_tokens}
    return prepared


# ------------------------------------------------------------------------------------------ same loss

def loss_check(args, device, auto_dtype, data_dir: Path | None, report: dict) -> None:
    """Baseline and ours from the same init on the same batches for N steps (BPE shape); then both
    evaluated alike (fp32, eager, 20 fixed held-out batches; 2 with --quick). Real tiny shakespeare
    when prepared, else seeded random tokens."""
    vocab, B, T = 50257, BATCH_SIZE, TRAIN_SHAPE["block_size"]
    if data_dir is not None:
        from data import BatchLoader

        train = BatchLoader(data_dir, "train", block_size=T, batch_size=B, seed=1337, device=device)
        val = BatchLoader(data_dir, "val", block_size=T, batch_size=B, seed=4242, device=device)
        get_train, get_val, source = train.get_batch, val.get_batch, f"tiny shakespeare ({data_dir.name})"
    else:
        def rand(seed):
            def get(step):
                d = torch.randint(0, vocab, (B, T + 1), generator=torch.Generator().manual_seed(seed * 100003 + step))
                return d[:, :-1].to(device), d[:, 1:].to(device)
            return get
        get_train, get_val, source = rand(1), rand(2), "seeded random tokens"
    _, make = make_pair_models(vocab, device)
    base_m, ours_m = make("manual"), make("sdpa")
    base_step = train_step_fn(base_m, base_m, baseline_optimizer(base_m), torch.float32, False, device,
                              get_train, ours=False)
    ours_step = train_step_fn(ours_m, ours_m, our_optimizer(ours_m, device), auto_dtype, True, device,
                              get_train, ours=True)
    say(f"[loss check] {args.loss_steps} steps each, BPE shape, {source}, ours in {SHORT[auto_dtype]}")
    base_losses, ours_losses = [], []
    for step in range(args.loss_steps):  # both see get_train(step): the same batch
        base_losses.append(base_step(step))
        ours_losses.append(ours_step(step))
    base_losses = torch.stack(base_losses).tolist()
    ours_losses = torch.stack(ours_losses).tolist()

    @torch.no_grad()
    def evaluate(m):
        m.eval()
        vals = [m(*get_val(i))[1].item() for i in range(n_eval)]
        m.train()
        return sum(vals) / len(vals)

    n_eval = 2 if args.quick else 20
    base_val, ours_val = evaluate(base_m), evaluate(ours_m)
    tail = min(20, args.loss_steps)
    res = {
        "steps": args.loss_steps, "data": source, "eval_batches": n_eval, "ours_dtype": SHORT[auto_dtype],
        "base_val_loss": base_val, "ours_val_loss": ours_val, "diff_val_loss": ours_val - base_val,
        "base_train_loss_last": sum(base_losses[-tail:]) / tail, "ours_train_loss_last": sum(ours_losses[-tail:]) / tail,
        "initial_train_loss": base_losses[0], "tolerance": args.loss_tol,
        "agree": abs(ours_val - base_val) <= args.loss_tol,
        "base_train_losses": base_losses, "ours_train_losses": ours_losses,
    }
    report["loss_check"] = res


# ------------------------------------------------------------------------------------------ report

def _fmt(v, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "time":
        return f"{v:.3g}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"
    if kind == "rate":
        return f"{v:.1f}" if v < 100 else f"{v:,.0f}"
    if kind == "gflops":
        return f"{v / 1e9:.1f}"
    if kind == "mb":
        return f"{v:.0f}"
    if kind == "mfu":
        return f"{v * 100:.1f}%"
    return str(v)


def format_table(rows: list[dict]) -> str:
    head = ["section", "row", "prec", "unit", "ours", "base", "tok/s ours", "base", "GFLOP/s ours", "base",
            "MFU ours", "base", "step MB ours", "base", "base/ours"]
    body = []
    for r in rows:
        body.append([r["section"], r["name"], r["precision"], r["unit"], _fmt(r["ours"], "time"), _fmt(r["base"], "time"),
                     _fmt(r.get("ours_tok_s"), "rate"), _fmt(r.get("base_tok_s"), "rate"),
                     _fmt(r.get("ours_flops"), "gflops"), _fmt(r.get("base_flops"), "gflops"),
                     _fmt(r.get("ours_mfu"), "mfu"), _fmt(r.get("base_mfu"), "mfu"),
                     _fmt(r.get("ours_step_mb"), "mb"), _fmt(r.get("base_step_mb"), "mb"), f"{r['speedup']:.2f}x"])
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    left = {0, 1, 2, 3}

    def line(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    out = [line(head), line(["-" * w for w in widths])]
    prev = None
    for r, cells in zip(rows, body):
        if prev is not None and r["section"] != prev:
            out.append("")
        prev = r["section"]
        out.append(line(cells))
    return "\n".join(out)


def main(argv=None) -> int:
    args = parse_args(argv)
    global _T0
    t_start = _T0 = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    busy_before = cpu_busy_fraction(0.2 if args.quick else 1.0)
    use = CoreUse()
    machine = cpu_info()
    if device.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(device)
    report: dict = {"settings": {k: v for k, v in vars(args).items() if k != "json"}, "machine": machine,
                    "rows": [], "train_shapes": {}, "notes": []}

    # precision as train.py's dtype=auto picks it, and the peaks MFU is measured against
    auto_dtype, measured, dtype_note = resolve_dtype("auto", device)
    peaks = {}
    for dt in dict.fromkeys((torch.float32, torch.bfloat16, auto_dtype)):
        peaks[dt], _ = peak_flops(device, dt, measured=measured)
    say(dtype_note)
    report["dtype_auto"] = {"dtype": SHORT[auto_dtype], "note": dtype_note}
    report["peak_flops"] = {SHORT[k]: v for k, v in peaks.items()}

    with tempfile.TemporaryDirectory(prefix="smallgpt-bench-") as tmp:
        for label, vocab in TRAIN_CONFIGS:
            if label.split()[0].lower() not in args.skip:
                bench_train(label, vocab, args, device, auto_dtype, peaks, report)
        if "decode" not in args.skip:
            bench_decode(args, device, report)
        data_dir = None
        if "prepare" not in args.skip:
            data_dir = bench_prepare(args, device, Path(tmp), report)
        elif not args.no_loss_check:
            with contextlib.suppress(Exception):
                from data import DataConfig, prepare_data
                data_dir = prepare_data(DataConfig(root=str(Path(tmp) / "loss")), progress=False)
        if not args.no_loss_check:
            loss_check(args, device, auto_dtype, data_dir, report)

    busy_during = use.others_fraction()
    busy_after = cpu_busy_fraction(0.2 if args.quick else 1.0)
    wall = time.perf_counter() - t_start
    rss_mb = peak_rss_mb()
    report.update(busy={"before": busy_before, "during_others": busy_during, "after": busy_after},
                  peak_rss_mb=rss_mb, wall_s=wall)

    # ---- the report (stdout)
    m = machine
    print(f"machine: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), torch {m['torch']}, "
          f"{m['threads']} thread(s), {m['cpu_capability']}, "
          f"AMX {_yes(m['amx'], m['flags_known'])}, avx512_bf16 {_yes(m['avx512_bf16'], m['flags_known'])}"
          + (f", GPU {m['gpu']}" if "gpu" in m else ""))
    print(f"peak (matmul probe, this run): fp32 {peaks[torch.float32] / 1e9:.0f} GFLOP/s, "
          f"bf16 autocast {peaks[torch.bfloat16] / 1e9:.0f} GFLOP/s" if device.type == "cpu" else
          f"peak (table): fp32 {_fmt(peaks[torch.float32], 'gflops')} GFLOP/s, bf16 {_fmt(peaks[torch.bfloat16], 'gflops')} GFLOP/s")
    print(f"{dtype_note}")
    if device.type == "cpu" and m["flags_known"] and not m["amx"]:
        slower = (peaks[torch.bfloat16] or 0) < (peaks[torch.float32] or 0)
        print("no AMX on this CPU: bf16 matmuls have no matrix unit"
              + (" and run slower than fp32 here (probe above), so dtype auto trains in fp32 and the bf16 rows are "
                 "for information" if slower else ""))
    print(f"settings: {'QUICK (figures meaningless); ' if args.quick else ''}training {args.warmup} warm-up + "
          f"{args.iters} timed steps per row in {args.rounds} interleaved rounds, medians; decode/prepare "
          f"{args.decode_repeats} call(s) per row; base = the plain baseline measured in the same run\n")
    if report["rows"]:
        print(format_table(report["rows"]))
    for r in report["rows"]:
        if "compile_s" in r:
            print(f"\n{r['section']}: compile (first step of the compiled model) took {r['compile_s']:.1f} s")
    lc = report.get("loss_check")
    if lc:
        print(f"\nsame loss after {lc['steps']} steps (BPE shape, {lc['data']}, same init and batches; "
              f"val = {lc['eval_batches']} fixed held-out batches, fp32): baseline {lc['base_val_loss']:.4f}, "
              f"ours ({lc['ours_dtype']}) {lc['ours_val_loss']:.4f}, difference {lc['diff_val_loss']:+.4f} -> "
              f"{'agree' if lc['agree'] else 'DIFFER'} (tolerance {lc['tolerance']}); mean train loss of the last "
              f"{min(20, lc['steps'])} steps: {lc['base_train_loss_last']:.4f} vs {lc['ours_train_loss_last']:.4f} "
              f"(start {lc['initial_train_loss']:.3f})")
    busy = [b for b in (busy_before, busy_during, busy_after) if b is not None]
    if busy:
        print(f"\nother processes kept the cores {_pct(busy_before)} busy just before, {_pct(busy_during)} during, "
              f"{_pct(busy_after)} just after the run"
              + (": the machine was busy, so absolute figures are low (baseline and ours alike)"
                 if max(busy) > 0.25 else ": the machine was quiet"))
        if max(busy) > 0.25 and torch.get_num_threads() > 1:
            print(f"  with {torch.get_num_threads()} torch threads on busy cores OpenMP's barriers wait for descheduled "
                  "threads, and small steps can slow down many-fold (measured here: a char step 50 ms on 1 thread, "
                  "~2 s on 2); re-run on a quiet machine, or compare with --threads 1")
    for note in report["notes"]:
        print(f"note: {note}")
    print(f"peak RSS {rss_mb:.0f} MB; wall time {wall:.0f} s")

    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


def _yes(flag: bool, known: bool) -> str:
    return "?" if not known else "yes" if flag else "no"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


if __name__ == "__main__":
    sys.exit(main())
