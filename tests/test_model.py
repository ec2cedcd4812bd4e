"""The model against outside references: torch's SDPA, a textbook attention written here, HF GPT-2."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=24, vocab_size=97)


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**TINY, **kw}))


def twin_models(**kw) -> tuple[GPT, GPT]:
    """The same weights under both attention backends."""
    sdpa = tiny(attn_backend="sdpa", **kw)
    manual = GPT(GPTConfig(**{**TINY, **kw, "attn_backend": "manual"}))
    manual.load_state_dict(sdpa.state_dict())
    return sdpa, manual


def tokens(B=3, T=24, vocab=TINY["vocab_size"], seed=1):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The textbook loss of logits (B, T, V): F.cross_entropy over the targets != -1."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)


def left_pad(seqs: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(s) for s in seqs)
    idx = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        idx[i, T - len(s):] = s
        mask[i, T - len(s):] = True
    return idx, mask


# ---------------------------------------------------------------- manual vs sdpa


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_manual_and_sdpa_backends_agree_on_logits_and_all_gradients(dropout):
    sdpa, manual = twin_models(dropout=dropout)
    idx, targets = tokens(), tokens(seed=2)
    if dropout:
        # dropout masks come from different random streams in the two backends, so with dropout
        # configured the comparison is in eval mode, where dropout is the identity
        sdpa.eval(), manual.eval()
    loss_s = ce(sdpa(idx), targets)
    loss_m = ce(manual(idx), targets)
    torch.testing.assert_close(sdpa(idx), manual(idx), rtol=0, atol=1e-5)
    loss_s.backward()
    loss_m.backward()
    grads_m = dict(manual.named_parameters())
    for name, p in sdpa.named_parameters():
        torch.testing.assert_close(p.grad, grads_m[name].grad, rtol=0, atol=1e-5, msg=name)


def test_manual_and_sdpa_backends_agree_with_a_padding_mask():
    sdpa, manual = twin_models()
    idx, mask = left_pad([tokens(1, 24)[0], tokens(1, 9, seed=3)[0], tokens(1, 1, seed=4)[0]])
    out_s = sdpa(idx, pad_mask=mask)
    out_m = manual(idx, pad_mask=mask)
    torch.testing.assert_close(out_s[mask], out_m[mask], rtol=0, atol=1e-5)
    targets = tokens(seed=2)
    targets[~mask] = -1  # the loss, and so the gradients, see real positions only
    ce(sdpa(idx, pad_mask=mask), targets).backward()
    ce(manual(idx, pad_mask=mask), targets).backward()
    grads_m = dict(manual.named_parameters())
    for name, p in sdpa.named_parameters():
        torch.testing.assert_close(p.grad, grads_m[name].grad, rtol=0, atol=1e-5, msg=name)


# ---------------------------------------------------------------- textbook reference


def textbook_attention(attn, x: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + causal) V, one head at a time, from the module's raw weights."""
    B, T, C = x.shape
    nh, hs = attn.n_head, C // attn.n_head
    W, b = attn.c_attn.weight, attn.c_attn.bias  # (3C, C), (3C,)
    out = torch.zeros(B, T, C)
    for h in range(nh):
        rows = lambda part: slice(part * C + h * hs, part * C + (h + 1) * hs)  # noqa: E731
        q = x @ W[rows(0)].T + b[rows(0)]
        k = x @ W[rows(1)].T + b[rows(1)]
        v = x @ W[rows(2)].T + b[rows(2)]
        scores = q @ k.transpose(1, 2) / math.sqrt(hs)
        future = torch.arange(T)[None, :] > torch.arange(T)[:, None]
        scores = scores.masked_fill(future, float("-inf"))
        out[:, :, h * hs:(h + 1) * hs] = torch.softmax(scores, dim=-1) @ v
    return out @ attn.c_proj.weight.T + attn.c_proj.bias


@pytest.mark.parametrize("backend", ["sdpa", "manual"])
def test_attention_equals_textbook_formula_per_head(backend):
    model = tiny(attn_backend=backend)
    attn = model.transformer.h[0].attn
    with torch.no_grad():  # non-zero biases so that the bias path is checked too
        attn.c_attn.bias.normal_()
        attn.c_proj.bias.normal_()
    x = torch.randn(2, 11, TINY["n_embd"])
    torch.testing.assert_close(attn(x), textbook_attention(attn, x), rtol=0, atol=1e-5)


# ---------------------------------------------------------------- causality and padding


@pytest.mark.parametrize("backend", ["sdpa", "manual"])
def test_changing_token_t_changes_no_logit_before_t(backend):
    model = tiny(attn_backend=backend).eval()
    idx = tokens(1)
    t = 13
    changed = idx.clone()
    changed[0, t] = (idx[0, t] + 1) % TINY["vocab_size"]
    a, b = model(idx), model(changed)
    assert torch.equal(a[:, :t], b[:, :t])
    assert not torch.allclose(a[:, t], b[:, t])  # the change does reach position t itself


