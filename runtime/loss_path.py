"""How the LM head's loss runs on this device, applied to the model from outside: `use_loss_path(model,
device, compiled=...)`, one line beside compile and DDP, and `use_weight_grad_product(model, name)` (this
module is the only code that sets GPT's loss_* attributes).

With a 50k vocabulary the head is the largest matmul of a small GPT, and the (B*T, V) logits the
largest tensor. Where the logits go depends on the hardware:
- CPU: the fused, chunked head + loss (model/fused_ce.py), in chunks whose fp32 logits take at most
  CHUNK_BYTES (768 rows at a 50257 vocabulary). Measured on a 2-core Zen 3 at 768 x 50257 (bench.py
  --loss-chunks, before the changes below): 64 rows 443 ms, 128 418, 192 386, 256 376, 384 358-373, 512
  378, 768 (one chunk) 373 ms a step, full logits + F.cross_entropy 418 ms; bigger chunks mean fewer
  passes over the head's (V, C) gradient, and past ~384 rows they stopped paying there.
- A small vocabulary (a char model: 65 ids), on any device: the full logits are a few hundred KB, and
  one matmul + cross_entropy costs less than the chunks' many small ops (char step, 2-core CPU: 25.2
  against 26.0 ms).
- CUDA with torch.compile: the full logits inside the compiled graph, where Inductor fuses the
  log-softmax into few kernels; the chunked path stays eager (a graph break) and runs many small
  launches (see the GPU rows of bench.py for the measurement).
- CUDA without compile: chunks sized from free memory, so a chunk's fp32 logits take at most 1/16 of
  it (at most 8192 rows): few launches, bounded memory.

How a chunk runs on a CPU (model/fused_ce.py's options, set here too):
- its (V, n) logits are exponentiated and summed EXP_BLOCK_BYTES at a time, each block summed while it
  is in cache (on a GPU in one op each: a block would be two kernel launches);
- the weight gradient's (V, n) @ (n, C) product runs in torch.mm (MKL on x86) or in oneDNN's matmul,
  whichever is faster on this CPU for the run's chunks, timed once per machine, shape and chunk count and
  kept (runtime/choices.py); a run chooses once and saves its choice, which a resume keeps
  (the run plan's loss_product: training/builders.py's settle_loss_product).
  On a 2-core EPYC Zen 4 (2026-11-25, 768 x 50257 x 128): torch.mm 71-78 ms, oneDNN 51 ms (MKL runs its
  AVX2 code on AMD CPUs, oneDNN its AVX-512 code); under ONEDNN_MAX_CPU_ISA=AVX2 67-71 against 61-67 ms. The
  other two head products (the logits, the input's gradient) measured no faster in oneDNN, so they stay.

With oneDNN's product the BPE step went from 267 to 243 ms on that CPU, and 768-row chunks (one per
step of the CPU recipe) became faster than 384-row ones (258 ms), where on the Zen 3 above they had
tied: CHUNK_BYTES went from 80 to 150 MiB.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from model import GPT

from .choices import cached
from .precision import fastest

CHUNK_BYTES = 150 * 2**20  # CPU: a chunk's fp32 logits; see above
SMALL_VOCAB = 8192  # below this the logits are small, and one matmul + cross_entropy beats chunking
EXP_BLOCK_BYTES = 4 * 2**20  # CPU: logits exponentiated and summed at a time, within L2 + L3
MEASURE_BUDGET_S = 2.0  # what a timing of the weight-gradient product may cost (two where a step has several chunks)
PRODUCT_MARGIN = 0.05  # oneDNN's product is taken where it is faster than torch.mm's by more than this


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


def choose_exp_block_rows(device: torch.device, chunk_rows: int | None) -> int | None:
    """Rows of a chunk's (V, n) logits exponentiated and summed at a time: EXP_BLOCK_BYTES' worth on a
    CPU, None (the whole chunk) elsewhere."""
    if device.type != "cpu" or chunk_rows is None:
        return None
    return max(8, EXP_BLOCK_BYTES // (4 * chunk_rows))


def onednn_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for fp32 matrices by oneDNN's matmul (the op Inductor's CPU backend calls; it takes the
    second operand transposed); torch.mm for any other dtype (oneDNN has no fp64), and should oneDNN
    refuse a layout."""
    if a.dtype == b.dtype == torch.float32:
        try:
            return torch.ops.mkldnn._linear_pointwise(a, b.t(), None, "none", [], "")
        except (RuntimeError, AttributeError):  # a layout it refuses; a torch without the op
            pass
    return torch.mm(a, b)


def _has_onednn_matmul() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return callable(torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):  # a torch built without it
        return False


