"""Which device to run on (training, sampling, evaluation and the benchmark share it), and how a
torch.compile failure is told from a model error."""
from __future__ import annotations

from typing import Callable, TypeVar

import torch

from errors import UserError, short_error

from .memory import keep_freed_memory
from .precision import allow_tf32

T = TypeVar("T")


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def resolve_device(name: str, local_rank: int = 0, option: str = "--train.device") -> torch.device:
    """"auto": cuda (this rank's GPU) > mps > cpu. A device that is unknown or not there is a UserError
    naming `option`, the flag the user set it with."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("mps" if _mps_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        dev = None
    # one rule for every command (train.device's check, training/config/sections._device, spells the same): a
    # CPU or MPS index (cpu:1) picks nothing, so it is refused, not taken as the plain device
    if dev is None or dev.type not in ("cpu", "cuda", "mps") or (dev.type != "cuda" and dev.index is not None):
        raise UserError(f"unknown {option}={name!r}; use auto, cpu, cuda, cuda:N or mps")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"{option}={name} but CUDA is not available here; use {option}=cpu or auto")
        if dev.index is None:
            dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        elif dev.index >= torch.cuda.device_count():
            raise UserError(f"{option}={name} but only {torch.cuda.device_count()} GPU(s) exist; pick cuda:0..")
    if dev.type == "mps" and not _mps_available():
        raise UserError(f"{option}={name} but MPS is not available here; use {option}=cpu or auto")
    return dev


def compile_failed(e: BaseException) -> bool:
    """Whether an exception comes from torch.compile's machinery (Dynamo, Inductor: e.g. no C++
    compiler on a CPU) rather than from the model: then running without compile is the fix."""
    return type(e).__module__.startswith(("torch._dynamo", "torch._inductor"))


def with_compile_fallback(run: Callable[[], T], *, compiled: bool, go_eager: Callable[[], None],
                          say: Callable[[str], None]) -> T:
    """The one policy for a torch.compile failure, in training and in sampling alike: run(); if it fails
    inside torch.compile's machinery, say so in one line, go_eager() (replace the compiled function by
    the plain one) and run() again. A compile fails before the compiled code runs, so the retry starts
    from the same state. Any other exception is the caller's."""
    try:
        return run()
    except Exception as e:
        if not (compiled and compile_failed(e)):
            raise
        failure = short_error(e)
    say(f"warning: torch.compile failed ({failure}); continuing without it")
    go_eager()
    return run()


def use_device(device: torch.device) -> None:
    """The process-wide settings a run takes on its device, set by the run's chain (training/builders.py)
    and by bench.py through this one function: TF32 matmuls on a GPU; on a CPU, the memory a step frees
    kept for the next step (no page faults per step)."""
    allow_tf32(device)
    if device.type == "cpu":
        keep_freed_memory()