@pytest.mark.parametrize("backend", ["sdpa", "manual"])
def test_left_padded_batch_gives_each_sequence_its_solo_logits(backend):
    model = tiny(attn_backend=backend).eval()
    seqs = [tokens(1, 20, seed=5)[0], tokens(1, 7, seed=6)[0], tokens(1, 13, seed=7)[0]]
    idx, mask = left_pad(seqs, pad_id=3)
    batched = model(idx, pad_mask=mask)
    for i, s in enumerate(seqs):
        alone = model(s[None])
        torch.testing.assert_close(batched[i, -len(s):], alone[0], rtol=0, atol=1e-5)


def test_pad_token_values_do_not_leak_into_real_positions():
    model = tiny().eval()
    idx, mask = left_pad([tokens(1, 20)[0], tokens(1, 6, seed=8)[0]], pad_id=0)
    other = idx.clone()
    other[~mask] = 42
    torch.testing.assert_close(model(idx, pad_mask=mask)[mask], model(other, pad_mask=mask)[mask], rtol=0, atol=1e-6)


# ---------------------------------------------------------------- KV cache


@pytest.mark.parametrize("backend", ["sdpa", "manual"])
def test_cached_decode_matches_full_forward(backend):
    model = tiny(attn_backend=backend).eval()
    idx = tokens(2, 24)
    full = model(idx)
    cache = model.new_kv_cache(batch_size=2, max_seq_len=24)
    steps = [model(idx[:, :5], input_pos=torch.arange(5), kv_cache=cache)]  # prefill
    for t in range(5, 24):  # then one token at a time
        steps.append(model(idx[:, t:t + 1], input_pos=torch.tensor([t]), kv_cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


def test_cached_decode_with_left_padding_matches_each_sequence_alone():
    model = tiny().eval()
    seqs = [tokens(1, 9, seed=10)[0], tokens(1, 4, seed=11)[0]]
    prompt, mask = left_pad(seqs)
    n_new, P = 6, prompt.shape[1]
    cont = tokens(2, n_new, seed=12)
    pad = torch.cat([mask, torch.ones(2, n_new, dtype=torch.bool)], dim=1)  # (B, S)
    cache = model.new_kv_cache(batch_size=2, max_seq_len=P + n_new)
    out = [model(prompt, input_pos=torch.arange(P), kv_cache=cache, pad_mask=pad)[:, -1:]]
    for t in range(n_new):
        out.append(model(cont[:, t:t + 1], input_pos=torch.tensor([P + t]), kv_cache=cache, pad_mask=pad))
    out = torch.cat(out, dim=1)  # logits after the prompt, then after each new token
    for i, s in enumerate(seqs):
        alone = model(torch.cat([s, cont[i]])[None])[0, len(s) - 1:]
        torch.testing.assert_close(out[i], alone, rtol=0, atol=1e-5)


def test_sequence_longer_than_block_size_is_an_assertion():
    """The model asserts what it assumes (a user's too-long prompt is cropped or refused at the edges:
    model/generate.py, sample.py, eval/)."""
    model = tiny()
    with pytest.raises(AssertionError, match="block_size"):
        model(tokens(1, TINY["block_size"] + 1))


# ---------------------------------------------------------------- init, tying, sizes


def test_init_uses_gpt2_stds_and_ties_the_lm_head():
    cfg = dict(n_layer=8, n_head=4, n_embd=128, block_size=64, vocab_size=512)
    model = tiny(**cfg)
    assert model.lm_head.weight is model.transformer.wte.weight
    c_proj = torch.cat([p.flatten() for n, p in model.named_parameters() if n.endswith("c_proj.weight")])
    expected = 0.02 / math.sqrt(2 * cfg["n_layer"])
    assert abs(c_proj.std().item() - expected) < 0.05 * expected
    c_fc = torch.cat([b.mlp.c_fc.weight.flatten() for b in model.transformer.h])
    assert abs(c_fc.std().item() - 0.02) < 0.001
    assert abs(model.transformer.wte.weight.std().item() - 0.02) < 0.001
    assert all(b.attn.c_attn.bias.abs().max() == 0 for b in model.transformer.h)


def test_parameter_count_equals_hand_count():
    L, C, V, T = 2, 32, 97, 24
    model = tiny()
    per_block = (
        2 * 2 * C  # ln_1, ln_2: weight + bias
        + C * 3 * C + 3 * C  # c_attn
        + C * C + C  # attn.c_proj
        + C * 4 * C + 4 * C  # c_fc
        + 4 * C * C + C  # mlp.c_proj
    )
    embeddings = V * C + T * C  # wte (shared with lm_head) + wpe
    total = embeddings + L * per_block + 2 * C  # + ln_f
    assert model.num_params(non_embedding=False) == total
    assert model.num_params(non_embedding=True) == total - embeddings


def test_flops_per_token_is_six_n_plus_attention_term():
    L, C, V, T = 2, 32, 97, 24
    model = tiny()
    n = L * (12 * C * C + 13 * C) + 2 * C  # non-embedding params (see the hand count above)
    assert model.flops_per_token() == 6 * (n + V * C) + 12 * L * C * T


# ---------------------------------------------------------------- bad configs


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(n_embd=30, n_head=4), "n_embd"),
        (dict(n_layer=0), "n_layer"),
        (dict(n_head=-2), "n_head"),
        (dict(block_size=0), "block_size"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(attn_backend="flash3"), "attn_backend"),
        (dict(dropout=1.5), "dropout"),
    ],
)
def test_a_bad_config_is_a_problem_naming_the_field(kwargs, field):
    """GPTConfig is plain data; checkpoint/model_config.py's one check names what is wrong (each edge raises it)."""
    from checkpoint.model_config import model_config_problem

    problem = model_config_problem(GPTConfig(**{**TINY, **kwargs}))
    assert f"GPTConfig.{field}" in problem
    if field == "attn_backend":
        assert "sdpa" in problem and "manual" in problem
    assert model_config_problem(GPTConfig(**TINY)) is None


