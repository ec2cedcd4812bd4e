"""Cross-entropy of the LM head, fused with the head's matmul and computed a chunk of rows at a time.

With a 50k vocabulary the plain `F.cross_entropy(x @ W.T, targets)` writes a (B*T, V) logits tensor,
reads it again for log_softmax, writes its gradient, and so on: at B*T=768 that is 154 MB per pass in
fp32, and that memory traffic (and allocating it afresh every step) can cost more than the matmuls.
Here each chunk of rows goes logits -> exp(z) (as exp2 of base-2 logits; shifted by the max only where
needed) -> the two gradient matmuls in one reused buffer, with as few passes over it as the math allows
(the softmax's division is applied to the small (n, C) operands instead), and only the (N, C) and (V, C)
gradients are kept. The gradients are computed in the forward pass (the backward only scales them by
the incoming gradient), so nothing of size (N, V) outlives a chunk.

How it runs on a device is chosen from outside the model (runtime/loss_path.py): the rows per chunk, the
rows of the logits exponentiated and summed at a time (`exp_block_rows`), and the matmul that makes the
weight's gradient (`weight_grad_mm`).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

# The logits are made in base 2, z * log2(e), and exponentiated by exp2: a CPU's exp2 is cheaper than exp (no
# range reduction by ln 2: 8 against 13 ms per 384 x 50257 chunk on a 2-core Zen 3), and the factor costs
# nothing where it goes (into the chunk's (n, C) rows of x, or into the soft-cap's multiply).
LOG2E, LN2 = 1 / math.log(2), math.log(2)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The matmul dtype autocast would pick here (bf16/fp16 under autocast, else x's own dtype)."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return x.dtype


def _chunk_logits_t(xs, wc, flat):
    """(V, n) logits of one chunk of n rows, transposed, in flat's dtype (fp32, or fp64 for fp64 inputs).

    Transposed because a CPU's BLAS runs W @ x.T about 1.5x faster than x @ W.T at these shapes (K = C
    is small, and the (V, n) output is written in long runs: 16 against 24 ms per 128 rows at 128 x 50257
    on a 2-core Zen 3), and the two gradient matmuls read it as fast either way. When the matmul runs in
    flat's dtype the logits go straight into the reused buffer: allocating ~25 MB afresh per chunk costs
    page faults that can be as slow as the matmul itself."""
    out = flat[: wc.shape[0] * xs.shape[0]].view(wc.shape[0], xs.shape[0])  # contiguous for a partial chunk too
    if xs.dtype == flat.dtype:
        return torch.mm(wc, xs.t(), out=out)
    return out.copy_(wc @ xs.t())  # bf16/fp16 matmul, softmax statistics in fp32


def _softcap_(z, softcap, tanh_flat, scale=1.0):
    """z <- scale * softcap * tanh(z / softcap) in place; returns the tanh (kept for the derivative 1 - tanh^2)."""
    th = torch.div(z, softcap, out=tanh_flat[: z.numel()].view_as(z)).tanh_()
    torch.mul(th, softcap * scale, out=z)
    return th


# Sums of exp(z) over a column that show no exp overflowed or lost the terms that matter: an overflow makes
# the sum inf; a sum >= 1e-20 has a largest term >= 1e-20 / V, a normal float for any vocabulary (so the
# terms that matter keep full precision), and the terms under fp32's normal range add < V * 1.2e-38 to it.
SAFE_SUMS = (1e-20, 1e30)


def _exp2_sums_(z, block_rows):
    """z (V, n) <- 2^z in place; returns its column sums (1, n). With block_rows, that many rows at a time,
    each block summed while its exp2 is still in cache: a CPU's caches hold no chunk's logits (154 MB at
    768 x 50257), and the sum over the rows of the whole tensor afterwards reads it from memory again, and
    slowly (768 x 50257 on a 2-core EPYC Zen 4: exp2 then the sum 15.8 ms, in blocks of 1024 rows 10.0 ms).
    None: one exp2 and one sum over the whole chunk (a GPU, where every block would be two launches)."""
    if not block_rows or block_rows >= z.shape[0]:
        return z.exp2_().sum(dim=0, keepdim=True)
    total = torch.zeros((1, z.shape[1]), dtype=z.dtype, device=z.device)
    for start in range(0, z.shape[0], block_rows):
        total += z[start:start + block_rows].exp2_().sum(dim=0, keepdim=True)
    return total


def _exp_shifted_(z, t, again, block_rows, always_shift=False):
    """z (V, n), logits in base 2 (log2(e) times the natural ones) <- the softmax's numerators
    2^(z - shift) in place; returns the per-column loss logsumexp (natural) - logit[target] (n,), the
    numerators' sums (1, n) and z (the same buffer). The division by the sums is left to the (n, C)
    operands of the matmuls that follow (cheap), and the loss never takes the log of a probability that
    could underflow.

    The shift is 0 when that is safe, the column's max otherwise. exp(z) is tried first: the max and the
    subtraction are two of the few passes over the (V, n) logits, which don't fit in any cache (77 MB at
    384 x 50257), and logits are rarely large. When a column's sum shows it was not safe (SAFE_SUMS),
    `again()` computes z again into the same buffer, and it is shifted by its max. The check reads n
    numbers on the host: a sync per chunk, a few per step. `always_shift`: the max shift straight away, no
    host read (a GPU: a sync stalls its queue of launches, and a CUDA graph can hold none; its passes are
    cheap)."""
    target_z = z.gather(0, t)  # (1, n)
    if not always_shift:
        total = _exp2_sums_(z, block_rows)  # (1, n)
        if bool(((total >= SAFE_SUMS[0]) & (total <= SAFE_SUMS[1])).all()):
            return (total.log() - target_z * LN2).squeeze(0), total, z
        z = again()
    zmax = z.amax(dim=0, keepdim=True)  # (1, n)
    total = _exp2_sums_(z.sub_(zmax), block_rows)
    return ((zmax - target_z) * LN2 + total.log()).squeeze(0), total, z


def _base2_rows(x, xc, acc, compute_dtype, softcap):
    """The rows of x that make base-2 logits: x * log2(e), scaled before the cast to the matmul dtype (one
    rounding, as xc has). With a soft-cap the factor goes after the tanh instead, so these are xc."""
    return xc if softcap else (x.to(acc) * LOG2E).to(compute_dtype)


def add_weight_grad(grad_w, de, x_scaled, product=None):
    """grad_w + de @ x_scaled, the (V, C) weight gradient of one chunk added to those before it: the first
    chunk's product is the gradient (grad_w None: no zero-filled (V, C) tensor to add it to); later ones
    are added in place. product(a, b) -> a @ b, given from outside (None: torch.mm, accumulated by addmm_,
    with no fresh (V, C) product per chunk)."""
    if grad_w is None:
        return (product or torch.mm)(de, x_scaled)
    if product is None:
        return grad_w.addmm_(de, x_scaled)
    return grad_w.add_(product(de, x_scaled))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, chunk_rows, compute_dtype, softcap, exp_block_rows, weight_grad_mm,
                always_shift):
        N, V = x.shape[0], weight.shape[0]
        acc = torch.promote_types(compute_dtype, torch.float32)  # softmax and gradient sums
        keep = (targets != -1).to(acc)
        n_keep = keep.sum().clamp(min=1)
        safe_targets = targets.clamp(min=0).unsqueeze(0)  # (1, N); -1 rows are zeroed by `keep`, any index will do
        xc, wc = x.to(compute_dtype), weight.to(compute_dtype)
        x2 = _base2_rows(x, xc, acc, compute_dtype, softcap)
        flat = torch.empty(min(chunk_rows, N) * V, dtype=acc, device=x.device)
        losses = torch.empty(N, dtype=acc, device=x.device)
        grad_x = torch.empty(x.shape, dtype=acc, device=x.device)
        grad_w = None  # (V, C), made by the first chunk's product (no 25 MB zero-fill), then accumulated
        tanh_flat = torch.empty_like(flat) if softcap else None
        for start in range(0, N, chunk_rows):
            rows = slice(start, min(start + chunk_rows, N))
            t = safe_targets[:, rows]  # (1, n)
            def logits(rows=rows):  # (V, n) in flat, capped, in base 2; everything below is in place
                z = _chunk_logits_t(x2[rows], wc, flat)
                return z, (_softcap_(z, softcap, tanh_flat, LOG2E) if softcap else None)

            z, th = logits()
            losses[rows], total, z = _exp_shifted_(z, t, again=lambda: logits()[0], block_rows=exp_block_rows,
                                                   always_shift=always_shift)
            # d loss / d logits = softmax - onehot(target) = (e - total * onehot) / total on kept rows, 0 on
            # ignored ones; the 1/n_keep comes in backward, in fp32 (in fp16 it would underflow).
            e = z.scatter_add_(0, t, -total)
            if softcap:
                e *= th.square_().neg_().add_(1)  # chain rule through the cap: d logits / d z
            scale = (keep[rows] / total.squeeze(0)).unsqueeze(1)  # (n, 1)
            if compute_dtype != acc:  # normalize before the cast: e reaches -V, past fp16's range for big vocabs
                e *= scale.t()
                scale = keep[rows].unsqueeze(1)
            de = e.to(compute_dtype)  # (V, n)
            grad_x[rows] = (de.t() @ wc) * scale
            x_scaled = xc[rows] * scale.to(compute_dtype)  # (n, C)
            if compute_dtype != acc:  # a bf16/fp16 product, accumulated in fp32
                grad_w = (de @ x_scaled).to(acc) if grad_w is None else grad_w.add_(de @ x_scaled)
            else:
                grad_w = add_weight_grad(grad_w, de, x_scaled, weight_grad_mm)
        ctx.save_for_backward(grad_x, grad_w, n_keep)
        ctx.dtypes = (x.dtype, weight.dtype)
        return (losses * keep).sum() / n_keep

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w, n_keep = ctx.saved_tensors
        scale = grad_loss / n_keep  # one pass over each gradient, for both the mean and the upstream grad
        # In place: a fresh 25 MB grad_w costs page faults and a pass. A second backward through the same
        # graph (retain_graph) would fail loudly on the version check, never silently scale twice.
        return (grad_x.mul_(scale).to(ctx.dtypes[0]), grad_w.mul_(scale).to(ctx.dtypes[1]),
                None, None, None, None, None, None, None)


@torch.no_grad()
def _loss_only(x, weight, targets, chunk_rows, compute_dtype, softcap, exp_block_rows, always_shift):
    keep = targets != -1
    acc = torch.promote_types(compute_dtype, torch.float32)
    total = torch.zeros((), dtype=acc, device=x.device)
    xc, wc = x.to(compute_dtype), weight.to(compute_dtype)
    x2 = _base2_rows(x, xc, acc, compute_dtype, softcap)
    flat = torch.empty(min(chunk_rows, x.shape[0]) * weight.shape[0], dtype=acc, device=x.device)
    for start in range(0, x.shape[0], chunk_rows):
        rows = slice(start, min(start + chunk_rows, x.shape[0]))
        def logits(rows=rows):  # in base 2, as in _LinearCrossEntropy
            z = _chunk_logits_t(x2[rows], wc, flat)
            if softcap:  # no derivative here, so no tanh to keep: in place, without _softcap_'s second buffer
                z.div_(softcap).tanh_().mul_(softcap * LOG2E)
            return z

        per_row, _, _ = _exp_shifted_(logits(), targets[rows].clamp(min=0).unsqueeze(0), again=logits,
                                      block_rows=exp_block_rows, always_shift=always_shift)
        total += (per_row * keep[rows]).sum()
    return total / keep.sum().clamp(min=1)


# Under torch.compile this stays eager (a graph break at the head): dynamo would otherwise unroll the
# chunk loop. Each chunk is a few large kernels (two matmuls dominate), so eager costs little here.
@torch.compiler.disable
def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_rows: int, softcap: float = 0.0, *, exp_block_rows: int | None = None,
                         weight_grad_mm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                         always_shift: bool = False) -> torch.Tensor:
    """mean over targets != -1 of cross_entropy(x @ weight.T, targets), without the full logits.

    x (N, C), weight (V, C), targets (N,). Under autocast the matmuls run in the autocast dtype, the
    softmax in fp32 and the gradients accumulate in fp32. softcap > 0: the logits are
    softcap * tanh(x @ weight.T / softcap), as GPT.forward computes them.
    exp_block_rows: exponentiate and sum the (V, n) logits that many rows at a time (None: all at once).
    weight_grad_mm(a, b) -> a @ b: the product (V, n) @ (n, C) of the weight's gradient when the matmuls
    run in x's own dtype (None: torch.mm); some CPUs run that shape much faster in another library.
    always_shift: shift each column by its max without first trying without (_exp_shifted_): no host read.
    """
    compute_dtype = _compute_dtype(x)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        # autocast must not re-cast inside the Function: the dtypes are chosen explicitly above
        with torch.autocast(x.device.type, enabled=False):
            return _LinearCrossEntropy.apply(x, weight, targets, chunk_rows, compute_dtype, softcap,
                                             exp_block_rows, weight_grad_mm, always_shift)
    with torch.autocast(x.device.type, enabled=False):
        return _loss_only(x, weight, targets, chunk_rows, compute_dtype, softcap, exp_block_rows, always_shift)
