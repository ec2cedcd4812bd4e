"""Mixed precision, selected by device from outside the model: the dtype choice, the autocast context,
the GradScaler, and TF32."""
from __future__ import annotations

import contextlib
import time

import torch

DTYPE_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 1024, reps: int = 6) -> float:
    """Measured FLOP/s of an n x n matmul: fp32 plainly, bf16/fp16 under autocast from fp32 inputs, as
    training runs them. Best of `reps` after a warm-up (the max is the least noisy estimate of speed)."""
    gen = torch.Generator(device).manual_seed(0)  # a private generator: the training RNG stays untouched
    a = torch.randn(n, n, device=device, generator=gen)
    b = torch.randn(n, n, device=device, generator=gen)
    ctx = autocast(device, dtype)
    best = float("inf")
    for i in range(reps + 1):
        _sync(device)
        t0 = time.perf_counter()
        with ctx:
            (a @ b).sum()
        _sync(device)
        if i:  # the first one is warm-up
            best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resolve_dtype(name: str, device: torch.device) -> tuple[torch.dtype, dict[str, float], str]:
    """The training dtype for train.dtype=name on this device -> (dtype, measured FLOP/s by dtype name, note).

    auto: on CUDA bf16 when supported, else fp16; on CPU the faster of bf16-autocast and fp32 by a
    short matmul probe (some CPUs run bf16 in hardware, others emulate it); elsewhere fp32.
    """
    if name != "auto":
        return DTYPE_BY_NAME[name], {}, f"dtype {name} (from config)"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, {}, "dtype auto -> bfloat16 (CUDA with bf16 support)"
        return torch.float16, {}, "dtype auto -> float16 with GradScaler (CUDA without bf16)"
    if device.type == "cpu":
        measured = {"float32": matmul_flops(device, torch.float32), "bfloat16": matmul_flops(device, torch.bfloat16)}
        pick = "bfloat16" if measured["bfloat16"] > measured["float32"] else "float32"
        note = (f"dtype auto -> {pick}: 1024^3 matmul probe on cpu, bf16 autocast "
                f"{measured['bfloat16'] / 1e9:.0f} GFLOP/s vs fp32 {measured['float32'] / 1e9:.0f} GFLOP/s")
        return DTYPE_BY_NAME[pick], measured, note
    return torch.float32, {}, f"dtype auto -> float32 on {device.type}"


def autocast(device: torch.device, dtype: torch.dtype):
    """The forward-pass precision context: autocast for bf16/fp16, nothing for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_scaler(device: torch.device, dtype: torch.dtype) -> torch.amp.GradScaler:
    """A GradScaler, enabled only for fp16 (bf16 has fp32's exponent range and needs none)."""
    return torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)


def allow_tf32(device: torch.device) -> None:
    """TF32 matmuls and convolutions on Ampere+ GPUs (fp32 storage, 10-bit mantissa products)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
