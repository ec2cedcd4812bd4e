"""Sampling's set-up, shared by sample.py, chat.py, serve.py and the benchmark: choose the dtype
(runtime/precision.py's inference_dtype, which on a CPU times this model's decoding in fp32 and in
prepacked bf16) and get the model ready for it (`prepare_for_decoding`: device, dtype, then the compiled
decode step or, on a CPU in bf16, the Linear weights prepacked in oneDNN's layout). The model itself
knows nothing of this."""
from __future__ import annotations

import copy
import dataclasses
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from errors import UserError
from model import GPT
from model.generate import decode_one_token, generate

from .choices import auto_dtype
from .device import with_compile_fallback
from .precision import inference_dtype
from .static_decode import StaticDecode


class _PackedLinear(torch.nn.Module):
    """An nn.Linear whose weight is stored once in oneDNN's blocked layout (CPU, bf16). The plain
    layout is re-blocked on every call, which costs more than the product itself for one token."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def prepack_for_cpu(model) -> bool:
    """For inference only: on a CPU, for a bf16 model, put every Linear's weight in oneDNN's blocked
    layout once (1.3-1.5x faster decoding of GPT-2-124M on a 2-core AVX512-BF16 CPU, same results).
    Returns False and changes nothing elsewhere (other device or dtype, no oneDNN). Apply it last:
    the packed model can no longer be moved, cast, trained or saved.
    """
    weight = model.transformer.wte.weight
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, torch.nn.Linear)]
    try:  # the ops are oneDNN internals: check that this build has them and that they agree with F.linear
        probe = _PackedLinear(targets[0][2])
        x = torch.randn(2, targets[0][2].in_features, dtype=weight.dtype)
        with torch.inference_mode():
            if not torch.allclose(probe(x).float(), targets[0][2](x).float(), rtol=1e-2, atol=1e-2):
                return False
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    for parent, name, child in targets:
        setattr(parent, name, _PackedLinear(child))
    return True


class CompiledDecode:
    """decode_one_token compiled; if torch.compile fails (no C++ compiler, an unsupported backend) the
    step is redone with the plain function and decoding goes on without compile (with_compile_fallback)."""

    def __init__(self, device: torch.device, say: Callable[[str], None]):
        # on CUDA, batch-1 decoding of a small model is bound by kernel launches: CUDA graphs
        # (mode="reduce-overhead") replay the whole step as one launch
        mode = "reduce-overhead" if device.type == "cuda" else None
        self.fn, self.compiled, self.say = torch.compile(decode_one_token, fullgraph=True, mode=mode), True, say

    def __call__(self, *args):
        return with_compile_fallback(lambda: self.fn(*args), compiled=self.compiled, go_eager=self.go_eager,
                                     say=self.say)

    def go_eager(self) -> None:
        self.fn, self.compiled = decode_one_token, False


# sample.py's default for --compile. On a GPU the default step is the CUDA graph of runtime/static_decode.py:
# no compile, its capture within the first call. Measured on one H100 for GPT-2 124M, batch 1, bf16, 128 new
# tokens (benchmarks/results/h100-2026-11-27/decode.log, 2026-11-27): the graphed step 0.852 ms a token
# (first call, capture included, 1.24 s), torch.compile's mode="reduce-overhead" step 0.945 ms (first call
# 16.8 s: the compile), eager 6.82 ms. The graph of the unfused kernels beat the compiled graph of fused
# ones, so on this model the default never compiles; the rule stays, per layer, for a model where
# compiling wins (--compile still asks for it).
GRAPH_S_PER_LAYER_STEP = 0.852e-3 / 12
COMPILED_S_PER_LAYER_STEP = 0.945e-3 / 12
COMPILE_COST_S = 16.7  # the compiled step's first call less a graphed call's (was a 40 s guess before it was measured)


def decode_compile(flag: bool | None, device: torch.device, *, steps: int, n_layer: int) -> tuple[bool, str | None]:
    """(compile the decode step?, a one-line notice or None). `flag`: --compile / --no-compile, or None
    (the default: decide). A CPU decodes eagerly (its step is bound by the matmuls, not by launches); a
    GPU compiles when `steps` one-token steps of `n_layer` layers save more than the compile costs over
    the CUDA-graphed step it would otherwise run."""
    if flag is not None:
        return flag, None
    if device.type != "cuda":
        return False, None
    saved_s = steps * n_layer * (GRAPH_S_PER_LAYER_STEP - COMPILED_S_PER_LAYER_STEP)
    if saved_s <= COMPILE_COST_S:
        return False, None
    return True, (f"compiling the decode step: {steps} steps of {n_layer} layers save ~{saved_s:.0f} s over the "
                  f"CUDA-graphed step, more than the ~{COMPILE_COST_S:.0f} s compile (--no-compile skips it)")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prepare_for_decoding(model, device, dtype, *, compile: bool = False, say: Callable[[str], None] = _stderr):
    """sample.py's set-up, shared with the benchmark so that it times what users run: the weights on
    `device` in `dtype`, then the one-token decode step compiled (compile=True), or on a GPU captured as a
    CUDA graph, or, for bf16 on a CPU, the Linear weights prepacked for oneDNN. Returns (model, decode_fn or None, prepacked)."""
    model = model.to(device=device, dtype=dtype).eval()
    if compile:
        decode_fn = CompiledDecode(device, say)
    elif device.type == "cuda":  # launch-bound: the step replayed as one CUDA graph over static buffers
        decode_fn = StaticDecode(model, capture=True)
    else:
        decode_fn = None
    packed = not compile and prepack_for_cpu(model)  # CPU bf16 only: oneDNN weight layout, done once
    return model, decode_fn, packed


PROBE_PROMPT, PROBE_TOKENS = 8, 4  # the timed work: a prefill of 8 tokens, then 4 one-token steps


@dataclass
class Decoding:
    model: GPT  # on the device, in `dtype`, eval mode (prepacked on a CPU in bf16)
    decode_fn: Callable | None  # the compiled one-token step, or None
    dtype: torch.dtype
    prepacked: bool
    note: str  # how the dtype was chosen


def setup_decoding(model: GPT, device: torch.device, dtype: str = "auto", *, compile: bool = False,
                   say: Callable[[str], None] = _stderr) -> Decoding:
    """`model` (on the CPU, fp32) ready to sample from with --dtype=dtype. With --compile the dtype is
    not measured (that would compile each candidate): auto then follows the rule without a probe."""
    ready: dict[torch.dtype, tuple] = {}

    def prepared(dt: torch.dtype):
        if dt not in ready:
            ready[dt] = prepare_for_decoding(copy.deepcopy(model), device, dt, compile=compile, say=say)
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


def check_logits_finite(model, device: torch.device, desc: str, dtype: torch.dtype) -> None:
    """One token through the model, before anything is generated: logits that are NaN or inf (NaN weights, or
    finite ones that overflow in this dtype: a diverged run's checkpoint) leave nothing to sample: torch.multinomial
    failed with a traceback, top-p's cut indexed -1, greedy printed token 0 of all-NaN rows as text."""
    with torch.inference_mode():
        logits = model(torch.zeros(1, 1, dtype=torch.long, device=device))
    if not bool(torch.isfinite(logits).all()):
        other = "" if dtype == torch.float32 else ", or --dtype float32"
        raise UserError(f"{desc}: the model's logits are NaN or inf, so no token can be drawn (its weights are NaN, or "
                        f"overflow in {str(dtype).removeprefix('torch.')}: a diverged run's checkpoint?); use best.pt or an "
                        f"earlier checkpoint{other}")
