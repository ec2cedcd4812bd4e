"""The optimizers. "adamw": AdamW in two parameter groups (weight decay on matrices and embeddings,
none on biases and norms). "muon" (the modern recipe): `Muon` (below) for the hidden matrices of the
blocks, which it orthogonalises (Newton-Schulz), and AdamW as above for everything else: embeddings,
the LM head, biases and norm gains, whose shapes Muon is not meant for. `make_optimizers` returns a
list; the training step, the schedule and the checkpoint handle any number of optimizers."""
from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.nn as nn

from runtime.precision import fastest_native_dtype


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Every parameter with 2+ dims (Linear weights, embeddings) decays; 1-dim ones (biases, LayerNorm) do not.
    Tied parameters appear once (named_parameters de-duplicates)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                   device_type: str) -> torch.optim.AdamW:
    """The fused kernel on CUDA (one launch for all parameters) and on CPU (measured here: 3.5 ms per step
    against 14.3 ms for foreach on the 4-layer, 50k-vocab model); the foreach path elsewhere (e.g. MPS)."""
    fused = device_type in ("cuda", "cpu")
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, fused=fused,
                             foreach=None if fused else True)


# the 2-D weights inside the blocks, by their GPT-2 names
HIDDEN_MATRICES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# c_attn holds q, k and v stacked by rows, (3C, C): three maps that Muon may orthogonalise one by one
FUSED_QKV = "attn.c_attn.weight"
OPTIMIZERS = ("adamw", "muon")


