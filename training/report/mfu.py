"""Model FLOPs utilisation: achieved training FLOP/s over the device's peak.

The peak comes from (in order): train.peak_flops when set; a table of known GPUs (dense, no sparsity:
bf16/fp16 tensor cores for bf16/fp16 training; for fp32 training the TF32 tensor-core rate when TF32
matmuls are allowed, as train.py allows them, else plain fp32); on CPU a matmul probe measured once
per run in the training dtype. An MFU above 100% means the peak is not this run's (e.g. a CPU probe of
an emulated dtype), so it is reported as unknown rather than shown."""
from __future__ import annotations

import re

import torch

from runtime.choices import cpu_peak
from runtime.precision import matmul_flops

# (substring of torch.cuda.get_device_name(), dense FLOP/s: bf16/fp16 tensor cores, TF32 tensor cores
# (None: no TF32), plain fp32). The first match wins, so more specific names come first. Consumer
# cards: fp32-accumulate tensor rates. Vendors' datasheets.
GPU_PEAKS: list[tuple[str, float, float | None, float]] = [
    ("GH200", 989e12, 495e12, 67e12),
    ("H200", 989e12, 495e12, 67e12),
    ("H100 PCIe", 756e12, 378e12, 51e12),
    ("H100 NVL", 835e12, 418e12, 60e12),
    ("H100", 989e12, 495e12, 67e12),  # SXM
    ("H800", 989e12, 495e12, 67e12),
    ("B200", 2250e12, 1100e12, 80e12),
    ("A100", 312e12, 156e12, 19.5e12),
    ("A800", 312e12, 156e12, 19.5e12),
    ("A6000", 155e12, 77.4e12, 38.7e12),  # RTX A6000
    ("L40S", 362e12, 183e12, 91.6e12),
    ("L40", 181e12, 90.5e12, 90.5e12),
    ("L4", 121e12, 60e12, 30.3e12),
    ("A40", 150e12, 74.8e12, 37.4e12),
    ("A30", 165e12, 82e12, 10.3e12),
    ("A10G", 70e12, 35e12, 31.2e12),
    ("A10", 125e12, 62.5e12, 31.2e12),
    ("RTX 4090", 165e12, 82.6e12, 82.6e12),
    ("RTX 3090", 71e12, 35.6e12, 35.6e12),
    ("V100", 125e12, None, 15.7e12),  # fp16 tensor cores (no bf16, no TF32)
    ("T4", 65e12, None, 8.1e12),  # fp16 tensor cores (no bf16, no TF32)
]


def gpu_peak_flops(device_name: str, dtype: torch.dtype, tf32: bool = False) -> float | None:
    """The table's peak for this GPU and training dtype; fp32 counts at the TF32 rate when `tf32`."""
    for key, half_peak, tf32_peak, fp32_peak in GPU_PEAKS:
        # whole-token match: "A10" must not match "A100" or "A10G", "L4" not "L40S"
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name, flags=re.IGNORECASE):
            if dtype != torch.float32:
                return half_peak
            return tf32_peak if tf32 and tf32_peak else fp32_peak
    return None


def peak_flops(device: torch.device, dtype: torch.dtype, *, override: float = 0.0,
               measured: dict[str, float] | None = None, cache: bool = True) -> tuple[float | None, str]:
    """(peak FLOP/s per device or None when unknown, where it came from). On a CPU the matmul probe
    runs once per machine and is reused from the user's cache (runtime/choices.py), so the MFU of every
    run on one machine is against the same peak; cache=False probes now (the benchmark, which compares
    figures taken in one run)."""
    if override > 0:
        return override, f"peak {override / 1e12:.3g} TFLOP/s from train.peak_flops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
        peak = gpu_peak_flops(name, dtype, tf32=tf32)
        if peak is None:
            return None, f"peak FLOP/s of {name!r} unknown: set train.peak_flops to see MFU"
        math_kind = "tf32" if tf32 else "fp32" if dtype == torch.float32 else "bf16/fp16"
        return peak, f"peak {peak / 1e12:.0f} TFLOP/s ({name}, {math_kind}, table)"
    if device.type == "cpu":
        key = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")
        peak, source = (measured or {}).get(key), "given"
        if not peak:
            peak, source = cpu_peak(dtype, lambda: matmul_flops(device, dtype)) if cache else (
                matmul_flops(device, dtype), "measured now")
        return peak, f"peak {peak / 1e9:.0f} GFLOP/s ({key} matmul probe on cpu, {source})"
    return None, f"peak FLOP/s of {device.type} unknown: set train.peak_flops to see MFU"


def mfu(flops_per_token: float, tokens_per_sec: float, peak: float | None, world_size: int = 1) -> float | None:
    """Fraction of the peak reached: tokens/s (all ranks) * FLOPs per token / (peak * ranks). None when
    the peak is unknown, or when the fraction exceeds 1: then the peak was not this run's."""
    if not peak:
        return None
    util = flops_per_token * tokens_per_sec / (peak * world_size)
    return util if util <= 1.0 else None
