"""Precision, chosen per device from outside the model: the dtype policies of training and of sampling,
the autocast context, the GradScaler, and TF32.

The two `auto` policies differ because the two workloads are bound by different things:
- training (`training_dtype`) runs large matmuls forward and backward, so it wants the dtype whose
  matmuls are fastest on this device, and fp16 only with a GradScaler (its range is too small for
  gradients). Weights stay fp32 (autocast), so the choice never changes what is saved.
- sampling (`inference_dtype`) decodes one token at a time, which is bound by reading every weight
  once per token: halving the bytes with bf16 weights pays on a CPU for models too big for its caches,
  even where bf16 arithmetic is no faster than fp32; small models fit in cache, and there fp32 is faster.
On CUDA both use bf16 only where the GPU computes it natively (compute capability 8.0+: Ampere,
Hopper, ...). `torch.cuda.is_bf16_supported()` also says True on T4 and V100, which emulate bf16
slowly; those get fp16 (with a GradScaler in training).
"""
from __future__ import annotations

import contextlib
import time

import torch

DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
DTYPE_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BF16_CPU_MIN_PARAMS = 25_000_000  # sampling: from this size on, bf16 weights decode faster on a CPU


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cuda_native_bf16(device: torch.device) -> bool:
    """bf16 in hardware: compute capability 8.0 or newer (T4 is 7.5, V100 7.0)."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def training_dtype(name: str, device: torch.device) -> tuple[torch.dtype, dict[str, float], str]:
    """The training dtype for train.dtype=name on this device -> (dtype, measured FLOP/s by dtype name, note).

    auto: on CUDA bf16 where native, else fp16 (with a GradScaler); on CPU the faster of bf16-autocast
    and fp32 by a short matmul probe (some CPUs run bf16 in hardware, others emulate it); else fp32.
    """
    if name != "auto":
        return DTYPE_BY_NAME[name], {}, f"dtype {name} (from config)"
    if device.type == "cuda":
        if cuda_native_bf16(device):
            return torch.bfloat16, {}, "dtype auto -> bfloat16 (CUDA with native bf16)"
        return torch.float16, {}, ("dtype auto -> float16 with GradScaler (this GPU has no native bf16: "
                                   f"compute capability {'.'.join(map(str, torch.cuda.get_device_capability(device)))})")
    if device.type == "cpu":
        measured = {"float32": matmul_flops(device, torch.float32), "bfloat16": matmul_flops(device, torch.bfloat16)}
        pick = "bfloat16" if measured["bfloat16"] > measured["float32"] else "float32"
        note = (f"dtype auto -> {pick}: 1024^3 matmul probe on cpu, bf16 autocast "
                f"{measured['bfloat16'] / 1e9:.0f} GFLOP/s vs fp32 {measured['float32'] / 1e9:.0f} GFLOP/s")
        return DTYPE_BY_NAME[pick], measured, note
    return torch.float32, {}, f"dtype auto -> float32 on {device.type}"


def inference_dtype(name: str, device: torch.device, n_params: int) -> torch.dtype:
    """The weights' dtype for sampling with --dtype=name: on CUDA bf16 where native, else fp16; on a
    CPU whose oneDNN does bf16, bf16 for models of >= 25M parameters (with prepacked weights GPT-2-124M
    went from ~42 to ~57 tok/s on a 2-core AVX512-BF16 CPU), fp32 for smaller ones (7M params: ~630
    vs ~590 tok/s); fp32 on MPS and everywhere else."""
    if name != "auto":
        return DTYPE_BY_NAME[name]
    if device.type == "cuda":
        return torch.bfloat16 if cuda_native_bf16(device) else torch.float16
    if (device.type == "cpu" and n_params >= BF16_CPU_MIN_PARAMS and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return torch.bfloat16
    return torch.float32


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
