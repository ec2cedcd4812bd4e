"""Interleaved timing of variants, and the peak memory one call of a variant needs.

Each variant is warmed up, then timed for `iters` calls split into `rounds` blocks; every round runs
each variant's block, in a rotated order, so a noisy neighbour slows all variants alike. Figures are
medians. Memory: on CUDA torch.cuda.max_memory_allocated over the warm-up calls; on a CPU how far one
steady-state call raised the process's peak RSS (Linux).
"""
from __future__ import annotations

import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from runtime.memory import release_freed_memory


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Variant:
    name: str  # row label
    step: Callable[[int], object]  # one timed unit of work (a training step, a generate call, a prepare)
    times: list[float] = field(default_factory=list)
    first: float | None = None  # the first warm-up call (compile time for compiled variants)
    peak_mb: float | None = None  # memory one call needs (see the module docstring)
    resident_mb: float = 0.0  # CUDA: what the variant holds before its first call (its weights)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def rss_kb(key: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


_peak_rss_kb = 0.0  # the process's peak RSS before the last reset of the kernel's mark


def reset_peak_rss() -> float | None:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS and return that RSS in KiB; None
    where /proc/self/clear_refs is not available. The reset also resets getrusage's ru_maxrss, so the
    peak so far is kept here first (see peak_rss_mb)."""
    global _peak_rss_kb
    _peak_rss_kb = max(_peak_rss_kb, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return rss_kb("VmRSS")


def peak_rss_mb() -> float:
    """Peak RSS of this process over the whole run, in MB (Linux reports KiB)."""
    return max(_peak_rss_kb, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


def run_interleaved(variants: list[Variant], warmup: int, iters: int, rounds: int, device: torch.device) -> None:
    """Warm each variant up, then time `iters` calls of each in `rounds` rotated blocks."""
    def timed(v: Variant, i: int) -> float:
        sync(device)
        t0 = time.perf_counter()
        v.step(i)
        sync(device)
        return time.perf_counter() - t0

    for v in variants:
        if device.type == "cuda":
            allocated = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        for i in range(warmup):
            measure_rss = device.type != "cuda" and i == min(1, warmup - 1)  # steady state: optimizer state exists
            if measure_rss:
                release_freed_memory()  # what earlier variants freed and the allocator kept would hide this one's need
            before = reset_peak_rss() if measure_rss else None
            dt = timed(v, i)
            v.first = dt if v.first is None else v.first
            if measure_rss and before is not None:
                v.peak_mb = max(0.0, rss_kb("VmHWM") - before) / 1024
        if device.type == "cuda" and warmup:
            v.peak_mb = v.resident_mb + (torch.cuda.max_memory_allocated(device) - allocated) / 2**20
    rounds = max(1, min(rounds, iters))
    sizes = [iters // rounds + (r < iters % rounds) for r in range(rounds)]
    for r, size in enumerate(sizes):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            for _ in range(size):
                v.times.append(timed(v, len(v.times)))
