"""Decode speed: GPT-2-124M shape (random weights), batch 1, a 16-token prompt, 128 new greedy tokens.

    python benchmarks/bench_decode.py                 # ours fp32, bf16, bf16 prepacked; uncached; HF
    python benchmarks/bench_decode.py --compile       # also ours with the decode step torch.compile'd
    python benchmarks/bench_decode.py --threads 1 --no-uncached --json bench-results/decode.json

tok/s = new tokens / wall time of the whole call (prefill included), best of --repeats runs after a
warm-up. All variants run in one process on the same weights: an HF GPT2LMHeadModel (random init)
is saved and loaded into ours, so the fp32 greedy tokens must agree, which the script checks. How
busy the cores were just before and after (other processes) is printed: on a shared machine a busy
neighbour lowers every figure.
Not a test: nothing asserts a speed.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per variant (the uncached loop runs once)")
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    p.add_argument("--compile", action="store_true", help="also time ours with torch.compile'd decode steps")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' generate")
    p.add_argument("--no-uncached", action="store_true", help="skip the (slow) uncached loop")
    p.add_argument("--json", default=None, help="also write the results to this file")
    return p.parse_args(argv)


def timed(fn, repeats):
    fn(warmup=True)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(warmup=False)
        times.append(time.perf_counter() - t0)
    return out, times


def memory_bandwidth_gbs(torch) -> float:
    """Read bandwidth of a 512 MB sum: what a weight-streaming decode step can at best achieve."""
    x = torch.ones(128 * 2**20, dtype=torch.float32)
    x.sum()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def cpu_busy_fraction(seconds: float = 1.0) -> float | None:
    """How busy the cores were over `seconds` (from /proc/stat), measured while this script sleeps, so
    it is other processes' load. None where /proc/stat does not exist."""
    def read():
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    try:
        t0, i0 = read()
        time.sleep(seconds)
        t1, i1 = read()
    except OSError:
        return None
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def make_decode_models(use_hf: bool = True, shape: dict | None = None):
    """(our GPT, HF GPT2LMHeadModel or None), both in eval mode with the same random weights (seed 0).

    shape: GPTConfig fields (default: GPT-2-124M). With use_hf and transformers importable, an HF model
    is initialised and saved, and ours loads it; otherwise ours is initialised on its own."""
    import torch

    from model import GPT, GPTConfig

    cfg = GPTConfig(**(shape or {}))
    if use_hf:
        try:
            from transformers import GPT2Config, GPT2LMHeadModel
        except ImportError:
            pass
        else:
            torch.manual_seed(0)
            hf = GPT2LMHeadModel(GPT2Config(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                                            n_positions=cfg.block_size, vocab_size=cfg.vocab_size)).eval()
            with tempfile.TemporaryDirectory() as d:
                hf.save_pretrained(d)
                return GPT.from_pretrained(d).eval(), hf
    torch.manual_seed(0)
    return GPT(cfg).eval(), None


def ours_runner(model, prompt: list[int], new: int, decode_fn=None):
    """run(warmup) -> the greedy tokens of our KV-cache generate (8 tokens when warming up)."""
    from model.generate import generate

    def run(warmup):
        return generate(model, [prompt], 8 if warmup else new, temperature=0, decode_fn=decode_fn)[0]
    return run


def uncached_runner(model, prompt: list[int], new: int):
    """run(warmup) -> the greedy tokens of the plain loop (nanoGPT's generate): the whole (cropped)
    sequence through the model for every token, no cache."""
    import torch

    def run(warmup):
        idx = torch.tensor([prompt], device=model.transformer.wte.weight.device)
        with torch.inference_mode():
            for _ in range(2 if warmup else new):
                logits = model(idx[:, -model.config.block_size:])[:, -1]
                idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
        return idx[0, len(prompt):].tolist()
    return run


