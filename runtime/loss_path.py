"""How the LM head's loss runs on this device, applied to the model from outside: `use_loss_path(model,
device, compiled=...)`, one line beside compile and DDP (the only code that sets GPT.loss_chunk_rows).

With a 50k vocabulary the head is the largest matmul of a small GPT, and the (B*T, V) logits the
largest tensor. Where the logits go depends on the hardware:
- CPU: the fused, chunked head + loss (model/fused_ce.py), in chunks whose fp32 logits take at most
  CHUNK_BYTES (384 rows at a 50257 vocabulary). Measured on a 2-core Zen 3 at 768 x 50257 (bench.py
  --loss-chunks): 64 rows 443 ms, 128 418, 192 386, 256 376, 384 358-373, 512 378, 768 (one chunk)
  373 ms a step, full logits + F.cross_entropy 418 ms; bigger chunks mean fewer passes over the head's
  (V, C) gradient, and past ~384 rows they stop paying while the buffer keeps growing.
- A small vocabulary (a char model: 65 ids), on any device: the full logits are a few hundred KB, and
  one matmul + cross_entropy costs less than the chunks' many small ops (char step, 2-core CPU: 25.2
  against 26.0 ms).
- CUDA with torch.compile: the full logits inside the compiled graph, where Inductor fuses the
  log-softmax into few kernels; the chunked path stays eager (a graph break) and runs many small
  launches (see the GPU rows of bench.py for the measurement).
- CUDA without compile: chunks sized from free memory, so a chunk's fp32 logits take at most 1/16 of
  it (at most 8192 rows): few launches, bounded memory.
"""
from __future__ import annotations

import torch

from model import GPT

CHUNK_BYTES = 80 * 2**20  # CPU: a chunk's fp32 logits; see above
SMALL_VOCAB = 8192  # below this the logits are small, and one matmul + cross_entropy beats chunking


def choose_loss_chunk_rows(device: torch.device, *, compiled: bool, vocab_size: int) -> int | None:
    if vocab_size < SMALL_VOCAB:
        return None
    if device.type != "cuda":
        return max(64, CHUNK_BYTES // (4 * vocab_size) // 64 * 64)
    if compiled:
        return None
    free, _ = torch.cuda.mem_get_info(device)
    rows = free // 16 // (vocab_size * 4)
    return int(max(256, min(8192, rows // 256 * 256)))


def use_loss_path(model: GPT, device: torch.device, *, compiled: bool, rows: int | None | str = "auto") -> GPT:
    """Set how `model` computes its training loss: chunks of choose_loss_chunk_rows(...) rows of the fused
    head + loss, or the full logits (None); `rows` given explicitly overrides the choice (the benchmark
    compares both). Returns the model."""
    model.loss_chunk_rows = (choose_loss_chunk_rows(device, compiled=compiled, vocab_size=model.config.vocab_size)
                             if rows == "auto" else rows)
    return model
