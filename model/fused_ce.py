"""Cross-entropy of the LM head, fused with the head's matmul and computed a chunk of rows at a time.

With a 50k vocabulary the plain `F.cross_entropy(x @ W.T, targets)` writes a (B*T, V) logits tensor,
reads it again for log_softmax, writes its gradient, and so on: at B*T=768 that is 154 MB per pass in
fp32, and that memory traffic (and allocating it afresh every step) can cost more than the matmuls. Here each chunk of rows goes through logits -> log-sum-exp -> softmax -> the
two gradient matmuls while it is still in cache, and only the (N, C) and (V, C) gradients are kept.
The gradients are computed in the forward pass (the backward only scales them by the incoming
gradient), so nothing of size (N, V) outlives a chunk.
"""
from __future__ import annotations

import torch


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The matmul dtype autocast would pick here (bf16/fp16 under autocast, else x's own dtype)."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return x.dtype


def _chunk_logits(xs, wc, buf):
    """(n, V) logits of one chunk in buf's dtype (fp32, or fp64 for fp64 inputs). When the matmul runs
    in that dtype they go straight into the reused buffer: allocating ~25 MB afresh per chunk costs page
    faults that can be as slow as the matmul itself."""
    if xs.dtype == buf.dtype:
        return torch.mm(xs, wc.t(), out=buf[: xs.shape[0]])
    return torch.mm(xs, wc.t()).to(buf.dtype)  # bf16/fp16 matmul, softmax statistics in fp32


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, chunk_rows, compute_dtype, softcap):
        N, V = x.shape[0], weight.shape[0]
        acc = torch.promote_types(compute_dtype, torch.float32)  # softmax and gradient sums
        keep = (targets != -1).to(acc)
        n_keep = keep.sum().clamp(min=1)
        safe_targets = targets.clamp(min=0).unsqueeze(1)  # -1 rows are zeroed by `keep`; any index will do
        xc, wc = x.to(compute_dtype), weight.to(compute_dtype)
        buf = torch.empty(min(chunk_rows, N), V, dtype=acc, device=x.device)
        losses = torch.empty(N, dtype=acc, device=x.device)
        grad_x = torch.empty(x.shape, dtype=acc, device=x.device)
        grad_w = torch.empty(weight.shape, dtype=acc, device=x.device)
        tanh_buf = torch.empty_like(buf) if softcap else None
        for start in range(0, N, chunk_rows):
            rows = slice(start, min(start + chunk_rows, N))
            t = safe_targets[rows]  # (n, 1)
            logits = _chunk_logits(xc[rows], wc, buf)  # (n, V); everything below is in place
            if softcap:  # logits = cap * tanh(z / cap); tanh is kept for the derivative 1 - tanh^2
                th = torch.div(logits, softcap, out=tanh_buf[: logits.shape[0]]).tanh_()
                torch.mul(th, softcap, out=logits)
            logits -= logits.amax(dim=1, keepdim=True)  # stable softmax
            target_logit = logits.gather(1, t).squeeze(1)
            probs = logits.exp_()
            total = probs.sum(dim=1)  # (n,)
            losses[rows] = total.log() - target_logit  # -log softmax at the target
            # d loss / d logits = (softmax - onehot(target)) / n_keep on kept rows, 0 on ignored ones.
            # The 1/n_keep comes after the matmuls, in fp32: in fp16 it would underflow.
            probs *= (keep[rows] / total).unsqueeze(1)
            probs.scatter_add_(1, t, -keep[rows].unsqueeze(1))
            if softcap:
                probs *= th.square_().neg_().add_(1)  # chain rule through the cap: d logits / d z
            dlogits = probs.to(compute_dtype)
            grad_x[rows] = dlogits @ wc
            if start == 0:  # the first chunk writes grad_w, which saves zero-filling 25 MB
                torch.mm(dlogits.t(), xc[rows], out=grad_w) if compute_dtype == acc else grad_w.copy_(dlogits.t() @ xc[rows])
            elif compute_dtype == acc:
                grad_w.addmm_(dlogits.t(), xc[rows])
            else:
                grad_w += dlogits.t() @ xc[rows]
        ctx.save_for_backward(grad_x, grad_w, n_keep)
        ctx.dtypes = (x.dtype, weight.dtype)
        return (losses * keep).sum() / n_keep

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w, n_keep = ctx.saved_tensors
        scale = grad_loss / n_keep  # one pass over each gradient, for both the mean and the upstream grad
        return (grad_x * scale).to(ctx.dtypes[0]), (grad_w * scale).to(ctx.dtypes[1]), None, None, None, None


@torch.no_grad()
def _loss_only(x, weight, targets, chunk_rows, compute_dtype, softcap):
    keep = targets != -1
    acc = torch.promote_types(compute_dtype, torch.float32)
    total = torch.zeros((), dtype=acc, device=x.device)
    xc, wc = x.to(compute_dtype), weight.to(compute_dtype)
    buf = torch.empty(min(chunk_rows, x.shape[0]), weight.shape[0], dtype=acc, device=x.device)
    for start in range(0, x.shape[0], chunk_rows):
        rows = slice(start, min(start + chunk_rows, x.shape[0]))
        logits = _chunk_logits(xc[rows], wc, buf)
        if softcap:
            logits = softcap * torch.tanh(logits / softcap)
        t = targets[rows].clamp(min=0).unsqueeze(1)
        per_row = torch.logsumexp(logits, dim=1) - logits.gather(1, t).squeeze(1)
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
