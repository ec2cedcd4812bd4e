"""Model FLOPs utilisation: achieved training FLOP/s over the device's peak.

The peak comes from (in order): train.peak_flops when set; a table of known GPUs (dense, no sparsity,
bf16/fp16 tensor cores; fp32 without TF32 for fp32 training); on CPU a matmul probe measured once per
run in the training dtype."""
from __future__ import annotations

import re

import torch

from .precision import matmul_flops

# (substring of torch.cuda.get_device_name(), dense bf16/fp16 tensor-core peak FLOP/s, fp32 peak FLOP/s).
# The first match wins, so more specific names come first. Consumer cards: fp32-accumulate tensor rates.
GPU_PEAKS: list[tuple[str, float, float]] = [
    ("H200", 989e12, 67e12),
    ("GH200", 989e12, 67e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100 NVL", 835e12, 60e12),
    ("H100", 989e12, 67e12),  # SXM
    ("H800", 989e12, 67e12),
    ("B200", 2250e12, 80e12),
    ("A100", 312e12, 19.5e12),
    ("A800", 312e12, 19.5e12),
    ("A6000", 155e12, 38.7e12),  # RTX A6000
    ("L40S", 362e12, 91.6e12),
    ("L40", 181e12, 90.5e12),
    ("L4", 121e12, 30.3e12),
    ("A40", 150e12, 37.4e12),
    ("A30", 165e12, 10.3e12),
    ("A10G", 70e12, 31.2e12),
    ("A10", 125e12, 31.2e12),
    ("RTX 4090", 165e12, 82.6e12),
    ("RTX 3090", 71e12, 35.6e12),
    ("V100", 125e12, 15.7e12),  # fp16 tensor cores (no bf16)
    ("T4", 65e12, 8.1e12),  # fp16 tensor cores (no bf16)
]


def gpu_peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    for key, half_peak, fp32_peak in GPU_PEAKS:
        # whole-token match: "A10" must not match "A100" or "A10G", "L4" not "L40S"
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name, flags=re.IGNORECASE):
            return fp32_peak if dtype == torch.float32 else half_peak
    return None


def peak_flops(device: torch.device, dtype: torch.dtype, *, override: float = 0.0,
               measured: dict[str, float] | None = None) -> tuple[float | None, str]:
    """(peak FLOP/s per device or None when unknown, where it came from)."""
    if override > 0:
        return override, f"peak {override / 1e12:.3g} TFLOP/s from train.peak_flops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak_flops(name, dtype)
        if peak is None:
            return None, f"peak FLOP/s of {name!r} unknown: set train.peak_flops to see MFU"
        return peak, f"peak {peak / 1e12:.0f} TFLOP/s ({name}, table)"
    if device.type == "cpu":
        key = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")
        peak = (measured or {}).get(key) or matmul_flops(device, dtype)
        return peak, f"peak {peak / 1e9:.0f} GFLOP/s ({key} matmul probe on cpu)"
    return None, f"peak FLOP/s of {device.type} unknown: set train.peak_flops to see MFU"


def mfu(flops_per_token: float, tokens_per_sec: float, peak: float | None, world_size: int = 1) -> float | None:
    """Fraction of the peak reached: tokens/s (all ranks) * FLOPs per token / (peak * ranks)."""
    if not peak:
        return None
    return flops_per_token * tokens_per_sec / (peak * world_size)
