"""Generation core (model/generate.py) against references written here: a no-cache nanoGPT loop, a
plain-Python top-k / top-p / temperature filter, and single-prompt runs for the batched path."""
from __future__ import annotations

import math

import pytest
import torch

from model import GPT, GPTConfig
from model.generate import candidate_probs, generate, logits_to_probs, sample
from runtime.decoding import prepack_for_cpu


def tiny_model(seed=0, vocab=61, block_size=32, n_layer=2, n_head=2, n_embd=32, std=0.4):
    """float64 (so argmax near-ties cannot flip between computation orders), with weights large enough
    that the next token depends on the context rather than repeating one id."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab, block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, std)
    return model.double().eval()


def reference_greedy(model, prompt, n):
    """nanoGPT's uncached loop: the last block_size tokens, positions 0.., argmax of the last logits."""
    idx = torch.tensor([prompt])
    bs = model.config.block_size
    with torch.no_grad():
        for _ in range(n):
            logits = model(idx[:, -bs:])[:, -1]
            idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
    return idx[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("prompt_len", [5, 40])  # 40 > block_size: the prompt itself is cropped
def test_cached_greedy_equals_uncached_loop_over_200_tokens_across_crops(model, prompt_len):
    prompt = torch.randint(0, 61, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    positions_seen = []
    hook = model.transformer.wpe.register_forward_pre_hook(lambda m, args: positions_seen.append(int(args[0].max())))
    try:
        ours = generate(model, [prompt], 200, temperature=0)[0]
    finally:
        hook.remove()
    ref = reference_greedy(model, prompt, 200)
    assert ours == ref
    assert len(set(ref)) > 10, "degenerate test model: the output should not be one repeated token"
    assert max(positions_seen) == model.config.block_size - 1  # the crop was reached, never exceeded


def test_uncached_mode_follows_the_same_crop_rule(model):
    prompt = [3, 1, 4, 1, 5]
    assert generate(model, [prompt], 60, temperature=0, use_cache=False)[0] == reference_greedy(model, prompt, 60)


def test_batched_prompts_of_different_lengths_equal_each_prompt_alone(model):
    prompts = [[7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [5, 9, 2] * 10]  # 1, 12, 30 tokens
    batched = generate(model, prompts, 45, temperature=0)  # every row crosses block_size=32
    for prompt, row in zip(prompts, batched):
        assert row == reference_greedy(model, prompt, 45)


def test_stop_at_eot_ends_only_the_row_that_emitted_it(model):
    prompts = [[7], [1, 2, 3, 4, 5, 6], [5, 9, 2] * 4]
    free = [reference_greedy(model, p, 30) for p in prompts]
    # choose as "end of text" an id that row 0 emits at step 5 and that first appears there
    eot = next(t for i, t in enumerate(free[0]) if i >= 3 and t not in free[0][:i])
    stop_at = free[0].index(eot)
    batched = generate(model, prompts, 30, temperature=0, eot=eot, stop_at_eot=True)
    for row, expected in zip(batched, free):
        cut = expected.index(eot) if eot in expected else len(expected)
        assert row == expected[:cut]  # the EOT itself is not emitted
    assert len(batched[0]) == stop_at
    # with stop_at_eot=False the EOT is an ordinary token
    assert generate(model, prompts, 30, temperature=0, eot=eot, stop_at_eot=False) == free


def test_same_seed_gives_same_samples_and_another_seed_differs(model):
    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return generate(model, [[1, 2, 3], [4, 5]], 50, temperature=1.0, top_k=20, top_p=0.9, generator=g)

    a, b, c = run(123), run(123), run(124)
    assert a == b
    assert a != c


def test_vocab_size_limits_the_sampled_ids(model):
    g = torch.Generator().manual_seed(0)
    out = generate(model, [[1, 2]], 200, temperature=5.0, generator=g, vocab_size=10)[0]
    assert max(out) < 10 and len(set(out)) > 3


def test_prepacked_bf16_model_gives_the_same_tokens_and_close_logits():
    fp32 = tiny_model(seed=3).float()
    plain = tiny_model(seed=3).to(torch.bfloat16)
    packed = tiny_model(seed=3).to(torch.bfloat16)
    assert not prepack_for_cpu(tiny_model(seed=3).float())  # fp32: left alone
    if not prepack_for_cpu(packed):
        pytest.skip("this torch build has no oneDNN bf16 linear")
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.modules())
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]]
    assert generate(packed, prompts, 40, temperature=0) == generate(plain, prompts, 40, temperature=0)
    idx = torch.tensor([list(range(20))])
    with torch.inference_mode():
        ref, got = fp32(idx), packed(idx).float()
    assert torch.allclose(got, ref, atol=0.05 * ref.abs().max().item())


# ------------------------------------------------------------------ filters against a reference in Python