def hf_runner(hf, prompt: list[int], new: int):
    """run(warmup) -> the greedy tokens of transformers' generate (8 tokens when warming up)."""
    import torch

    def run(warmup):
        n = 8 if warmup else new
        device = hf.device
        with torch.inference_mode():
            out = hf.generate(torch.tensor([prompt], device=device), do_sample=False, max_new_tokens=n,
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
                              min_new_tokens=n, pad_token_id=50256)
        return out[0, len(prompt):].tolist()
    return run


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch

    from model.generate import decode_one_token, generate, prepack_for_cpu

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    busy_before = cpu_busy_fraction()
    new, P = args.new_tokens, args.prompt_len
    prompt = torch.randint(0, 50257, (P,), generator=torch.Generator().manual_seed(0)).tolist()

    model, hf = make_decode_models(use_hf=not args.no_hf)
    weights_mb = sum(p.numel() for p in model.parameters()) * 4 / 1e6  # tied wte counted once

    bw = memory_bandwidth_gbs(torch)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), cpu capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {platform.processor() or platform.machine()}")
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}"
          + (f"; other processes kept {busy_before:.0%} of the cores busy just before the run"
             if busy_before is not None else ""))
    print(f"memory read bandwidth ~{bw:.1f} GB/s -> weight-streaming limit ~{bw * 1e3 / weights_mb:.0f} tok/s fp32, "
          f"~{bw * 1e3 / (weights_mb / 2):.0f} tok/s bf16 ({weights_mb:.0f} MB of fp32 weights)")
    print(f"batch 1, prompt {P} tokens, {new} new tokens, greedy\n")

    results = {}
    tokens = {}

    def report(name, out, times):
        best, med = min(times), statistics.median(times)
        results[name] = {"tok_per_s_best": new / best, "tok_per_s_median": new / med, "runs": len(times)}
        tokens[name] = out
        print(f"{name:<26} {new / best:7.1f} tok/s best   {new / med:7.1f} median   ({len(times)} run(s))", flush=True)

    def ours(m, decode_fn=None):
        return ours_runner(m, prompt, new, decode_fn)

    report("ours fp32 (KV cache)", *timed(ours(model), args.repeats))
    m16 = copy.deepcopy(model).to(torch.bfloat16)  # weights; the cache follows the weights' dtype
    report("ours bf16 (KV cache)", *timed(ours(m16), args.repeats))
    if args.compile:
        t0 = time.perf_counter()
        fn = torch.compile(decode_one_token, fullgraph=True)
        generate(m16, [prompt], 4, temperature=0, decode_fn=fn)
        print(f"  (compile: {time.perf_counter() - t0:.0f} s)")
        report("ours bf16 compiled", *timed(ours(m16, fn), args.repeats))
    if prepack_for_cpu(m16):  # what sample.py does for bf16 on a CPU
        report("ours bf16 prepacked", *timed(ours(m16), args.repeats))
        if tokens["ours bf16 prepacked"] != tokens["ours bf16 (KV cache)"]:
            print("WARNING: prepacked and plain bf16 greedy tokens differ")
    del m16

    if not args.no_uncached:
        uncached = uncached_runner(model, prompt, new)
        report("uncached loop fp32", *timed(uncached, 1))

    if hf is not None:
        hf_run = hf_runner(hf, prompt, new)
        report("HF generate fp32", *timed(hf_run, args.repeats))
        if tokens["HF generate fp32"] != tokens["ours fp32 (KV cache)"]:
            print("WARNING: ours fp32 and HF greedy tokens differ")
        else:
            print("check: ours fp32 greedy tokens == HF generate's")

    load_after = os.getloadavg()
    busy_after = cpu_busy_fraction()
    print(f"\nload average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}"
          + (f"; other processes: {busy_after:.0%} of the cores busy just after" if busy_after is not None else ""))
    if max(busy_before or 0, busy_after or 0) > 0.25:
        print("the machine was busy: other processes competed for the cores, so these figures are low")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "torch": torch.__version__, "threads": torch.get_num_threads(), "prompt_len": P, "new_tokens": new,
            "load_before": load_before, "load_after": load_after, "busy_before": busy_before,
            "busy_after": busy_after, "bandwidth_gbs": bw, "results": results,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
