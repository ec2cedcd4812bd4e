"""The training loss with masked targets (-1: no loss taken there), against F.cross_entropy(ignore_index=-1)
on the same logits: the fused, chunked head (model/fused_ce.py) and the full logits, through the loss object
(runtime/loss_path.py's LMLoss), and the step's weighting of micro-batches and ranks by their counted
targets (training/step.py), against one F.cross_entropy over every counted target of the step."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig
from model.fused_ce import linear_cross_entropy
from runtime.loss_path import LMLoss
from training.report.evaluate import evaluate
from training.step import train_step

V, C = 53, 8
NO_AMP = lambda: torch.autocast("cpu", enabled=False)  # noqa: E731


def reference(x, w, t, softcap=0.0):
    """F.cross_entropy(ignore_index=-1) on the full (capped) logits; 0 where nothing is counted (its own mean
    is then NaN: 0 / 0)."""
    logits = x @ w.t()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    if not bool((t != -1).any()):
        return F.cross_entropy(logits, t, ignore_index=-1, reduction="sum")
    return F.cross_entropy(logits, t, ignore_index=-1)


def masked_targets(B: int, T: int, seed: int) -> torch.Tensor:
    """Targets (B, T) with -1 on: every position of row 1 (a row with nothing counted), positions 8..15 of
    every row, and scattered single ones."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, V, (B, T), generator=g)
    t[1] = -1
    t[:, 8:16] = -1
    t[torch.rand(B, T, generator=g) < 0.2] = -1
    return t


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-6)])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
@pytest.mark.parametrize("chunk_rows", [None, 4, 7, 16, 1000])  # the full logits; chunks; whole chunks masked; one
def test_the_masked_loss_and_its_gradients_equal_torch_cross_entropy(dtype, tol, softcap, chunk_rows):
    torch.manual_seed(0)
    B, T = 3, 20
    x = (torch.randn(B * T, C, dtype=dtype) * 2).requires_grad_()
    w = torch.randn(V, C, dtype=dtype).requires_grad_()
    t = masked_targets(B, T, seed=1).view(-1)
    assert bool((t[20:40] == -1).all())  # row 1: whole chunks of 4 and of 7 rows with nothing counted
    if chunk_rows is None:
        logits = x @ w.t()
        logits = softcap * torch.tanh(logits / softcap) if softcap else logits
        got = F.cross_entropy(logits, t, ignore_index=-1, reduction="sum") / (t != -1).sum()
    else:
        got = linear_cross_entropy(x, w, t, chunk_rows=chunk_rows, softcap=softcap)
    gx, gw = torch.autograd.grad(got, (x, w))
    expected = reference(x, w, t, softcap)
    ex, ew = torch.autograd.grad(expected, (x, w))
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    torch.testing.assert_close(gx, ex, rtol=tol, atol=tol)
    torch.testing.assert_close(gw, ew, rtol=tol, atol=tol)
    assert bool((gx[t == -1] == 0).all())  # nothing flows back from a masked row


@pytest.mark.parametrize("chunk_rows", [None, 8])
def test_masked_rows_are_never_read_whatever_they_hold(chunk_rows):
    """The hidden state of a masked row (and the id a -1 stands for) can be anything, large enough to take the
    fused path's shifted exp: the loss and the gradients of the weight and of the counted rows don't move."""
    torch.manual_seed(2)
    x = torch.randn(32, C, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, C, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, V, (32,))
    t[5:20] = -1
    loss = LMLoss(chunk_rows=chunk_rows)
    gpt = SimpleNamespace(lm_head=SimpleNamespace(weight=w), config=SimpleNamespace(logit_softcap=0.0),
                          head=lambda h: h @ w.t())  # what of_hidden reads of a GPT

    def run(hidden):
        value = loss.of_hidden(hidden[None], gpt, t[None])
        return (value, *torch.autograd.grad(value, (hidden, w)))
    base = run(x)
    other = x.detach().clone()
    other[5:20] = torch.randn(15, C, dtype=torch.float64) * 300  # logits in the thousands
    changed = run(other.requires_grad_())
    torch.testing.assert_close(changed[0], base[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(changed[2], base[2], rtol=0, atol=1e-12)
    keep = t != -1
    torch.testing.assert_close(changed[1][keep], base[1][keep], rtol=0, atol=1e-12)
    assert bool((changed[1][~keep] == 0).all())


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(n_layer=2, n_head=2, n_embd=16, block_size=24, vocab_size=V), **kw})).double()


@pytest.mark.parametrize("chunk_rows", [None, 7])
@pytest.mark.parametrize("kw", [{}, dict(tie_embeddings=False, logit_softcap=3.0)])
def test_the_loss_object_equals_cross_entropy_on_the_models_logits_for_every_parameter(chunk_rows, kw):
    model = tiny(**kw)
    x = torch.randint(0, V, (3, 24))
    y = masked_targets(3, 24, seed=3)
    loss = LMLoss(chunk_rows=chunk_rows)(model, x, y)
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    expected = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-1)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-10)
    for n, p in model.named_parameters():  # lm_head.weight included (its own, or wte's when tied)
        torch.testing.assert_close(got[n], p.grad, rtol=1e-9, atol=1e-12, msg=n)
    every = LMLoss(chunk_rows=chunk_rows)(model, x, torch.full_like(y, -1))  # nothing counted: 0, not NaN
    assert every.item() == 0.0


