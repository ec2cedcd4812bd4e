"""nanoGPT's own train.py, run as its users run it, on the BPE CPU shape: the denominator of issue 20's
">= 2.0x nanoGPT" (`python bench.py --nanogpt-dir PATH`, timed right after the train section, in the
same environment: under --isa-avx2 the child process runs it under the AVX2 variables too); and the floor
under our step at that shape (head_products_floor): what its LM head's three products cost alone, so the
report can say what a 2.0x step leaves for everything else.

The loop in our process (benchmarks/baseline.py) is nanoGPT's loop body, but it shares this process's
allocator setting (runtime.memory.keep_freed_memory is process-wide), which alone took nanoGPT's BPE step
from ~690 to ~400 ms on a 2-core Zen 3; nanoGPT's own train.py runs without it, as users have it. It needs
a checkout of https://github.com/karpathy/nanoGPT (measured at 3adf61e); its data/shakespeare/train.bin is
made by its own prepare.py where missing, from SMALLGPT_SHAKESPEARE's tiny shakespeare where that is set
(nanoGPT's script downloads it otherwise).
"""
from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from errors import UserError
from runtime.loss_path import onednn_mm, weight_grad_product_available

# nanoGPT's CPU recipe (its README) at the BPE shape of benchmarks/train.py's CPU_SHAPES: 4L/4H/128, block 64,
# batch 12, GPT-2's BPE vocabulary, fp32 eager; one eval batch at iteration 0 instead of 200 (it is not timed)
RECIPE = ("--dataset=shakespeare", "--device=cpu", "--compile=False", "--block_size=64", "--batch_size=12",
          "--n_layer=4", "--n_head=4", "--n_embd=128", "--dropout=0.0", "--gradient_accumulation_steps=1",
          "--max_iters=100", "--log_interval=1", "--eval_interval=100000", "--eval_iters=1")
FIRST_ITER = 20  # the iterations before this are warm-up (allocator, caches, the first one's start-up)
ITER_LINE = re.compile(r"^iter (\d+): loss \S+, time ([\d.]+)ms", re.MULTILINE)
TIMEOUT_S = 900  # 100 steps take under 2 minutes on any 2-core CPU seen so far


def check_dir(path: Path) -> Path:
    """The checkout, or one line saying what is missing (checked before any measuring starts)."""
    data = path / "data" / "shakespeare"
    if not (path / "train.py").is_file() or not (path / "model.py").is_file():
        raise UserError(f"--nanogpt-dir {path}: no nanoGPT checkout there (train.py and model.py); clone "
                        "https://github.com/karpathy/nanoGPT and pass its folder")
    if not (data / "train.bin").is_file() and not (data / "prepare.py").is_file():
        raise UserError(f"--nanogpt-dir {path}: {data} has neither train.bin nor the prepare.py that makes it; "
                        "pass a whole nanoGPT checkout")
    return path


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def _prepare(data: Path, say: Callable[[str], None]) -> None:
    if not (data / "prepare.py").is_file():
        raise UserError(f"{data} has no train.bin and no prepare.py to make it: not a nanoGPT checkout's data folder")
    source = os.environ.get("SMALLGPT_SHAKESPEARE")
    if source and Path(source).is_file() and not (data / "input.txt").exists():
        try:
            shutil.copyfile(source, data / "input.txt")  # else nanoGPT's script downloads it
        except OSError as e:
            raise UserError(f"cannot copy tiny shakespeare into {data} ({e.strerror or e}); make the nanoGPT "
                            "checkout writable, or prepare its data there first") from None
    say(f"[nanoGPT] python prepare.py in {data}")
    try:
        res = subprocess.run([sys.executable, "prepare.py"], cwd=data, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise UserError(f"nanoGPT's {data / 'prepare.py'} ran over 300 s (a download that does not finish?); "
                        "put tiny shakespeare's input.txt beside it, or set SMALLGPT_SHAKESPEARE") from None
    if res.returncode != 0 or not (data / "train.bin").is_file():
        raise UserError(f"nanoGPT's {data / 'prepare.py'} failed (exit {res.returncode}: {_last_line(res.stderr)}); "
                        "put tiny shakespeare's input.txt beside it, or set SMALLGPT_SHAKESPEARE")


def step_ms(nanogpt_dir: Path, out_dir: Path, say: Callable[[str], None], threads: int | None = None) -> dict:
    """Run nanoGPT's train.py with RECIPE, on `threads` threads (OMP_NUM_THREADS; None: its default, as ours);
    -> the median of its own per-iteration times from FIRST_ITER on (what it prints: the wall time of an
    iteration, its batch fetch and loss.item() included)."""
    check_dir(nanogpt_dir)
    data = nanogpt_dir / "data" / "shakespeare"
    if not (data / "train.bin").is_file():
        _prepare(data, say)
    args = [*RECIPE, f"--out_dir={out_dir}"]
    say(f"[nanoGPT] python train.py {' '.join(RECIPE)} in {nanogpt_dir}")
    try:
        res = subprocess.run([sys.executable, "train.py", *args], cwd=nanogpt_dir, capture_output=True, text=True,
                             timeout=TIMEOUT_S, env={**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})})
    except subprocess.TimeoutExpired:
        raise UserError(f"nanoGPT's train.py in {nanogpt_dir} ran over {TIMEOUT_S} s; the machine may be busy") from None
    times = [float(ms) for it, ms in ITER_LINE.findall(res.stdout) if int(it) >= FIRST_ITER]
    if res.returncode != 0:
        raise UserError(f"nanoGPT's train.py in {nanogpt_dir} failed (exit {res.returncode}: "
                        f"{_last_line(res.stderr or res.stdout)})")
    if not times:
        raise UserError(f"nanoGPT's train.py in {nanogpt_dir} printed no iteration lines from {FIRST_ITER} on "
                        "(expected 'iter N: loss ..., time ...ms'): is it karpathy/nanoGPT's train.py?")
    return {"median_ms": statistics.median(times), "iters": len(times), "first_iter": FIRST_ITER,
            "dir": str(nanogpt_dir), "command": "python train.py " + " ".join(RECIPE)}


