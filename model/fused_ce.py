"""Cross-entropy of the LM head, fused with the head's matmul and computed a chunk of rows at a time.

With a 50k vocabulary the plain `F.cross_entropy(x @ W.T, targets)` writes a (B*T, V) logits tensor,
reads it again for log_softmax, writes its gradient, and so on: at B*T=768 that is 154 MB per pass in
fp32, and that memory traffic (and allocating it afresh every step) can cost more than the matmuls.
Here each chunk of rows goes logits -> exp(z) (as exp2 of base-2 logits; shifted by the max only where
needed) -> the two gradient matmuls in one reused buffer, with as few passes over it as the math allows
(the softmax's division is applied to the small (n, C) operands instead), and only the (N, C) and (V, C)
gradients are kept. The gradients are computed in the forward pass (the backward only scales them by
the incoming gradient), so nothing of size (N, V) outlives a chunk.
"""
from __future__ import annotations

import math

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


def _exp_shifted_(z, t, again):
    """z (V, n), logits in base 2 (log2(e) times the natural ones) <- the softmax's numerators
    2^(z - shift) in place; returns the per-column loss logsumexp (natural) - logit[target] (n,), the
    numerators' sums (1, n) and z (the same buffer). The division by the sums is left to the (n, C)
    operands of the matmuls that follow (cheap), and the loss never takes the log of a probability that
    could underflow.

    The shift is 0 when that is safe, the column's max otherwise. exp(z) is tried first: the max and the
    subtraction are two of the few passes over the (V, n) logits, which don't fit in any cache (77 MB at
    384 x 50257), and logits are rarely large. When a column's sum shows it was not safe (SAFE_SUMS),
    `again()` computes z again into the same buffer, and it is shifted by its max. The check reads n
    numbers on the host: a sync per chunk, a few per step."""
    target_z = z.gather(0, t)  # (1, n)
    total = z.exp2_().sum(dim=0, keepdim=True)  # (1, n)
    if bool(((total >= SAFE_SUMS[0]) & (total <= SAFE_SUMS[1])).all()):
        return (total.log() - target_z * LN2).squeeze(0), total, z
    z = again()
    zmax = z.amax(dim=0, keepdim=True)  # (1, n)
    total = z.sub_(zmax).exp2_().sum(dim=0, keepdim=True)
    return ((zmax - target_z) * LN2 + total.log()).squeeze(0), total, z


def _base2_rows(x, xc, acc, compute_dtype, softcap):
    """The rows of x that make base-2 logits: x * log2(e), scaled before the cast to the matmul dtype (one
    rounding, as xc has). With a soft-cap the factor goes after the tanh instead, so these are xc."""
    return xc if softcap else (x.to(acc) * LOG2E).to(compute_dtype)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, chunk_rows, compute_dtype, softcap):
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
        grad_w = torch.empty(weight.shape, dtype=acc, device=x.device)
        tanh_flat = torch.empty_like(flat) if softcap else None
        for start in range(0, N, chunk_rows):
            rows = slice(start, min(start + chunk_rows, N))
            t = safe_targets[:, rows]  # (1, n)
            def logits(rows=rows):  # (V, n) in flat, capped, in base 2; everything below is in place
                z = _chunk_logits_t(x2[rows], wc, flat)
                return z, (_softcap_(z, softcap, tanh_flat, LOG2E) if softcap else None)

            z, th = logits()
            losses[rows], total, z = _exp_shifted_(z, t, again=lambda: logits()[0])
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
            if start == 0:  # the first chunk writes grad_w, which saves zero-filling 25 MB
                torch.mm(de, x_scaled, out=grad_w) if compute_dtype == acc else grad_w.copy_(de @ x_scaled)
            elif compute_dtype == acc:
                grad_w.addmm_(de, x_scaled)
            else:
                grad_w += de @ x_scaled
        ctx.save_for_backward(grad_x, grad_w, n_keep)
        ctx.dtypes = (x.dtype, weight.dtype)
        return (losses * keep).sum() / n_keep

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w, n_keep = ctx.saved_tensors
        scale = grad_loss / n_keep  # one pass over each gradient, for both the mean and the upstream grad
        # In place: a fresh 25 MB grad_w costs page faults and a pass. A second backward through the same
        # graph (retain_graph) would fail loudly on the version check, never silently scale twice.
        return grad_x.mul_(scale).to(ctx.dtypes[0]), grad_w.mul_(scale).to(ctx.dtypes[1]), None, None, None, None


@torch.no_grad()
def _loss_only(x, weight, targets, chunk_rows, compute_dtype, softcap):
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

        per_row, _, _ = _exp_shifted_(logits(), targets[rows].clamp(min=0).unsqueeze(0), again=logits)
        total += (per_row * keep[rows]).sum()
    return total / keep.sum().clamp(min=1)


# Under torch.compile this stays eager (a graph break at the head): dynamo would otherwise unroll the
# chunk loop. Each chunk is a few large kernels (two matmuls dominate), so eager costs little here.
@torch.compiler.disable
def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_rows: int, softcap: float = 0.0) -> torch.Tensor:
    """mean over targets != -1 of cross_entropy(x @ weight.T, targets), without the full logits.

    x (N, C), weight (V, C), targets (N,). Under autocast the matmuls run in the autocast dtype, the
    softmax in fp32 and the gradients accumulate in fp32. softcap > 0: the logits are
    softcap * tanh(x @ weight.T / softcap), as GPT.forward computes them.
    """
    compute_dtype = _compute_dtype(x)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        # autocast must not re-cast inside the Function: the dtypes are chosen explicitly above
        with torch.autocast(x.device.type, enabled=False):
            return _LinearCrossEntropy.apply(x, weight, targets, chunk_rows, compute_dtype, softcap)
    with torch.autocast(x.device.type, enabled=False):
        return _loss_only(x, weight, targets, chunk_rows, compute_dtype, softcap)
