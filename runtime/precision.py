"""Precision, chosen per device from outside the model: the dtype policies of training and of sampling,
the autocast context, the GradScaler, and TF32.

The two `auto` policies differ because the two workloads are bound by different things:
- training (`training_dtype`) runs large matmuls forward and backward, so it wants the dtype whose
  matmuls are fastest on this device, and fp16 only with a GradScaler (its range is too small for
  gradients). Weights stay fp32 (autocast), so the choice never changes what is saved.
- sampling (`inference_dtype`) decodes one token at a time, which is bound by reading every weight
  once per token: halving the bytes with bf16 weights pays on a CPU for models too big for its caches,
  even where bf16 arithmetic is no faster than fp32; small models fit in cache, and there fp32 is faster.
On a CPU both are decided by timing the real work of this model in each candidate (`fastest`): which
dtype is faster depends on the CPU (AMX, AVX512-BF16 or neither) and on the model's size.
On CUDA both use bf16 only where the GPU computes it natively (compute capability 8.0+: Ampere,
Hopper, ...). `torch.cuda.is_bf16_supported()` also says True on T4 and V100, which emulate bf16
slowly; those get fp16 (with a GradScaler in training).
"""
from __future__ import annotations

import contextlib
import platform
import statistics
import time
from typing import Callable, Sequence, TypeVar

import torch

T = TypeVar("T")

DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
DTYPE_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cuda_native_bf16(device: torch.device) -> bool:
    """bf16 in hardware: compute capability 8.0 or newer (T4 is 7.5, V100 7.0)."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def cpu_native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (AMX or AVX512-BF16). False on AVX2-only CPUs (e.g.
    AMD Zen 3), where oneDNN emulates bf16 ~25x slower than fp32, under ONEDNN_MAX_CPU_ISA=AVX2, and on
    x86 CPUs with AVX512 but neither AVX512-BF16 nor AMX (Xeon Skylake, Cascade Lake and Ice Lake, and VMs
    that hide those flags): oneDNN says it "supports" bf16 there, but converts to fp32 in software, and a bf16
    matmul runs at 0.3-0.45x fp32's speed (2-core Xeon without avx512_bf16, 2026-11-24: 46 against 108
    GFLOP/s). So on x86 oneDNN's answer needs the instructions too; elsewhere (aarch64) it is trusted.
    The one place that asks: every dtype choice goes through it, so tests can turn it off (monkeypatch
    runtime.precision.cpu_native_bf16)."""
    if not (torch.backends.mkldnn.is_available() and _onednn_bf16()):
        return False
    if platform.machine().lower() not in _X86:
        return True
    return _x86_bf16_instructions()


_X86 = ("x86_64", "amd64", "i386", "i686", "x86")