# ---------------------------------------------------------------- fused head + loss


@pytest.mark.parametrize("exp_block_rows, always_shift", [(None, False), (7, False), (5000, False), (None, True)],
                         ids=["chunk", "blocks", "blocks>V", "always-shift"])  # always-shift: a GPU's, no host read
def test_fused_loss_and_gradients_equal_torch_cross_entropy_on_full_logits(exp_block_rows, always_shift):
    from model.fused_ce import linear_cross_entropy

    torch.manual_seed(0)
    x = torch.randn(300, 32, dtype=torch.float64, requires_grad=True)
    w = torch.randn(1000, 32, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 1000, (300,))
    targets[::7] = -1
    expected = F.cross_entropy(x @ w.t(), targets, ignore_index=-1)
    ex, ew = torch.autograd.grad(expected * 3, (x, w))
    # 300 rows: the last chunk is partial
    got = linear_cross_entropy(x, w, targets, chunk_rows=64, exp_block_rows=exp_block_rows, always_shift=always_shift)
    gx, gw = torch.autograd.grad(got * 3, (x, w))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(gx, ex, rtol=0, atol=1e-10)
    torch.testing.assert_close(gw, ew, rtol=0, atol=1e-10)
    with torch.no_grad():  # the loss-only path (evaluation)
        torch.testing.assert_close(linear_cross_entropy(x, w, targets, chunk_rows=64, exp_block_rows=exp_block_rows,
                                                        always_shift=always_shift), expected, rtol=0, atol=1e-10)


