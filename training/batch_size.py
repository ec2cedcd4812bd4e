"""`train.batch_size: auto`: the largest micro-batch that fits this device, the global batch kept.

The rule. Each rank's share of the global batch is P = train.global_batch_size / world_size sequences
per optimizer step. The candidates are the divisors m of P: m sequences per micro-step and P / m
micro-steps keep the global batch exactly, so whichever fits, the run trains on the same batches. The
memory a step needs grows with m, so a binary search over the sorted divisors finds the largest that
fits, trying about log2(number of divisors) of them and never one above a size known not to fit.

A candidate fits when its peak, plus what a forward+backward does not allocate yet (AdamW's two fp32
moments per parameter; with several DDP ranks, DDP's fp32 gradient buckets), is at most HEADROOM of
the limit (`memory_limit`: on CUDA the smaller of free + already reserved and the per-process fraction
of the total, which `torch.cuda.set_per_process_memory_fraction` sets). On CUDA the peak is measured:
one real forward+backward of the run's model at that micro-batch (random tokens of the run's block
size, under the run's autocast, RNG forked and gradients dropped: forward_backward_probe), on the
plain module (eager: a compiled step usually needs less; the loss in chunks where a compiled run's is the
full logits, measured_bytes), each rank alone; running out of memory means
"does not fit", never a crash. Where no real peak can be measured (a CPU: glibc keeps no peak
statistics; FSDP on several ranks: an OOM inside a collective would hang the other ranks) the peak is
training_bytes' arithmetic estimate at that micro-batch, and the note says so. The ranks then agree
on the smallest of their choices.

The choice is one decision of the run plan (training/plan.py: printed, saved, and applied again by a
resumed run, which never re-decides, so a resume under another memory limit trains bit for bit as the
first session; reapply_batch checks that the saved micro-batch still divides each rank's share).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from errors import UserError
from runtime.loss_path import LMLoss, choose_loss_chunk_rows
from runtime.memory import HEADROOM, available_bytes, training_bytes
from runtime.precision import autocast

from .config.sections import AUTO_BATCH, TrainSection
from .parallel.distributed import Parallel
from .plan import Batch, Decision
from .step import forward_backward_probe


def size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def largest_fitting(candidates: list[int], fits: Callable[[int], bool]) -> int | None:
    """The largest of the ascending `candidates` for which fits() holds, for a fits() that holds up to
    some size and fails above it; None if it fails for the first. Binary search: never tries a
    candidate above one that failed, nor below one that fitted."""
    lo, hi, best = 0, len(candidates), None  # candidates[:lo] fit, candidates[hi:] do not
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid
    return best


def memory_limit(device: torch.device) -> int | None:
    """What this process may use: on CUDA the smaller of (free + what torch already reserved) and the
    total times the per-process fraction; elsewhere available_bytes (None: unknown)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        capped = int(total * torch.cuda.get_per_process_memory_fraction(device))
        return min(free + torch.cuda.memory_reserved(device), capped)
    return available_bytes(device)


def choose(per_rank: int, measure: Callable[[int], int], limit: int) -> tuple[int, int]:
    """(micro-batch, its bytes): the largest divisor of `per_rank` whose measure(m) (bytes, or
    torch.OutOfMemoryError) is at most HEADROOM x limit. One line if not even 1 fits."""
    need: dict[int, int | None] = {}

    def fits(m: int) -> bool:
        try:
            need[m] = measure(m)
        except torch.OutOfMemoryError:
            need[m] = None  # does not fit
        if need[m] is None:  # out of the except block: its traceback, which held the pass's tensors, is gone
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # give back what the failed pass left cached
            return False
        return need[m] <= HEADROOM * limit

    m = largest_fitting(divisors(per_rank), fits)
    if m is None:
        what = "runs out of memory" if need.get(1) is None else f"needs {size(need[1])}"
        raise UserError(f"train.batch_size auto: even a micro-batch of 1 sequence {what}, over {HEADROOM:.0%} of the "
                        f"{size(limit)} this device has; lower model.block_size or the model's size (n_layer, n_embd), "
                        "or set train.activation_checkpointing=true")
    return m, need[m]