def split_for_muon(model: nn.Module) -> tuple[list[str], list[str]]:
    """(names Muon gets: the blocks' hidden matrices, names AdamW gets: everything else). Tied
    parameters appear once (named_parameters de-duplicates)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    hidden = [n for n in names if n.startswith("transformer.h.") and n.endswith(HIDDEN_MATRICES)]
    return hidden, [n for n in names if n not in hidden]


# The quintic Newton-Schulz iteration X <- aX + b(XX^T)X + c(XX^T)^2 X of Keller Jordan's Muon: its
# slope at 0 (a) is as large as keeps it stable, so 5 steps push every singular value into ~[0.7, 1.2]
# rather than converging to exactly 1; the update's directions (U, V of the SVD) are kept exactly.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(G: torch.Tensor, steps: int = 5, coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                  dtype: torch.dtype | None = None, eps: float = 1e-7) -> torch.Tensor:
    """Orthogonalise each matrix of G, (m, n) or (k, m, n): U f(S) V^T where G = U S V^T, computed in
    `dtype` (default G's) and returned in G's dtype. Each matrix is first scaled to Frobenius norm 1,
    so its spectral norm is <= 1; a tall one is worked on transposed, so the Gram matrix XX^T is the
    small side. With coefficients (1.5, -0.5, 0) and enough steps this is the classic iteration that
    converges to the polar factor U V^T."""
    X = G.to(dtype or G.dtype)
    X = X.unsqueeze(0) if X.dim() == 2 else X  # (k, m, n)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    a, b, c = coefficients
    for _ in range(steps):
        A = X @ X.mT  # (k, m, m), m the smaller side
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b A + c A^2
        X = torch.baddbmm(X, B, X, beta=a)  # a X + B X
    if tall:
        X = X.mT
    return X.reshape(G.shape).to(G.dtype)


class Muon(torch.optim.Optimizer):
    """MomentUm Orthogonalized by Newton-Schulz, for 2-D weights: Nesterov momentum, then the update
    orthogonalised (newton_schulz) and scaled by sqrt(max(1, rows / cols)), decoupled weight decay:

        buf = momentum * buf + (1 - momentum) * grad
        update = newton_schulz((1 - momentum) * grad + momentum * buf)      (nesterov; else buf)
        p = p * (1 - lr * weight_decay) - lr * sqrt(max(1, rows / cols)) * update

    The same update (per piece, below), hyperparameters and state ("momentum_buffer") as torch.optim.Muon,
    so checkpoints of either load into the other. What differs is where the time goes: the Newton-Schulz iterations
    run in `ns_dtype`, chosen by the caller from the device (bf16 where it is native, fp32 elsewhere:
    torch.optim.Muon always uses bf16, emulated ~25x slower on AVX2-only CPUs), on all the matrices of
    one shape at once (one batched matmul per product instead of one per matrix).

    `pieces` (one per parameter in param-group order, default 1) cuts a parameter's rows into that many
    equal matrices, each orthogonalised and scaled (rows / pieces against cols) on its own: c_attn's q, k
    and v (3 pieces), as modded-nanogpt does, since they are three maps that merely share a matmul. So the
    update equals torch.optim.Muon's applied to each piece; on c_attn it equals torch's whole-matrix update
    only with pieces 1 (train.muon_split_qkv=false). It is not saved with the state either, so the state
    stays torch.optim.Muon's."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.0,
                 nesterov: bool = True, ns_steps: int = 5, ns_dtype: torch.dtype = torch.float32,
                 pieces: list[int] | None = None):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                                      ns_steps=ns_steps, ns_coefficients=NS_COEFFICIENTS, eps=1e-7))
        params = [p for group in self.param_groups for p in group["params"]]  # a list, or param groups
        for p in params:
            if p.dim() != 2:
                raise ValueError(f"Muon takes 2-D weights only, got a parameter of shape {tuple(p.shape)}")
        self.ns_dtype = ns_dtype  # not a hyperparameter: the device's, so not saved with the state
        pieces = pieces or [1] * len(params)
        if len(pieces) != len(params) or any(n < 1 or p.shape[0] % n for p, n in zip(params, pieces)):
            raise ValueError("Muon's pieces: one per parameter, each dividing its rows")
        self.pieces = dict(zip(params, pieces))  # keyed by the parameter, as torch keys optimizer state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            bufs = []
            for p in params:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                bufs.append(state["momentum_buffer"])
            m = group["momentum"]
            torch._foreach_lerp_(bufs, grads, 1 - m)
            updates = torch._foreach_lerp(grads, bufs, m) if group["nesterov"] else bufs
            by_shape: dict[tuple, list[int]] = defaultdict(list)
            for i, p in enumerate(params):
                by_shape[(*p.shape, self.pieces.get(p, 1))].append(i)
            lr, wd = group["lr"], group["weight_decay"]
            # Decay, then the update, each one foreach launch for many matrices (a GPU's eager step is bound by
            # launches). A recorded step reads its rate on the device (training/graphs/step.py): cast to the
            # weights' dtype first, as a float rate is inside the kernel (the same numbers), since foreach's fast
            # path takes a scalar tensor of the list's own dtype only.
            on_device = isinstance(lr, torch.Tensor)
            dt = params[0].dtype
            torch._foreach_mul_(params, (1 - lr * wd).to(dt) if on_device else 1 - lr * wd)
            for (rows, cols, pieces), idx in by_shape.items():
                ortho = self.orthogonalize([updates[i] for i in idx], group, pieces)
                scale = math.sqrt(max(1.0, rows / pieces / cols))
                mine, theirs = [params[i] for i in idx], [ortho[k] for k in range(len(idx))]
                if on_device:
                    torch._foreach_sub_(mine, torch._foreach_mul(theirs, (lr * scale).to(dt)))
                else:
                    torch._foreach_add_(mine, theirs, alpha=-lr * scale)
        return loss


    def orthogonalize(self, updates: list[torch.Tensor], group: dict, pieces: int = 1) -> torch.Tensor:
        """The Newton-Schulz iteration on updates of one shape, batched: (n, rows, cols), each cut by rows
        into `pieces` matrices of (rows / pieces, cols) that are orthogonalised separately."""
        stacked = torch.stack(updates)  # (n, rows, cols)
        n, rows, cols = stacked.shape
        ortho = newton_schulz(stacked.reshape(n * pieces, rows // pieces, cols), group["ns_steps"],
                              tuple(group["ns_coefficients"]), dtype=self.ns_dtype, eps=group["eps"])
        return ortho.reshape(n, rows, cols)


def make_optimizers(model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                    device_type: str, kind: str = "adamw", muon_lr: float = 0.02,
                    muon_momentum: float = 0.95, muon_ns_steps: int = 5, muon_split_qkv: bool = True,
                    ns_dtype: torch.dtype | None = None,
                    muon_class: type[Muon] | None = None) -> list[torch.optim.Optimizer]:
    """The optimizers of a training run. Each param group records its peak learning rate as
    "initial_lr"; the schedule scales every group by the same factor (training/timing/schedule.py). Muon's
    Newton-Schulz dtype: `ns_dtype`, by default the device's fastest native one (bf16 on CUDA and on
    CPUs with AMX / AVX512-BF16, fp32 elsewhere). `muon_class`: Muon, or a subclass for sharded weights."""
    if kind == "adamw":
        optimizers = [make_optimizer(model, lr=lr, weight_decay=weight_decay, betas=betas, device_type=device_type)]
    else:
        params = dict(model.named_parameters())
        hidden, rest = split_for_muon(model)
        muon = (muon_class or Muon)([params[n] for n in hidden], lr=muon_lr, momentum=muon_momentum,
                                    weight_decay=weight_decay, ns_steps=muon_ns_steps,
                                    ns_dtype=ns_dtype or fastest_native_dtype(torch.device(device_type)),
                                    pieces=[3 if muon_split_qkv and n.endswith(FUSED_QKV) else 1 for n in hidden])
        others = [params[n] for n in rest]
        fused = device_type in ("cuda", "cpu")
        adamw = torch.optim.AdamW([{"params": [p for p in others if p.dim() >= 2], "weight_decay": weight_decay},
                                   {"params": [p for p in others if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=lr, betas=betas, fused=fused, foreach=None if fused else True)
        optimizers = [muon, adamw]
    for opt in optimizers:
        for group in opt.param_groups:
            group.setdefault("initial_lr", group["lr"])
    return optimizers