def ref_probs(logits, temperature, top_k=None, top_p=None):
    """The filter rules from their definitions, one list of floats at a time."""
    V = len(logits)
    if temperature == 0:
        best = max(range(V), key=lambda i: (logits[i], -i))
        return [1.0 if i == best else 0.0 for i in range(V)]
    z = [x / temperature for x in logits]
    keep = set(range(V))
    if top_k is not None:
        kth = sorted(z, reverse=True)[min(top_k, V) - 1]
        keep = {i for i in keep if z[i] >= kth}
    m = max(z[i] for i in keep)
    w = {i: math.exp(z[i] - m) for i in keep}
    total = sum(w.values())
    p = {i: w[i] / total for i in keep}
    if top_p is not None:
        mass = 0.0
        for i in sorted(p, key=lambda i: -z[i]):  # most likely first
            mass += p[i]
            if mass >= top_p:
                break
        kept = {j for j in p if z[j] >= z[i]}  # tokens tied with the last one kept stay too
        total = sum(p[i] for i in kept)
        p = {i: p[i] / total for i in kept}
    return [p.get(i, 0.0) for i in range(V)]


LOGITS = [2.0, -1.0, 0.5, 3.0, 0.0, 1.25, -2.5, 2.0, 0.75, -0.3]


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [
        (1.0, None, None),
        (0.5, None, None),  # temperature sharpens
        (2.5, None, None),  # and flattens
        (0.0, None, None),  # greedy: all mass on the argmax
        (1.0, 3, None),  # 3.0, 2.0, 2.0 kept
        (1.0, 2, None),  # tie at the 2nd largest: both 2.0 stay
        (1.0, 1, None),
        (1.0, 20, None),  # k > V keeps everything
        (1.0, None, 0.7),
        (1.0, None, 0.9),
        (0.7, None, 0.05),  # below the top token's mass: the top token alone
        (1.3, 4, 0.8),  # top-k first, then top-p on the renormalised rest
    ],
)
def test_logits_to_probs_equals_reference_filter(temperature, top_k, top_p):
    logits = torch.tensor([LOGITS, LOGITS[::-1]])
    probs = logits_to_probs(logits, temperature, top_k, top_p)
    for row in range(2):
        expected = ref_probs(logits[row].tolist(), temperature, top_k, top_p)
        assert probs[row].tolist() == pytest.approx(expected, abs=1e-6)


def test_top_p_keeps_the_smallest_set_reaching_p():
    # probabilities 0.5, 0.3, 0.15, 0.05: p=0.8 keeps the first two (0.5 + 0.3 reaches it), p=0.81 three
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)]])
    assert (logits_to_probs(logits, 1.0, None, 0.79) > 0).tolist() == [[True, True, False, False]]
    assert (logits_to_probs(logits, 1.0, None, 0.81) > 0).tolist() == [[True, True, True, False]]


def test_sampling_frequencies_follow_the_filtered_distribution():
    logits = torch.tensor([LOGITS])
    expected = ref_probs(LOGITS, 0.8, 5, 0.9)
    g = torch.Generator().manual_seed(0)
    draws = sample(logits.expand(20000, -1), 0.8, 5, 0.9, generator=g)
    freq = torch.bincount(draws, minlength=len(LOGITS)).double() / draws.numel()
    for f, e in zip(freq.tolist(), expected):
        assert f == pytest.approx(e, abs=0.015)
        if e == 0.0:
            assert f == 0.0


@pytest.mark.parametrize(
    "case, temperature, top_k, top_p",
    [
        ("peaked", 0.9, 50, None),
        ("ties", 1.0, 50, None),  # many equal logits around the 50th, as bf16 logits have
        ("ties", 0.7, 50, 0.6),
        ("peaked", 1.0, None, 0.9),  # the nucleus lies within the first 512 candidates
        ("flat", 1.0, None, 0.9),  # it does not: the full vocabulary is used
        ("flat", 1.2, 700, 0.5),
    ],
)
def test_sampling_shortcut_distribution_equals_reference_filter(case, temperature, top_k, top_p):
    V = 1500
    g = torch.Generator().manual_seed(1)
    if case == "peaked":
        logits = torch.randn(2, V, generator=g, dtype=torch.float64) * 3
    elif case == "flat":
        logits = torch.randn(2, V, generator=g, dtype=torch.float64) * 0.1
    else:
        logits = torch.randint(-40, 10, (2, V), generator=g).double() / 8  # only 50 distinct values
    weights, ids = candidate_probs(logits, temperature, top_k, top_p)
    full = weights if ids is None else torch.zeros(2, V, dtype=weights.dtype).scatter(-1, ids, weights)
    full = full / full.sum(-1, keepdim=True)
    for row in range(2):
        expected = ref_probs(logits[row].tolist(), temperature, top_k, top_p)
        assert full[row].tolist() == pytest.approx(expected, abs=1e-6)