def test_the_weight_gradient_product_given_from_outside_makes_the_weight_gradient_of_every_chunk():
    from model.fused_ce import linear_cross_entropy
    from runtime.loss_path import onednn_mm

    torch.manual_seed(0)
    x = torch.randn(200, 32, requires_grad=True)
    w = (torch.randn(700, 32) * 0.3).requires_grad_()
    targets = torch.randint(0, 700, (200,))
    targets[::9] = -1
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    expected = F.cross_entropy(xd @ wd.t(), targets, ignore_index=-1)
    ex, ew = torch.autograd.grad(expected, (xd, wd))
    shapes = []

    def product(a, b):
        shapes.append((tuple(a.shape), tuple(b.shape)))
        return onednn_mm(a, b)
    got = linear_cross_entropy(x, w, targets, chunk_rows=64, exp_block_rows=100, weight_grad_mm=product)
    gx, gw = torch.autograd.grad(got, (x, w))
    assert shapes == [((700, 64), (64, 32))] * 3 + [((700, 8), (8, 32))]  # every chunk, the last one partial
    assert abs(got.item() - expected.item()) < 1e-5
    torch.testing.assert_close(gx.double(), ex, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(gw.double(), ew, rtol=1e-4, atol=1e-6)
    shapes.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a bf16 product is the autocast dtype's own, not this one
        linear_cross_entropy(x, w, targets, chunk_rows=64, weight_grad_mm=product).backward()
    assert shapes == []


def test_fused_loss_stays_finite_and_exact_when_the_target_probability_underflows_fp32():
    # A target 200 nats below the best logit: its fp32 softmax is exactly 0, so -log(p[target]) would be
    # inf; the loss must still equal cross_entropy computed in fp64 on the same logits.
    from model.fused_ce import linear_cross_entropy

    torch.manual_seed(0)
    x = torch.randn(40, 16)
    w = torch.randn(300, 16) * 30  # logits spread over hundreds of nats
    targets = (x @ w.t()).argmin(dim=1)  # the worst token of each row
    expected = F.cross_entropy((x @ w.t()).double(), targets)
    assert expected.item() > 150
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            got = linear_cross_entropy(x.requires_grad_(grad), w, targets, chunk_rows=16)
        assert torch.isfinite(got) and abs(got.item() - expected.item()) < 1e-3 * expected.item()



def test_fused_loss_gradients_are_exact_whether_or_not_a_chunk_needs_the_max_shift(monkeypatch):
    # exp(z) is tried without subtracting the max; a chunk whose logits are too large for that (here the
    # second: logits in the hundreds, exp overflows fp32) is computed again and shifted. Both chunks'
    # loss and gradients must match cross_entropy in fp64.
    import model.fused_ce as fused_ce

    torch.manual_seed(0)
    x = torch.randn(32, 16)
    x[16:] *= 40
    w = torch.randn(300, 16)
    targets = torch.randint(0, 300, (32,))
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    expected = F.cross_entropy(xd @ wd.t(), targets)
    ex, ew = torch.autograd.grad(expected, (xd, wd))
    calls = []
    real = fused_ce._chunk_logits_t
    monkeypatch.setattr(fused_ce, "_chunk_logits_t", lambda *a: calls.append(1) or real(*a))
    x.requires_grad_(), w.requires_grad_()
    got = fused_ce.linear_cross_entropy(x, w, targets, chunk_rows=16, exp_block_rows=7)
    gx, gw = torch.autograd.grad(got, (x, w))
    assert len(calls) == 3  # two chunks, the second one twice
    assert abs(got.item() - expected.item()) < 1e-5 * expected.item()
    torch.testing.assert_close(gx.double(), ex, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(gw.double(), ew, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("always_shift", [False, True])
def test_fused_loss_is_exact_when_every_logit_is_far_below_zero(always_shift):
    # Logits around -100: exp(z) underflows fp32 for every entry, so the unshifted try must see it (its
    # sums are ~0) and shift by the max; else the loss is -inf and the gradients NaN.
    from model.fused_ce import linear_cross_entropy

    torch.manual_seed(0)
    x = (-2.2 + 0.05 * torch.randn(24, 16)).requires_grad_()
    w = (3.0 + 0.05 * torch.randn(200, 16)).requires_grad_()
    targets = torch.randint(0, 200, (24,))
    assert (x @ w.t()).max() < -90
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    expected = F.cross_entropy(xd @ wd.t(), targets)
    ex, ew = torch.autograd.grad(expected, (xd, wd))
    got = linear_cross_entropy(x, w, targets, chunk_rows=8, always_shift=always_shift)
    gx, gw = torch.autograd.grad(got, (x, w))
    assert abs(got.item() - expected.item()) < 1e-4
    torch.testing.assert_close(gx.double(), ex, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(gw.double(), ew, rtol=1e-3, atol=1e-6)
    with torch.no_grad():
        loss = linear_cross_entropy(x, w, targets, chunk_rows=8, always_shift=always_shift)
        assert abs(loss.item() - expected.item()) < 1e-4


def test_a_second_backward_through_the_fused_loss_fails_loudly_rather_than_scaling_twice():
    # backward scales the gradients it saved in place (no fresh (V, C) tensor a step); a retained graph
    # must not hand out those gradients again, scaled a second time
    from model.fused_ce import linear_cross_entropy

    x, w = torch.randn(8, 4, requires_grad=True), torch.randn(10, 4, requires_grad=True)
    loss = linear_cross_entropy(x, w, torch.randint(0, 10, (8,)), chunk_rows=4)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()

@pytest.mark.parametrize("dtype, atol", [(torch.bfloat16, 5e-3), (torch.float16, 5e-4)])
def test_fused_loss_under_autocast_stays_close_to_fp32(dtype, atol):
    from model.fused_ce import linear_cross_entropy

    torch.manual_seed(0)
    x = torch.randn(200, 32, requires_grad=True)
    w = torch.randn(500, 32, requires_grad=True)
    targets = torch.randint(0, 500, (200,))
    expected = F.cross_entropy(x @ w.t(), targets)
    ex, ew = torch.autograd.grad(expected, (x, w))
    with torch.autocast("cpu", dtype=dtype):
        got = linear_cross_entropy(x, w, targets, chunk_rows=64)
    gx, gw = torch.autograd.grad(got, (x, w))
    assert abs(got.item() - expected.item()) < atol * 10
    torch.testing.assert_close(gx, ex, rtol=0, atol=atol)
    torch.testing.assert_close(gw, ew, rtol=0, atol=atol)
