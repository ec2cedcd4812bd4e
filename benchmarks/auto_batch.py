"""train.batch_size auto on an emulated smaller GPU (issue 24, "Smaller GPUs").

Caps this process's CUDA memory at --memory-gb with torch.cuda.set_per_process_memory_fraction (the
caching allocator then raises out-of-memory past the cap, as on a card that size), lets
training/batch_size.py choose the micro-batch of configs/gpt2_124m.yaml's model for its global batch
(512 sequences of 1024 tokens), then times a few optimizer steps at that choice: train.py's step
(training/step.py) on random tokens, with the model, optimizers, scaler, loss path and compile set up
by the run's builders (training/builders.py). Reports the choice, how long it took, tok/s, and the peak the real steps
reached against the cap (a step that runs out of memory is reported, not a crash).

    python -m benchmarks.auto_batch --memory-gb 16 --json benchmarks/results/results-auto-batch-16gb-h100.json
    python -m benchmarks.auto_batch --memory-gb 24 --json benchmarks/results/results-auto-batch-24gb-h100.json
    python -m benchmarks.auto_batch --quick --device cpu --memory-gb 1   # smoke test: tiny model; on a CPU the limit
                                                                          # is the free memory, --memory-gb a label

The probe's loss: the choice measures each candidate by one eager forward+backward; a compiled run's loss is the
full logits, and eager cross-entropy over them holds fp32 copies the compiled step never holds. On an H100
(2026-11-28) that probe peaked at 16.3 GiB at 16 x 1024 where the compiled steps peaked at 9.2, so at 16 GB auto
chose 8 (381k tok/s) where 16 fits. This benchmark's --probe-loss chunked then measured the probe with the loss in
chunks (benchmarks/results/h100-2026-11-28b): 16 GB chose 16 (probe 10.5 GiB, real steps 9.2, 464k tok/s), 24 GB
chose 32 (16.0 against 16.2, 490k tok/s, where the full-logits probe chose 16 at 460k). train.py's probe has done
so since, plus the one copy of the logits the compiled step keeps (training/batch_size.py's measured_bytes: the real
peak grew faster than the chunks alone), and the option went.

One size per process: the cap, the allocator's cache and compile's graphs are per process.
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # a command: Ctrl-C while the imports below run is one line (errors.quiet_interrupts)
    errors.quiet_interrupts()

import argparse
import json
import statistics
import time

import torch

from fileio import atomic_write_bytes, file_arg
from ownership import check_output
from model import GPT
from runtime.precision import allow_tf32
from training.builders import build_trainer
from training.config.sections import load_config
from training.parallel.distributed import Parallel
from training.plan import RunPlan

GPT2_VOCAB = 50257  # the tokenizer's ids; the model pads its embedding to 50304
QUICK = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=64", "--model.block_size=64",
         "--model.vocab_size=512", "--train.dtype=float32"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--memory-gb", type=float, required=True, help="the emulated card's memory, GiB")
    p.add_argument("--device", default="cuda")
    p.add_argument("--global-batch", type=int, default=512, help="sequences per optimizer step (gpt2_124m: 512)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (compile)")
    p.add_argument("--steps", type=int, default=3, help="timed optimizer steps")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--quick", action="store_true", help="a tiny model and global batch 16: a smoke test")
    p.add_argument("--json", type=file_arg, help="write the row here")
    return p


def checked(argv: list[str] | None = None):
    """(the options, the config this run trains): every check done before the GPU is touched (tests/test_gpu_round.py
    runs it on each command of the GPU round)."""
    args = build_parser().parse_args(argv)
    if args.json:  # the gate, before minutes of measuring: no folder another command manages
        check_output(args.json, "--json")
    cfg = load_config(["--config", "gpt2_124m", "--train.batch_size=auto", f"--train.device={args.device}",
                       f"--train.global_batch_size={16 if args.quick else args.global_batch}",
                       f"--train.compile={args.compile}", "--wandb.mode=disabled"] + (QUICK if args.quick else []))
    return args, cfg


def main(argv: list[str] | None = None) -> dict:
    args, cfg = checked(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:  # set_per_process_memory_fraction needs an index
        device = torch.device("cuda", torch.cuda.current_device())
    t, block = cfg.train, cfg.model.block_size
    data_vocab = cfg.model.vocab_size if args.quick else GPT2_VOCAB
    cap = int(args.memory_gb * 2**30)
    if device.type == "cuda":  # the emulated card: the per-process fraction, which the chain reads as its limit
        total = torch.cuda.mem_get_info(device)[1]
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
        allow_tf32(device)
    else:  # a CPU has no per-process cap to set: the machine's free memory is the limit (--memory-gb is the label)
        print(f"[auto batch] on {device.type} the limit is this machine's free memory, not --memory-gb", flush=True)

    torch.manual_seed(t.seed)
    model = GPT(cfg.model.gpt_config(cfg.model.vocab_size)).to(device)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, data_vocab, (t.global_batch_size, block + 1), generator=gen).to(device)
    plan = RunPlan()

    class Batches:  # micro-batch k of the global batch, at the micro-batch auto chose
        def get_batch(self, i: int, micro: int = 0):
            rows = slice(micro * plan.micro_batch, (micro + 1) * plan.micro_batch)
            return tokens[rows, :-1].contiguous(), tokens[rows, 1:].contiguous()

    t0 = time.perf_counter()  # the run's chain: auto's choice, then the loss product for it, optimizers, compile
    trainer = build_trainer(cfg, Parallel(), device, model, plan, lambda micro: (Batches(), {}), say=lambda line: None)
    chain_s = time.perf_counter() - t0  # the whole chain, the batch decision in it (before 2026-11-26: the decision)
    tag = f"auto batch {args.memory_gb:g} GiB"
    print(f"[{tag}] {plan.decisions['batch'].note}; set up in {chain_s:.1f} s", flush=True)
    batches = [Batches().get_batch(0, k) for k in range(plan.accum)]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, error = [], None
    try:
        for _ in range(args.warmup + args.steps):
            s = time.perf_counter()
            trainer.step(batches).loss.item()  # the host sync: the step is done
            times.append(time.perf_counter() - s)
    except torch.OutOfMemoryError as e:  # the decision was wrong for the real step: that is the finding
        error = f"out of memory at micro-batch {plan.micro_batch} after {len(times)} step(s): {str(e).splitlines()[0]}"
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    timed = times[args.warmup:]
    step_s = statistics.median(timed) if timed else None
    row = {"row": f"batch_size auto, {args.memory_gb:g} GiB", "device": torch.cuda.get_device_name(device)
           if device.type == "cuda" else "cpu", "memory_gb": args.memory_gb, "micro_batch": plan.micro_batch,
           "micro_steps": plan.accum, "global_batch": t.global_batch_size, "block_size": block,
           "note": plan.decisions["batch"].note,
           "chain_s": round(chain_s, 2), "step_s": step_s, "compiled": t.compile, "dtype": t.dtype,
           "tok_per_s": t.global_batch_size * block / step_s if step_s else None,
           "steps_peak_gib": round(peak / 2**30, 2) if peak is not None else None, "error": error}
    line = (f"[{tag}] micro-batch {plan.micro_batch} x {plan.accum} micro-steps: "
            + (error or f"{row['tok_per_s']:,.0f} tok/s (median of {len(timed)} steps)"
               + (f", real steps peaked at {row['steps_peak_gib']} of {args.memory_gb:g} GiB" if peak else "")))
    print(line, flush=True)
    if args.json:
        atomic_write_bytes(args.json, (json.dumps(row, indent=1) + "\n").encode(), "--json", follow=True)
    return row


if __name__ == "__main__":
    errors.start_up_done()  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    from errors import run_cli

    run_cli(lambda: main() and 0)