def weight_grad_product_available(device: torch.device) -> bool:
    """Whether oneDNN's product can run here: a CPU whose torch has the op."""
    return device.type == "cpu" and _has_onednn_matmul()


# The ways to make the fused loss's weight gradient, by name (the name is what a run saves): None = torch.mm
WEIGHT_GRAD_PRODUCTS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None] = {
    "torch.mm": None, "oneDNN": onednn_mm}
DEFAULT_PRODUCT = "torch.mm"  # also what every run made before the choice existed


def choose_weight_grad_product(device: torch.device, *, vocab_size: int, rows: int | None, n_embd: int,
                               chunks: int = 1) -> tuple[str, str]:
    """How the fused loss makes the weight gradient on this device -> (a WEIGHT_GRAD_PRODUCTS name, a note
    saying which and where the choice came from; '' where there is nothing to choose).

    On a CPU with oneDNN: oneDNN's matmul where it is more than 5% faster than torch.mm on this CPU for a
    step's `chunks` chunks of `rows` rows (and agrees with torch.mm), timed once per machine and shape and
    kept (runtime/choices.py). What is timed is what a step runs: the first chunk's product, and where there
    are more, one more chunk's added to it (torch.mm adds in place with addmm_, oneDNN makes a product and
    adds it: at some shapes the first is faster in oneDNN and the rest in torch.mm), then counted as a step
    of `chunks` chunks runs them."""
    if rows is None or not weight_grad_product_available(device):
        return DEFAULT_PRODUCT, ""

    def measure() -> dict:
        from model.fused_ce import add_weight_grad  # here: it imports torch._dynamo (~0.7 s), runs need it anyway

        gen = torch.Generator().manual_seed(0)  # a private generator: the run's RNG stays untouched
        a = torch.rand(vocab_size, rows, generator=gen)  # non-negative, as the softmax's numerators are
        b = torch.randn(rows, n_embd, generator=gen)
        ref = torch.mm(a, b)
        if not torch.allclose(onednn_mm(a, b), ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max())):
            return {"value": DEFAULT_PRODUCT, "note": "oneDNN's product disagreed with torch.mm"}
        names = tuple(WEIGHT_GRAD_PRODUCTS)
        _, first = fastest(names, lambda name: add_weight_grad(None, a, b, WEIGHT_GRAD_PRODUCTS[name]), device,
                           budget_s=MEASURE_BUDGET_S)
        more = dict.fromkeys(names, 0.0)
        if chunks > 1:
            _, more = fastest(names, lambda name: add_weight_grad(ref, a, b, WEIGHT_GRAD_PRODUCTS[name]), device,
                              budget_s=MEASURE_BUDGET_S)
        # a candidate fastest() abandoned (over 2x the other's first call) never wins
        step = {n: first.get(n, math.inf) + (chunks - 1) * more.get(n, math.inf) for n in names}
        pick = "oneDNN" if step["oneDNN"] < (1 - PRODUCT_MARGIN) * step[DEFAULT_PRODUCT] else DEFAULT_PRODUCT
        return {"value": pick, "note": ", ".join(f"{s * 1e3:.1f} ms by {n}" for n, s in step.items())}

    entry, source = cached("loss weight-gradient product", {"shape": [vocab_size, rows, n_embd], "chunks": chunks},
                           measure)
    name = entry["value"] if entry.get("value") in WEIGHT_GRAD_PRODUCTS else DEFAULT_PRODUCT
    return name, (f"LM head's weight gradient ({chunks} chunk{'s' if chunks > 1 else ''} of {vocab_size} x {rows} x "
                  f"{n_embd} a step) by {name}: {entry.get('note', '')} ({source})")


def use_weight_grad_product(model: GPT, name: str) -> GPT:
    """Make `model`'s fused loss build its weight gradient the WEIGHT_GRAD_PRODUCTS way `name`."""
    model.loss_weight_grad_mm = WEIGHT_GRAD_PRODUCTS[name]
    return model


def use_loss_path(model: GPT, device: torch.device, *, compiled: bool, rows: int | None | str = "auto") -> GPT:
    """Set how `model` computes its training loss: chunks of choose_loss_chunk_rows(...) rows of the fused
    head + loss, or the full logits (None); `rows` given explicitly overrides the choice (the benchmark
    compares both); and the blocks a chunk is exponentiated in (choose_exp_block_rows). The weight
    gradient's product is a measured choice a run makes once and keeps: use_weight_grad_product.
    Returns the model."""
    model.loss_chunk_rows = (choose_loss_chunk_rows(device, compiled=compiled, vocab_size=model.config.vocab_size)
                             if rows == "auto" else rows)
    model.loss_exp_block_rows = choose_exp_block_rows(device, model.loss_chunk_rows)
    return model