@pytest.mark.parametrize("chunk_rows", [None, 5])
def test_tokens_after_the_last_counted_target_change_nothing(chunk_rows):
    """Under causal attention a target's logits see only the tokens up to its own position: every input after
    a row's last counted target (its padding, a turn nobody learns from) can change, and the loss and every
    gradient stay as they were. (Changing a user's tokens *before* an assistant's reply does change the
    reply's logits, and so the loss: a causal model reads its prompt. What the mask promises is that only
    the assistant's targets are scored; the test above shows a masked target's id and hidden state are
    never read.)"""
    model = tiny()
    x = torch.randint(0, V, (2, 24))
    y = torch.randint(0, V, (2, 24))
    last = [15, 9]
    for row, k in enumerate(last):
        y[row, k + 1:] = -1
    loss = LMLoss(chunk_rows=chunk_rows)

    def run(inputs):
        model.zero_grad()
        value = loss(model, inputs, y)
        value.backward()
        return value, {n: p.grad.clone() for n, p in model.named_parameters()}
    base, base_grads = run(x)
    changed = x.clone()
    for row, k in enumerate(last):
        changed[row, k + 1:] = torch.randint(0, V, (24 - k - 1,))
    assert not torch.equal(changed, x)
    value, grads = run(changed)
    torch.testing.assert_close(value, base, rtol=0, atol=1e-12)
    for n in grads:
        torch.testing.assert_close(grads[n], base_grads[n], rtol=0, atol=1e-12, msg=n)


# ------------------------------------------------------------------------------- the step's weighting

def sgd_step_gradient(model, loss, batches, par=None):
    """The gradient train_step applies: one SGD step at lr 1, no clipping, read as old - new weights."""
    before = [p.detach().clone() for p in model.parameters()]
    out = train_step(model, loss, [torch.optim.SGD(model.parameters(), lr=1.0)],
                     torch.amp.GradScaler("cpu", enabled=False), batches, amp=NO_AMP, grad_clip=0.0, par=par)
    grads = [b - p.detach() for b, p in zip(before, model.parameters())]
    with torch.no_grad():
        for p, b in zip(model.parameters(), before):
            p.copy_(b)
    return out, grads


def token_mean_gradient(model, batches):
    """The reference: one F.cross_entropy over every counted target of all the batches at once."""
    model.zero_grad()
    logits = torch.cat([model(x).flatten(0, 1) for x, _ in batches])
    targets = torch.cat([y.flatten() for _, y in batches])
    value = F.cross_entropy(logits, targets, ignore_index=-1)
    value.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return value, grads


def micro_batches():
    """Three micro-batches with 20, 3 and 0 counted targets."""
    g = torch.Generator().manual_seed(4)
    batches = [(torch.randint(0, V, (2, 12), generator=g), torch.randint(0, V, (2, 12), generator=g)) for _ in range(3)]
    batches[0][1][:, 10:] = -1
    batches[1][1][:, :] = -1
    batches[1][1][0, :3] = 7
    batches[2][1][:] = -1
    return batches


@pytest.mark.parametrize("chunk_rows", [None, 5])
def test_the_step_takes_the_mean_over_every_counted_target_of_its_micro_batches(chunk_rows):
    model = tiny(dropout=0.0)
    batches = micro_batches()
    out, grads = sgd_step_gradient(model, LMLoss(chunk_rows=chunk_rows), batches)
    value, expected = token_mean_gradient(model, batches)
    torch.testing.assert_close(out.loss, value.to(out.loss.dtype), rtol=1e-6, atol=1e-6)  # the logged loss too
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-12)
    # the plain mean of the micro-batches' means is another number: the weighting is what makes them equal
    plain = sum(LMLoss()(model, x, y) for x, y in batches[:2]) / 3
    assert abs(plain.item() - value.item()) > 1e-3


def test_the_steps_weights_span_the_ranks():
    """Two ranks with 20 and 3 counted targets: each rank's step divides by the total over the ranks (its
    step_sum_), and the average of the two ranks' gradients (what DDP and FSDP reduce) is the gradient of the
    mean over all 23 targets. The ranks are played one after the other here."""
    model = tiny(dropout=0.0)
    batches = micro_batches()
    ranks = [[batches[0]], [batches[1]]]
    counts = [int((b[0][1] != -1).sum()) for b in ranks]

    class Rank(SimpleNamespace):
        enabled, world_size = True, 2

        def step_sum_(self, t):
            return t.fill_(sum(counts))
    per_rank = [sgd_step_gradient(model, LMLoss(), r, par=Rank())[1] for r in ranks]
    _, expected = token_mean_gradient(model, batches[:2])
    for g0, g1, e in zip(*per_rank, expected):
        torch.testing.assert_close((g0 + g1) / 2, e, rtol=1e-9, atol=1e-12)


def test_a_step_with_nothing_counted_changes_nothing_and_is_not_nan():
    model = tiny(dropout=0.0)
    x = torch.randint(0, V, (2, 12))
    out, grads = sgd_step_gradient(model, LMLoss(chunk_rows=5), [(x, torch.full_like(x, -1))] * 2)
    assert out.loss.item() == 0.0 and out.grad_norm.item() == 0.0
    assert all(bool((g == 0).all()) for g in grads)


def test_the_eval_weighs_batches_by_their_counted_targets():
    model = tiny(dropout=0.0)
    batches = micro_batches()[:2]
    loader = SimpleNamespace(get_batch=lambda k, micro: batches[k])
    got = evaluate(model, LMLoss(chunk_rows=5), {"val": loader}, 2, NO_AMP)["val"]
    expected, _ = token_mean_gradient(model, batches)
    assert got == pytest.approx(expected.item(), rel=1e-6)
