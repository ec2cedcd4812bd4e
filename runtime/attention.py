"""Which kernel runs F.scaled_dot_product_attention in training on a GPU, applied from outside the model.

SDPA picks a kernel by a fixed priority (flash, then memory-efficient, then cuDNN, then math), not by
speed. On Hopper, cuDNN's fused attention (which uses the chip's asynchronous copies and warpgroup
matmuls) can be faster than PyTorch's FlashAttention-2 at GPT-2's head size; where it is depends on the
cuDNN and torch versions, so it is measured: the causal forward + backward of one micro-batch's
attention shape, with each kernel this build has, and the fastest goes first in SDPA's priority (the
others stay enabled behind it, so a shape the chosen one cannot run, e.g. the masked attention of
sampling, still finds a kernel). Every kernel computes the same attention; only the rounding differs.
The choice is a decision of the run plan (training/builders.py), so a resumed run keeps it, and it is
measured once per GPU, software and shape (runtime/choices.py's cache, as the CPU's dtype), so a new run of the
same config neither waits for the probe (and cuDNN's first build of its kernels) nor flips a near tie.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import choices
from .precision import dtype_name

DEFAULT = "default"  # SDPA's own priority (every device but CUDA, and a GPU where nothing beat it)
KERNELS = ("flash", "cudnn", "efficient")
TIMED_STEPS = 10
MARGIN = 0.03  # another kernel is taken only where it is faster than SDPA's own pick by more than this

_active = None  # the sdpa_kernel context this process runs under, once one is chosen


def _backend(name: str) -> SDPBackend:
    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]


def _time_kernel(name: str | None, q, k, v) -> float | None:
    """ms per causal forward + backward with kernel `name` alone (None: SDPA's own choice); None where
    this build or shape has no such kernel."""

    def run():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(torch.ones_like(out))

    try:
        ctx = sdpa_kernel([_backend(name)]) if name else torch.enable_grad()
        with ctx:
            for _ in range(3):
                run()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(TIMED_STEPS):
                run()
            end.record()
            torch.cuda.synchronize()
        return start.elapsed_time(end) / TIMED_STEPS
    except RuntimeError:  # "No available kernel" for this shape, dtype or build
        return None


def fastest_kernel(device: torch.device, *, batch: int, n_head: int, seq: int, head_dim: int,
                   dtype: torch.dtype) -> tuple[str, str]:
    """(kernel name, the plan's note): the fastest SDPA kernel for this attention shape on this GPU, or
    DEFAULT (no note) off CUDA, in fp32 (which only the math and efficient kernels run), or where SDPA's
    own choice is within MARGIN of the fastest."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return DEFAULT, ""
    shape = (batch, n_head, seq, head_dim)
    parts = {"gpu": gpu_key(device), "shape": list(shape), "dtype": dtype_name(dtype)}

    def measure():
        kernel, note = _measure(device, shape, dtype)
        return {"value": kernel, "note": note}

    entry, source = choices.cached("attention", parts, measure, lambda v: v == DEFAULT or v in KERNELS)
    return entry["value"], (entry.get("note") or "") and f"{entry['note']} ({source})"


def gpu_key(device: torch.device) -> str:
    """What the kernels' speeds depend on besides the shape: the GPU, and the torch and cuDNN builds."""
    return (f"{torch.cuda.get_device_name(device)} | torch {torch.__version__} | cuda {torch.version.cuda} | "
            f"cudnn {torch.backends.cudnn.version()}")


def _measure(device: torch.device, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[str, str]:
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    own = _time_kernel(None, q, k, v)
    times = {name: t for name in KERNELS if (t := _time_kernel(name, q, k, v)) is not None}
    del q, k, v
    if own is None or not times:
        return DEFAULT, ""
    best = min(times, key=times.get)
    timed = ", ".join(f"{n} {t:.2f}" for n, t in times.items())
    if times[best] >= own * (1 - MARGIN):
        return DEFAULT, f"attention: SDPA's own kernel choice ({own:.2f} ms; timed {timed} ms a forward+backward)"
    return best, f"attention: the {best} kernel first ({timed} ms a forward+backward of {tuple(shape)}; SDPA's own {own:.2f})"


def use_kernel(name: str) -> None:
    """Put kernel `name` first in SDPA's priority for the rest of this process (DEFAULT: leave it)."""
    global _active
    if name == DEFAULT or name == getattr(_active, "smallgpt_kernel", None):
        return
    if _active is not None:
        _active.__exit__(None, None, None)
    order = [_backend(name)] + [_backend(n) for n in (*KERNELS, "math") if n != name]
    _active = sdpa_kernel(order, set_priority=True)
    _active.__enter__()
    _active.smallgpt_kernel = name