def measured_bytes(model: torch.nn.Module, loss: LMLoss, device: torch.device, dtype: torch.dtype, *, block_size: int,
                   vocab_size: int, extra: int) -> Callable[[int], int]:
    """measure(m): the CUDA peak of one forward+backward of `model` at micro-batch m, plus `extra`; the
    loss as the run computes it, or, where the run's is the full logits of a large vocabulary (a compiled
    run's), in chunks plus the logits the compiled step holds."""
    logits = 0  # bytes a sequence: what the compiled step holds that the probe's chunks do not
    rows = choose_loss_chunk_rows(device, compiled=False, vocab_size=vocab_size) if loss.chunk_rows is None else None
    if rows is not None:
        # The probe runs eagerly, and eager cross-entropy over the full logits holds fp32 copies a compiled step
        # fuses away (an H100, 2026-11-28: 16.3 GiB at 16 x 1024 where the compiled steps peaked at 9.2, so a
        # 16 GB card got 8 sequences, 381k tok/s, where 16 fit). So the probe runs the loss in chunks, as an eager
        # run does, plus the one (m, T, V) copy of the logits in the compute dtype the compiled step keeps: the
        # chunks alone read 10.5 and 16.0 GiB at 16 and 32 sequences against the real 9.2 and 16.2 (0.34 GiB a
        # sequence against the real 0.44: the difference is one sequence's bf16 logits, 0.096 GiB). With them,
        # 12.0 and 19.1: above the real peak at both, and growing as it does.
        loss = dataclasses.replace(loss, chunk_rows=rows)
        logits = block_size * vocab_size * dtype.itemsize
    gen = torch.Generator(device=device).manual_seed(0)  # the run's own RNG streams are not touched

    def measure(m: int) -> int:
        tokens = torch.randint(0, vocab_size, (m, block_size + 1), device=device, generator=gen)
        batch = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        del tokens
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            forward_backward_probe(model, loss, batch, lambda dt: autocast(device, dt))(dtype)
        finally:
            model.zero_grad(set_to_none=True)  # an OOM mid-backward leaves partial gradients
        return torch.cuda.max_memory_allocated(device) + m * logits + extra
    return measure


def estimated_bytes(model: torch.nn.Module, t: TrainSection, par: Parallel, *, block_size: int,
                    rows: int | None, extra: int) -> Callable[[int], int]:
    """measure(m): training_bytes' arithmetic estimate of a training process at micro-batch m (its
    weights, gradients and AdamW state included, the loss in chunks of `rows`), plus `extra`."""
    config = model.config
    return lambda m: sum(training_bytes(config, batch_size=m, block_size=block_size, loss_chunk_rows=rows,
                                        shards=par.shards,
                                        activation_checkpointing=t.activation_checkpointing).values()) + extra


