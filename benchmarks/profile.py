"""Where a training step's time goes: torch.profiler over the real step (training.step.train_step, set up
as in the timing rows), each ATen op's self time put in one bucket, and what no op accounts for.

Buckets:
- LM head matmuls: mm/addmm with an operand of vocab_size rows or columns (logits, grad of x, grad of W);
- block matmuls: every other mm/addmm/bmm (qkv, attention output, MLP, their gradients);
- attention: SDPA's fused kernel, forward and backward;
- loss and softmax: the fused head's softmax pieces or F.cross_entropy's;
- small ops: GELU/ReLU², norms, residual adds, copies, embedding lookups and other elementwise kernels;
- optimizer: everything below Optimizer.step / zero_grad (fused AdamW, Muon's Newton-Schulz);
- grad clipping: the norm and the scaling of clip_grad_norm_;
- autograd engine: the self time of autograd's own wrapper events;
- outside ops: wall time no op covers: Python, module calls, dispatch, the profiler's own cost.
Allocations are reported apart, by what they cost on a CPU: the minor page faults per step (fresh pages
the kernel must zero and map), counted over the same number of steps run without the profiler, whose
time per step is printed too.

The profiler adds a few microseconds per op, so a step profiled is slower than one timed, and the
"outside ops" share is an upper bound.
"""
from __future__ import annotations

import resource
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

BUCKETS = ("LM head matmuls", "block matmuls", "attention", "loss and softmax", "small ops", "optimizer",
           "grad clipping", "autograd engine", "outside ops")
MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
CLIP_OPS = {"aten::_foreach_norm", "aten::linalg_vector_norm", "aten::stack", "aten::clamp", "aten::clamp_max",
            "aten::_foreach_mul_", "aten::_foreach_mul"}


def _ancestors(event):
    e = event.cpu_parent
    while e is not None:
        yield e.name
        e = e.cpu_parent


def _bucket(event, vocab_size: int) -> str:
    name = event.name
    up = list(_ancestors(event))
    if any(a.startswith("Optimizer.") for a in up):
        return "optimizer"
    if not name.startswith("aten::"):
        return "autograd engine"  # autograd::engine::evaluate_function and other wrappers
    touches_vocab = any(vocab_size in s for s in (event.input_shapes or []) if isinstance(s, list))
    if name in MATMULS:
        return "LM head matmuls" if touches_vocab else "block matmuls"
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention"
    if name in CLIP_OPS:
        return "grad clipping"
    if "embedding" not in name and (touches_vocab or "softmax" in name or "nll_loss" in name):
        return "loss and softmax"  # the (rows, vocab) logits' softmax, in the fused head or F.cross_entropy
    return "small ops"


def profile_step(step, vocab_size: int, steps: int = 10, warmup: int = 3) -> dict:
    """Run `step(i)` warmup times, then `steps` times under the profiler, then `steps` times without it.
    Returns ms per step per bucket, the wall ms per step with and without the profiler, and the minor
    page faults per step."""
    for i in range(warmup):
        step(i)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        for i in range(steps):
            step(warmup + i)
        wall = time.perf_counter() - t0
    faults0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    for i in range(steps):
        step(warmup + steps + i)
    plain = time.perf_counter() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    ms = defaultdict(float)
    for e in prof.events():
        ms[_bucket(e, vocab_size)] += e.self_cpu_time_total / 1e3  # us -> ms
    ms["outside ops"] = max(0.0, wall * 1e3 - sum(ms.values()))
    return {"wall_ms": wall * 1e3 / steps, "plain_ms": plain * 1e3 / steps, "ms": {b: ms[b] / steps for b in BUCKETS},
            "page_faults": faults / steps}


def format_profile(label: str, dtype: str, result: dict) -> str:
    lines = [f"{label} ({dtype}): {result['wall_ms']:.1f} ms per profiled step ({result['plain_ms']:.1f} ms without "
             f"the profiler); {result['page_faults']:.0f} minor page faults per step"]
    for bucket, v in sorted(result["ms"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {bucket:<18} {v:7.1f} ms  {100 * v / result['wall_ms']:5.1f}%")
    return "\n".join(lines)
