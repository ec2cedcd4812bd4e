"""Sampling's set-up, shared by sample.py and the benchmark: choose the dtype (runtime/precision.py's
inference_dtype, which on a CPU times this model's decoding in fp32 and in prepacked bf16) and get the
model ready for it (model.generate.prepare_for_decoding: device, dtype, compile or CPU prepacking)."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from model import GPT
from model.generate import generate, prepare_for_decoding

from .choices import auto_dtype
from .precision import inference_dtype

PROBE_PROMPT, PROBE_TOKENS = 8, 4  # the timed work: a prefill of 8 tokens, then 4 one-token steps


@dataclass
class Decoding:
    model: GPT  # on the device, in `dtype`, eval mode (prepacked on a CPU in bf16)
    decode_fn: Callable | None  # the compiled one-token step, or None
    dtype: torch.dtype
    prepacked: bool
    note: str  # how the dtype was chosen


def setup_decoding(model: GPT, device: torch.device, dtype: str = "auto", *, compile: bool = False) -> Decoding:
    """`model` (on the CPU, fp32) ready to sample from with --dtype=dtype. With --compile the dtype is
    not measured (that would compile each candidate): auto then follows the rule without a probe."""
    ready: dict[torch.dtype, tuple] = {}

    def prepared(dt: torch.dtype):
        if dt not in ready:
            ready[dt] = prepare_for_decoding(copy.deepcopy(model), device, dt, compile=compile)
        return ready[dt]

    def decode(dt: torch.dtype) -> None:
        m, fn, _ = prepared(dt)
        generate(m, [[0] * PROBE_PROMPT], PROBE_TOKENS, temperature=0, decode_fn=fn)

    choose = lambda: inference_dtype(dtype, device, decode=None if compile else decode)  # noqa: E731
    if dtype == "auto" and not compile:  # decided once per (machine, model) and reused: the same text every run
        chosen, note = auto_dtype("sample", {"model": dataclasses.asdict(model.config)}, choose, device)
    else:
        chosen, note = choose()
    m, fn, packed = prepared(chosen)
    return Decoding(m, fn, chosen, packed, note)