def reapply_batch(t: TrainSection, kept: Decision[Batch] | None, par: Parallel) -> Decision[Batch] | None:
    """A resumed auto run's micro-batch (None: none kept), with the micro-steps that keep the global batch on
    this many ranks; one line where the micro-batch no longer divides each rank's share."""
    if kept is None:
        return None
    micro, total, world = kept.value.micro_batch, t.global_batch_size, par.world_size
    if (total // world) % micro:
        fits = divisors(total // micro)
        raise UserError(f"cannot resume on {world} ranks: this run's micro-batch ({micro}, chosen by batch_size auto) "
                        f"does not divide the {total // world} sequences per rank of train.global_batch_size={total}; run "
                        f"on {', '.join(map(str, fits))} rank(s)")
    return Decision(Batch(micro, total // micro), kept.note, kept=True)


def measure_batch(t: TrainSection, model: torch.nn.Module, device: torch.device, par: Parallel, *, dtype: torch.dtype,
                  block_size: int, vocab_size: int, loss: LMLoss,
                  limit: Callable[[torch.device], int | None] | None = None, measure: Callable[[int], int] | None = None
                  ) -> Decision[Batch]:
    """batch_size auto's fresh decision: Batch(micro-batch, global micro-steps) and its note, made by every rank
    (each measures its own memory) and agreed on (the smallest). `limit` and `measure` replace
    memory_limit and the measure this device gets (tests inject them)."""
    total, world = t.global_batch_size, par.world_size
    per_rank = total // world
    n_params = sum(p.numel() for p in model.parameters())  # this rank's (FSDP: its shard)
    ddp_buckets = 4 * n_params if par.ddp_buckets else 0
    real_peak = device.type == "cuda" and not par.joint_forward
    if measure is None:
        if real_peak:  # the forward+backward allocates the weights' gradients, not AdamW's two moments yet
            measure = measured_bytes(model, loss, device, dtype, block_size=block_size, vocab_size=vocab_size,
                                     extra=2 * 4 * n_params + ddp_buckets)
        else:
            measure = estimated_bytes(model, t, par, block_size=block_size, rows=loss.chunk_rows, extra=ddp_buckets)
    cap = (limit or memory_limit)(device)
    how = "measured by a forward+backward" if real_peak else f"estimated (no peak can be measured on {device.type}" + (
        " with FSDP over several ranks)" if device.type == "cuda" else ")")
    try:
        if cap is None:  # nowhere to read a limit from: the whole share in one micro-step
            micro, need = per_rank, None
        else:
            micro, need = choose(per_rank, measure, cap)
        outcome = ("ok", micro, need)
    except UserError as e:  # every rank gets to the gather below, then every rank stops with the line
        outcome = ("error", 0, str(e))
    outcomes = par.gather(outcome)
    for kind, _, message in outcomes:
        if kind == "error":
            raise UserError(message)
    _, micro, need = min(outcomes, key=lambda o: o[1])  # the ranks agree on the smallest choice
    steps = f"{total // micro} micro-step{'s' * (total > micro)}"  # over all ranks: true after a resume on others
    memory = "no memory limit known" if need is None else f"peak {size(need)} of {size(cap)} {how}"
    return Decision(Batch(micro, total // micro), f"batch_size auto: {micro} x {block_size} tokens per micro-step, "
                                                  f"{steps} (global {total} sequences), {memory}")


def check_world_size(t: TrainSection, world_size: int) -> None:
    """The global batch (train.grad_accum_steps micro-batches of train.batch_size) is split evenly over
    the ranks, whatever their number: a run saved on N ranks resumes on M by giving each rank accum / M
    micro-steps (or, where M does not divide them, smaller micro-batches: the plan's batch decision). An M
    that does not divide the global batch's sequences cannot keep it: one line with the options. With
    batch_size auto, the ranks share train.global_batch_size's sequences the same way."""
    if t.batch_size == AUTO_BATCH:
        n = t.global_batch_size
        if n % world_size:
            raise UserError(f"train.global_batch_size={n} is not divisible by the {world_size} ranks, so they cannot "
                            f"share it; run on {', '.join(map(str, divisors(n)))} rank(s), or (a new run) set "
                            f"train.global_batch_size to a multiple of {world_size}")
        return
    total = t.batch_size * t.grad_accum_steps
    if total % world_size:
        smaller = [d for d in divisors(total) if d not in divisors(t.grad_accum_steps)]
        raise UserError(f"the global batch, train.batch_size x train.grad_accum_steps = {t.batch_size} x "
                        f"{t.grad_accum_steps} = {total} sequences, is not divisible by the {world_size} ranks, so they "
                        f"cannot share it; run on {', '.join(map(str, divisors(t.grad_accum_steps)))} rank(s)"
                        + (f" (or {', '.join(map(str, smaller))} with smaller micro-batches)" if smaller else "")
                        + f", or (a new run) set train.grad_accum_steps to a multiple of {world_size}")
