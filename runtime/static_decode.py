"""The one-token decode step over static buffers, replayed as one CUDA graph on a GPU.

Batch-1 decoding of a small model is bound by kernel launches, not by the GPU: GPT-2 124M's step is
~150 small kernels, each costing more to launch from Python than to run. A CUDA graph records the
step's kernels once and replays them with one launch. A graph replays fixed memory addresses, so the
step reads and writes only buffers that never move:

- the KV cache, allocated once per batch size for the model's whole block_size and reused by every
  call (slots past the written ones are masked, so a longer cache gives the same attention);
- the new token (B, 1) and its slot (1,), copied in before each replay: the position lives in a
  device tensor, so nothing crosses to the host inside the step;
- the pad mask (B, block_size) of left-padded prompts, where there is one (a graph of its own).

On a CPU (and in the CPU tests) the very same static step runs uncaptured: the same buffers and the
same calls, so the greedy text of the graph can be checked against eager decoding without a GPU.
Capture takes a few warm-up steps and the recording (well under a second for GPT-2 124M), against
~15 s for torch.compile's first call (benchmarks/results/h100-2026-11-27/).
"""
from __future__ import annotations

import torch

from model.generate import decode_one_token
from model.gpt import KVCache

WARMUP_STEPS = 2  # before capture: lazy inits (cuBLAS handles and workspaces) must not happen inside it


class _Static:
    """The buffers and (on CUDA) the graph of one batch size, with or without a pad mask."""

    def __init__(self, model, batch_size: int, padded: bool, capture: bool):
        device = model.transformer.wte.weight.device
        slots = model.config.block_size
        self.cache = model.new_kv_cache(batch_size, slots)
        self.tok = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.pad = torch.ones(batch_size, slots, dtype=torch.bool, device=device) if padded else None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        if capture:
            self._capture(model)

    def step(self, model) -> torch.Tensor:
        return decode_one_token(model, self.tok, self.pos, self.cache, self.pad)

    def _capture(self, model) -> None:
        # warm up on a side stream (as torch.cuda.graphs' own make_graphed_callables does), then record;
        # the warm-up writes slot 0 of the cache, which every prefill overwrites
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self.step(model)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.step(model)

    def run(self, model) -> torch.Tensor:
        if self.graph is None:
            return self.step(model)
        self.graph.replay()
        return self.logits


class StaticDecode:
    """A decode step for model.generate.generate_stream (its `decode_fn`): `new_cache` hands out the
    static cache, and each call copies the token and its slot into the static buffers and runs the
    step (replays the graph when `capture`). One model; buffers are kept per (batch size, padded)."""

    def __init__(self, model, *, capture: bool):
        self.model, self.capture = model, capture
        self._static: dict[tuple[int, bool], _Static] = {}
        self._current: _Static | None = None

    def new_cache(self, batch_size: int, slots: int, padded: bool = False) -> list[KVCache]:
        key = (batch_size, padded)
        if key not in self._static:
            self._static[key] = _Static(self.model, batch_size, padded, self.capture)
        self._current = self._static[key]
        return self._current.cache

    def set_pad(self, pad: torch.Tensor) -> torch.Tensor:
        """Copy a (B, S) pad mask into the static one (slots past S count as real: they are masked by
        position anyway); returns the static mask, which prefill must use too."""
        static = self._current.pad
        static.fill_(True)
        static[:, : pad.size(1)] = pad
        return static

    def __call__(self, model, tok: torch.Tensor, input_pos: torch.Tensor, cache, pad_mask=None) -> torch.Tensor:
        s = self._current
        # the graph replays its own buffers: any other cache or model would be silently ignored
        assert model is self.model and cache is s.cache and (pad_mask is None) == (s.pad is None)
        s.tok.copy_(tok)
        s.pos.copy_(input_pos)
        return s.run(model)