def test_a_huge_max_new_tokens_allocates_nothing_in_proportion(model, monkeypatch):
    """The token buffer is P + block_size wide, whatever max_new_tokens says (it used to be P + max_new_tokens
    wide, allocated before the first token): a billion new tokens start at once and stream."""
    from model.generate import generate_stream

    widths = []
    real_zeros = torch.zeros

    def spying_zeros(*size, **k):
        widths.append(size[-1] if size and isinstance(size[-1], int) else None)
        return real_zeros(*size, **k)

    monkeypatch.setattr(torch, "zeros", spying_zeros)
    stream = generate_stream(model, [[1, 2, 3], [4]], 10**9, temperature=0)
    first = [next(stream) for _ in range(model.config.block_size + 5)]  # well past the first crop
    stream.close()
    assert len(first) == model.config.block_size + 5
    assert max(w for w in widths if w is not None) <= 3 + model.config.block_size


# ---------------------------------------------------------------------------------- min-p and the repetition penalty

def test_min_p_and_repetition_penalty_give_the_hand_computed_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])
    seen = torch.tensor([[True, False, False, True, False]])
    # penalty 2 on the seen tokens 0 and 3: 2.0 -> 1.0 (divided), -1.0 -> -2.0 (multiplied)
    # min-p 0.5 keeps logits >= 1.0 + ln 0.5 = 0.307: tokens 0, 1, 2, weights e, e, e**0.5
    e, r = math.e, math.exp(0.5)
    want = torch.tensor([[e, e, r, 0, 0]]) / (2 * e + r)
    got = logits_to_probs(logits, 1.0, min_p=0.5, repetition_penalty=2.0, seen=seen)
    torch.testing.assert_close(got, want)
    weights, ids = candidate_probs(logits, 1.0, min_p=0.5, repetition_penalty=2.0, seen=seen)
    full = weights if ids is None else torch.zeros_like(logits).scatter(-1, ids, weights)
    torch.testing.assert_close(full / full.sum(), want)
    # temperature 0.5 with min-p 0.3: logits 4, 2, 1, -2, 0 -> keep logit >= 4 + ln 0.3 = 2.796: token 0 alone
    got = logits_to_probs(logits, 0.5, min_p=0.3)
    torch.testing.assert_close(got, torch.tensor([[1.0, 0, 0, 0, 0]]))
    # greedy with the penalty: token 0 (2.0 -> 1.0) ties token 1; argmax takes the first index
    assert sample(logits, 0.0, repetition_penalty=2.1, seen=seen).item() == 1


@pytest.mark.parametrize("V", [50, 2000])  # the second goes through the 512-candidate path
def test_the_candidate_path_and_the_full_path_agree_with_min_p_and_the_penalty(V):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, V, generator=g) * 3
    seen = torch.rand(4, V, generator=g) < 0.2
    for top_k, top_p, min_p, pen in [(None, None, 0.05, 1.3), (20, None, 0.1, 1.5), (None, 0.9, 0.02, 0.8),
                                     (40, 0.8, None, 1.2), (None, None, 0.9, None)]:
        want = logits_to_probs(logits, 0.7, top_k, top_p, min_p, pen, seen)
        weights, ids = candidate_probs(logits, 0.7, top_k, top_p, min_p, pen, seen)
        full = weights if ids is None else torch.zeros_like(logits).scatter(-1, ids, weights)
        torch.testing.assert_close(full / full.sum(-1, keepdim=True), want, atol=1e-6, rtol=1e-5)


def constant_logits_model(logits: list[float]) -> GPT:
    """A tiny GPT whose next-token logits are `logits` at every position, whatever the input: ln_f's
    weight is 0 and its bias e_0, so every final hidden state is e_0, and the tied head reads wte[:, 0]."""
    config = GPTConfig(vocab_size=len(logits), block_size=16, n_layer=1, n_head=1, n_embd=4)
    model = GPT(config).eval()
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(torch.tensor([1.0, 0, 0, 0]))
        model.transformer.wte.weight[:, 0] = torch.tensor(logits)
    return model


def test_generation_with_min_p_and_repetition_penalty_samples_the_hand_computed_distribution():
    model = constant_logits_model([2.0, 1.0, 0.5, -1.0, 0.0])
    n = 4000
    prompts = [[0, 3]] * n  # tokens 0 and 3 are in every row's context
    out = generate(model, prompts, 1, temperature=1.0, top_k=None, min_p=0.5, repetition_penalty=2.0,
                   generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(torch.tensor([row[0] for row in out]), minlength=5).float() / n
    e, r = math.e, math.exp(0.5)
    want = torch.tensor([e, e, r, 0, 0]) / (2 * e + r)  # as in the test above
    assert freq[3] == 0 and freq[4] == 0
    torch.testing.assert_close(freq, want, atol=0.03, rtol=0)
    # the penalty follows the text: after sampling token 1 it is penalised too (greedy shows it)
    out = generate(model, [[4]], 3, temperature=0.0, repetition_penalty=5.0)
    # step 1: logits 2, 1, .5, -1, 0 -> 0; step 2: 0 seen, 2/5 = .4 -> 1 wins; step 3: 1 -> .2, so 2 (.5) wins
    assert out == [[0, 1, 2]]