def _onednn_bf16() -> bool:
    """oneDNN's view: True where it will run bf16 at all, natively or not (False under an AVX2 cap)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _x86_bf16_instructions() -> bool:
    """AVX512-BF16 or AMX (every CPU with AMX tiles so far has AMX-BF16 too), as torch's cpuinfo reads
    CPUID (private helpers of torch.cpu, so an older torch without them counts as neither: fp32, slower
    at worst, never emulated)."""
    return any(bool(getattr(torch.cpu, name, lambda: False)())
               for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def native_bf16(device: torch.device) -> bool:
    """bf16 in hardware on this device: CUDA compute capability 8.0+, or a CPU with AMX / AVX512-BF16."""
    if device.type == "cuda":
        return cuda_native_bf16(device)
    return device.type == "cpu" and cpu_native_bf16()


def fastest_native_dtype(device: torch.device) -> torch.dtype:
    """The dtype for work that tolerates bf16's rounding (Muon's Newton-Schulz iterations): bf16 where
    the device computes it natively, fp32 elsewhere (never an emulated dtype)."""
    return torch.bfloat16 if native_bf16(device) else torch.float32


def sharded_param_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype | None:
    """The dtype FSDP gathers the parameters in for a run training in `dtype` (its mixed-precision
    policy; gradients are always reduced in fp32): bf16 where the run trains in bf16 and the device
    computes it natively (CUDA 8.0+, a CPU with AMX / AVX512-BF16), which halves the all-gathers and
    the gathered copies; None (the stored fp32) everywhere else, e.g. fp16 runs, whose GradScaler wants
    fp32 parameters, and CPUs that would emulate bf16."""
    if dtype != torch.bfloat16:
        return None
    return torch.bfloat16 if native_bf16(device) else None


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


def decision_budget_s(run_s: float = 0.0) -> float:
    """What choosing a dtype may cost: 5 s, or 2% of the run it is for, whichever is larger."""
    return max(5.0, 0.02 * run_s)


def fastest(candidates: Sequence[T], run: Callable[[T], object], device: torch.device,
            reps: int = 3, margin: float = 0.05, budget_s: float | Callable[[float], float] = 5.0,
            ) -> tuple[T, dict[str, float]]:
    """Time run(candidate) for each candidate (dtypes, or the names of other ways to do the same work):
    one warm-up call each, then up to `reps` calls each, interleaved so that a busy neighbour slows all
    alike; the median per candidate. -> (pick, seconds by name).

    - A candidate whose first timed call is over 2x another's is abandoned there (an emulated dtype,
      or a kernel path far off the other's): it is never the pick, and it is not run again.
    - The whole decision stops adding rounds once it has spent `budget_s` seconds (a number, or a
      function of the first candidate's first timed call, e.g. 2% of the run that many steps make).
    - The first candidate (the more exact one, or the default) is kept unless another is faster by more
      than `margin`: a near tie is within the probe's run-to-run noise (on a Xeon with AMX the BPE step
      measured 135.4 ms in fp32 and 135.1 ms in bf16, then ran 8% faster in fp32), and then exactness wins."""
    start = time.perf_counter()
    times: dict[T, list[float]] = {dt: [] for dt in candidates}
    live = list(candidates)
    limit = budget_s if not callable(budget_s) else None
    for rep in range(reps + 1):
        for dt in live:
            _sync(device)
            t0 = time.perf_counter()
            run(dt)
            _sync(device)
            if rep:
                times[dt].append(time.perf_counter() - t0)
        if rep == 1:
            quickest = min(times[dt][0] for dt in live)
            live = [dt for dt in live if times[dt][0] <= 2.0 * quickest]
            if limit is None:
                limit = budget_s(times[candidates[0]][0])
        if rep >= 1 and len(live) < 2:
            break
        spent = time.perf_counter() - start
        if rep >= 1 and spent + sum(times[dt][-1] for dt in live) > limit:
            break  # another round would go over what the decision may cost
    medians = {dt: statistics.median(ts) for dt, ts in times.items() if dt in live}
    best, first = min(medians, key=medians.get), candidates[0]
    pick = best if first not in medians or medians[best] < (1 - margin) * medians[first] else first
    seconds = {dtype_name(dt) if isinstance(dt, torch.dtype) else str(dt): statistics.median(ts)
               for dt, ts in times.items() if ts}
    return pick, seconds


def _timed_note(what: str, pick: torch.dtype, seconds: dict[str, float]) -> str:
    return (f"dtype auto -> {dtype_name(pick)}: {what} took "
            + ", ".join(f"{s * 1e3:.1f} ms in {n}" for n, s in seconds.items()))


def training_dtype(name: str, device: torch.device,
                   forward_backward: Callable[[torch.dtype], object] | None = None,
                   run_steps: int = 0) -> tuple[torch.dtype, str]:
    """The training dtype for train.dtype=name on this device -> (dtype, note to print).

    auto: on CUDA bf16 where native, else fp16 (with a GradScaler). On a CPU the faster of fp32 and bf16
    autocast for THIS model: `forward_backward(dtype)` runs one forward and backward pass of the real
    model on a real batch (training/step.py's probe, which leaves the weights and every RNG stream as
    they were). A matmul probe says nothing about a small model whose step is dominated by small
    kernels, and some CPUs run bf16 in hardware (AMX, AVX512-BF16) while others emulate it. A CPU
    without native bf16 (cpu_native_bf16) never runs bf16 at all: fp32 without timing anything. The
    timing costs at most max(5 s, 2% of the run's `run_steps` steps). Without a forward_backward (or
    elsewhere): fp32.
    """
    if name != "auto":
        return DTYPE_BY_NAME[name], f"dtype {name} (from config)"
    if device.type == "cuda":
        if cuda_native_bf16(device):
            return torch.bfloat16, "dtype auto -> bfloat16 (CUDA with native bf16)"
        return torch.float16, ("dtype auto -> float16 with GradScaler (this GPU has no native bf16: "
                               f"compute capability {'.'.join(map(str, torch.cuda.get_device_capability(device)))})")
    if device.type == "cpu" and not cpu_native_bf16():
        return torch.float32, NO_NATIVE_BF16
    if device.type == "cpu" and forward_backward is not None:
        pick, seconds = fastest((torch.float32, torch.bfloat16), forward_backward, device,
                                budget_s=lambda first: decision_budget_s(first * run_steps))
        return pick, _timed_note("the model's forward + backward", pick, seconds)
    return torch.float32, f"dtype auto -> float32 on {device.type}"


NO_NATIVE_BF16 = "dtype auto -> float32 (this CPU has no native bf16: bf16 would be emulated, so it is not tried)"


def inference_dtype(name: str, device: torch.device,
                    decode: Callable[[torch.dtype], object] | None = None) -> tuple[torch.dtype, str]:
    """The weights' dtype for sampling with --dtype=name -> (dtype, note). auto: on CUDA bf16 where
    native, else fp16; on a CPU with native bf16 (cpu_native_bf16), the faster of fp32 and bf16 (prepacked) for THIS
    model, by timing `decode(dtype)`: a prefill and a few one-token steps of the real model, set up as
    sample.py runs it. Decoding reads every weight once per token, so bf16 pays for models too big for
    the caches even where bf16 arithmetic is slow, and fp32 wins for small ones; where the line falls
    depends on the CPU, so it is measured. fp32 on MPS and everywhere else."""
    if name != "auto":
        return DTYPE_BY_NAME[name], f"dtype {name}"
    if device.type == "cuda":
        return (torch.bfloat16 if cuda_native_bf16(device) else torch.float16), "dtype auto (CUDA)"
    if device.type == "cpu" and not cpu_native_bf16():
        return torch.float32, NO_NATIVE_BF16
    if device.type == "cpu" and decode is not None:
        pick, seconds = fastest((torch.float32, torch.bfloat16), decode, device)
        return pick, _timed_note("decoding", pick, seconds)
    return torch.float32, "dtype auto -> float32"


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
