"""The training loss of a GPT, and how it runs on this device: `LMLoss`, made once by the chain of builders
(training/builders.py: `loss_path(...)`, then the measured weight-gradient product), and called by the
training step, the evals, the benchmarks and the tests as `loss(model, idx, targets)`. The model itself
computes logits and nothing else; the loss reaches it through GPT.forward's `output` (see LMLoss).

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
  it (at most 8192 rows): few launches, bounded memory. Each chunk's softmax is shifted by its max at once
  (always_shift), where a CPU first tries it unshifted and checks on the host: a GPU's step then reads
  nothing on the host, so its launches queue ahead and it can be one CUDA graph (training/graphs/step.py).

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
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

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
                           measure, lambda v: isinstance(v, str) and v in WEIGHT_GRAD_PRODUCTS)  # (a list is unhashable)
    name = entry["value"]
    return name, (f"LM head's weight gradient ({chunks} chunk{'s' if chunks > 1 else ''} of {vocab_size} x {rows} x "
                  f"{n_embd} a step) by {name}: {entry.get('note', '')} ({source})")


@dataclass(frozen=True)
class LMLoss:
    """loss(model, idx, targets) -> the mean cross-entropy of the model's next-token logits over the
    targets != -1 (0 where every target is -1), a 0-dim fp32 (fp64 for an fp64 model) tensor.

    How it runs, decided once for the run: `chunk_rows` rows at a time of the LM head fused with the loss
    (model/fused_ce.py: the (B, T, vocab) logits are never held), exponentiated `exp_block_rows` rows at
    a time, the weight's gradient by the WEIGHT_GRAD_PRODUCTS way `product`; chunk_rows None: through the
    full logits (model.head) and F.cross_entropy. The default, LMLoss(), is the textbook loss.

    `model` is what the step runs: the GPT itself, or it compiled and/or wrapped by DDP or FSDP. The loss
    is computed inside that module's forward (GPT.forward's `output`, given the final hidden states and
    the GPT): DDP's hooks see one forward with the loss as its output, FSDP's gathered lm_head weight is
    there while the head runs, and torch.compile traces it with the model (the chunked path itself stays
    eager: a graph break). What is passed is a small object holding the targets, of one type for every
    call, so a compiled model guards on its type and fields and is not recompiled step after step.
    """
    chunk_rows: int | None = None
    exp_block_rows: int | None = None
    product: str = DEFAULT_PRODUCT
    always_shift: bool = False  # a chunk's softmax shifted by its max without a host check first (a GPU's)

    def __call__(self, model: torch.nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return model(idx, output=_HeadLoss(self, targets))

    def of_hidden(self, hidden: torch.Tensor, gpt: GPT, targets: torch.Tensor) -> torch.Tensor:
        """The loss of the final hidden states (B, T, C) of `gpt` (the plain GPT) against targets (B, T)."""
        h, t = hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1)
        if self.chunk_rows:
            # imported here, not at the top: its torch.compiler.disable pulls in torch._dynamo (~0.7 s of
            # every start-up), which sampling and export never need
            from model.fused_ce import linear_cross_entropy

            return linear_cross_entropy(h, gpt.lm_head.weight, t, chunk_rows=self.chunk_rows,
                                        softcap=gpt.config.logit_softcap, exp_block_rows=self.exp_block_rows,
                                        weight_grad_mm=WEIGHT_GRAD_PRODUCTS[self.product],
                                        always_shift=self.always_shift)
        logits = gpt.head(h)
        # bf16/fp16 logits are upcast for the softmax; fp32 and fp64 stay as they are. A sum over the counted
        # targets, then / their count: F.cross_entropy's own mean is NaN where every target is -1.
        acc = torch.promote_types(logits.dtype, torch.float32)
        total = F.cross_entropy(logits.to(acc), t, ignore_index=-1, reduction="sum")
        return total / (t != -1).sum().clamp(min=1)


class _HeadLoss:
    """GPT.forward's `output`: LMLoss.of_hidden with the targets bound."""
    __slots__ = ("loss", "targets")

    def __init__(self, loss: LMLoss, targets: torch.Tensor):
        self.loss, self.targets = loss, targets

    def __call__(self, hidden: torch.Tensor, gpt: GPT) -> torch.Tensor:
        return self.loss.of_hidden(hidden, gpt, self.targets)


def loss_path(device: torch.device, *, compiled: bool, vocab_size: int, rows: int | None | str = "auto",
              product: str = DEFAULT_PRODUCT) -> LMLoss:
    """The loss for this device: chunks of choose_loss_chunk_rows(...) rows of the fused head + loss, or
    the full logits (None); `rows` given explicitly overrides the choice (the run plan's, the benchmark's
    comparison); the blocks a chunk is exponentiated in (choose_exp_block_rows). The weight gradient's
    product is a measured choice a run makes once and keeps (choose_weight_grad_product): `product`."""
    rows = choose_loss_chunk_rows(device, compiled=compiled, vocab_size=vocab_size) if rows == "auto" else rows
    # a CPU tries each chunk unshifted and checks on the host (one pass less over logits that fit no cache);
    # elsewhere the host read would stall the queue of launches, and a CUDA-graphed step can't hold it
    return LMLoss(rows, choose_exp_block_rows(device, rows), product, always_shift=device.type != "cpu")