def head_products_floor(rows: int, n_embd: int, vocab_size: int, calls: int = 5,
                        libraries: dict[str, Callable] | None = None) -> dict:
    """What the BPE step's LM head alone costs at best: its three products (logits, input gradient, weight
    gradient) on fp32 operands of the step's shapes, each timed alone by the fastest of torch.mm (into a
    buffer, as the fused loss runs it) and oneDNN (where this torch has it), the minimum of `calls` calls.
    A library whose product disagrees with an fp64 one (on ~64 rows) is left out. No step can be faster than these
    three, so half nanoGPT's own step minus their sum is all that a >= 2.0x step leaves for everything
    else. `libraries` ({name: product(a, b) -> a @ b}) replaces the two (a test's)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, n_embd, generator=gen)
    w = torch.randn(vocab_size, n_embd, generator=gen) * 0.02
    z = torch.rand(vocab_size, rows, generator=gen)  # the (V, n) logits, as the fused loss lays them out
    products = {"logits": (w, x.t()), "input gradient": (z.t(), w), "weight gradient": (z, x)}
    if libraries is None:
        buffers = {}

        def into_buffer(a, b):  # one preallocated output per shape
            out = buffers.setdefault((a.shape[0], b.shape[1]), torch.empty(a.shape[0], b.shape[1]))
            return torch.mm(a, b, out=out)
        libraries = {"torch.mm": into_buffer}
        if weight_grad_product_available(torch.device("cpu")):
            libraries["oneDNN"] = onednn_mm
    out = {}
    for name, (a, b) in products.items():
        some = slice(None, None, max(1, a.shape[0] // 64))  # ~64 rows of the result, checked in fp64
        exact = a[some].double() @ b.double()
        best = {}
        for lib, mm in libraries.items():
            got = mm(a, b)[some].double()  # also the warm-up: oneDNN's first call builds its kernel
            if not torch.allclose(got, exact, rtol=1e-4, atol=1e-4 * float(exact.abs().max())):
                continue
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                mm(a, b)
                times.append(time.perf_counter() - t0)
            best[lib] = min(times) * 1e3
        if not best:
            raise UserError(f"no library computed the LM head's {name} product right on this machine")
        lib = min(best, key=best.get)
        out[name] = {"ms": best[lib], "by": lib, "gflops": 2 * rows * n_embd * vocab_size / best[lib] / 1e6}
    return {"products": out, "total_ms": sum(p["ms"] for p in out.values()), "calls": calls,
            "libraries": list(libraries)}
