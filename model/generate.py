"""Autoregressive generation with the KV cache: sampling helpers, prefill, one-token decode steps.

gpt-fast style: one `prefill` over the prompt writes every layer's keys and values into a preallocated
cache, then each new token costs one forward of a single position through that cache.

Crop rule (the one rule, shared with nanoGPT's uncached loop). The next token of a sequence of length
L is predicted from its last min(L, block_size) tokens, which take position ids 0.. in that window.
While L <= block_size the cached keys are exactly that context. Once a sequence outgrows block_size
every token's position shifts by one per step, so cached keys are stale: from then on each step
recomputes the cropped window from scratch (no cache; it would be rebuilt every step anyway). No
position id ever reaches block_size, and the result is token for token the uncached loop's:

    for _ in range(max_new_tokens):
        logits = model(idx[:, -block_size:])[:, -1]
        idx = torch.cat([idx, pick(logits)], dim=1)

Batches: prompts of different lengths are left-padded and the model gets a pad mask (True = real
token), so each row's position ids count its own tokens only and each row generates what it would
alone. With a batch, "the last block_size tokens" is taken over the padded matrix: a row shorter
than the window keeps all its real tokens and some pads, a longer row loses its oldest tokens, which
is the per-row crop rule above.

End of text: with `stop_at_eot` a row that samples `eot` is finished; the EOT itself is not emitted
and the row emits nothing more. The batch stops when every row has finished.

A conversation (chat.py) keeps one sequence's cache across turns: `CachedSequence`, whose new turn is
prefilled from the slot after the last cached one.

Speed (batch 1 decoding is bound by reading the weights): `sample` draws from the top-k (or top-512)
candidates instead of sorting the whole vocabulary. Device, dtype, compile and any hardware-specific
weight layout are applied from outside (runtime/decoding.py).
"""
from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "logits_to_probs", "candidate_probs", "penalize_repetition", "sample", "prefill", "decode_one_token", "generate_stream", "generate",
    "CachedSequence",
]


def logits_to_probs(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
    min_p: float | None = None, repetition_penalty: float | None = None, seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """Next-token probabilities (float32, same shape) from logits (..., V).

    Applied in this order: the repetition penalty (CTRL's, as in HF transformers: the logit of every
    token in `seen` (..., V bool, the tokens of the context) is divided by the penalty where positive,
    multiplied by it where negative), temperature (logits / T; T == 0 puts all the mass on the argmax,
    first index on ties), top-k (keep the tokens whose logit is >= the k-th largest), top-p (keep the
    most probable tokens, in decreasing order, up to and including the one at which the cumulative
    probability first reaches p; the top token always stays), min-p (keep the tokens whose probability
    is at least min_p times the top token's). Dropped tokens get 0 and the rest are renormalised. Every
    filter keeps every token tied with the last one kept, so the result never depends on how a sort
    orders equal values (bf16 logits have many).
    """
    logits = penalize_repetition(logits.float(), seen, repetition_penalty)
    V = logits.size(-1)
    if temperature == 0:
        return F.one_hot(logits.argmax(dim=-1), V).to(torch.float32)
    logits = logits / temperature
    if top_k is not None and top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits = torch.sort(logits, dim=-1, descending=True).values
        cut = _top_p_cut(sorted_logits, torch.softmax(sorted_logits, dim=-1), top_p)
        logits = logits.masked_fill(logits < cut, float("-inf"))
    if min_p is not None and min_p > 0:
        logits = logits.masked_fill(logits < _min_p_cut(logits.amax(dim=-1, keepdim=True), min_p), float("-inf"))
    return torch.softmax(logits, dim=-1)


def penalize_repetition(logits: torch.Tensor, seen: torch.Tensor | None, penalty: float | None) -> torch.Tensor:
    """logits (..., V) with the context's tokens (`seen`, bool (..., V)) made less likely: a positive
    logit divided by `penalty`, a negative one multiplied by it (so both move down for penalty > 1)."""
    if seen is None or penalty is None or penalty == 1.0:
        return logits
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def _min_p_cut(top_logit: torch.Tensor, min_p: float) -> torch.Tensor:
    """The smallest logit min-p keeps: p >= min_p * p_top  <=>  logit >= top_logit + log(min_p)."""
    return top_logit + math.log(min_p)


def _top_p_cut(sorted_logits: torch.Tensor, sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The logit (..., 1) of the last token top-p keeps, given logits sorted in decreasing order and
    their probabilities; the tokens to keep are those with logit >= it."""
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of the tokens ranked above
    last = (mass_before < top_p).sum(dim=-1, keepdim=True) - 1
    return sorted_logits.gather(-1, last)


NUCLEUS_CANDIDATES = 512  # top-p alone first looks for the nucleus among this many most likely tokens


def candidate_probs(
    logits: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None,
    min_p: float | None = None, repetition_penalty: float | None = None, seen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The distribution of `logits_to_probs`, restricted to a candidate set that holds all of its mass:
    (weights (B, C), ids (B, C)), or (probs (B, V), None) when the candidates are the whole vocabulary.

    Weights are unnormalised (multinomial normalises). Sampling among the k (or 512) most likely
    tokens instead of all V skips the full softmax and the full sort that top-p needs: at GPT-2's
    vocabulary that is most of the sampling time. Ties at the k-th logit widen the candidate set (they
    all stay, as in logits_to_probs); a nucleus that does not end inside the 512 falls back to the
    full vocabulary. The repetition penalty is elementwise (one pass over V); min-p keeps a prefix of
    the sorted candidates, as top-p does.
    """
    logits = penalize_repetition(logits.float(), seen, repetition_penalty) / temperature
    V = logits.size(-1)
    use_min_p = min_p is not None and min_p > 0
    if top_k is not None and top_k < V:
        vals, ids = torch.topk(logits, top_k, dim=-1)  # sorted, most likely first
        kth = vals[:, -1:]
        n_keep = int((logits >= kth).sum(dim=-1).max())
        if n_keep > top_k:  # ties at the k-th value all stay
            vals, ids = torch.topk(logits, n_keep, dim=-1)
            vals = vals.masked_fill(vals < kth, float("-inf"))
        probs = torch.softmax(vals, dim=-1)
        if top_p is not None and top_p < 1.0:
            probs = probs.masked_fill(vals < _top_p_cut(vals, probs, top_p), 0.0)
        if use_min_p:
            probs = probs.masked_fill(vals < _min_p_cut(vals[:, :1], min_p), 0.0)
        return probs, ids
    nucleus = top_p is not None and top_p < 1.0
    if (nucleus or use_min_p) and V > NUCLEUS_CANDIDATES:
        vals, ids = torch.topk(logits, NUCLEUS_CANDIDATES, dim=-1)
        probs = torch.exp(vals - torch.logsumexp(logits, dim=-1, keepdim=True))  # of the full softmax
        lowest = torch.full_like(vals[:, :1], -float("inf"))
        cut = torch.maximum(_top_p_cut(vals, probs, top_p) if nucleus else lowest,
                            _min_p_cut(vals[:, :1], min_p) if use_min_p else lowest)
        if bool((vals[:, -1:] < cut).all()):  # the kept set ends inside the candidates, ties included
            return probs.masked_fill(vals < cut, 0.0), ids
    return logits_to_probs(logits, 1.0, top_k, top_p, min_p), None


def sample(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token id per row from logits (B, V) -> (B,), drawn from logits_to_probs' distribution.
    temperature == 0 is greedy (argmax of the penalised logits, first index on ties) and draws no
    random numbers."""
    if temperature == 0:  # (an fp32 argmax is faster than a bf16 one)
        return penalize_repetition(logits.float(), seen, repetition_penalty).argmax(dim=-1)
    weights, ids = candidate_probs(logits, temperature, top_k, top_p, min_p, repetition_penalty, seen)
    choice = torch.multinomial(weights, 1, generator=generator)  # (B, 1)
    return (choice if ids is None else ids.gather(-1, choice)).squeeze(-1)


def prefill(model, idx: torch.Tensor, kv_cache, pad_mask: torch.Tensor | None = None, *,
            start: int = 0) -> torch.Tensor:
    """Run the prompt idx (B, P) through the model, filling cache slots start..start+P-1 (the slots before
    `start` already hold the keys and values of what came before); last logits (B, V)."""
    input_pos = torch.arange(start, start + idx.size(1), device=idx.device)
    return model(idx, input_pos=input_pos, kv_cache=kv_cache, pad_mask=pad_mask)[:, -1]


def decode_one_token(model, tok: torch.Tensor, input_pos: torch.Tensor, kv_cache, pad_mask=None) -> torch.Tensor:
    """One new token per row, tok (B, 1), written at cache slot input_pos (1,); its logits (B, V)."""
    return model(tok, input_pos=input_pos, kv_cache=kv_cache, pad_mask=pad_mask)[:, -1]


class CachedSequence:
    """One sequence (batch 1) whose keys and values stay in a KV cache between calls, so that text added
    later (a chat's next turn) costs a forward of its new tokens only: `append` ids, then `logits` runs
    every id not yet run (a prefill from the first of them, or one decode step for a single id) and gives
    the next-token logits (1, V). Holds at most block_size ids: the caller makes room (`reset` with fewer
    ids starts a new cache). An interrupt inside `logits` leaves it consistent: `cached` moves only once
    the forward is done, so the next call runs those ids again and rewrites their slots.

    The cache starts small and doubles as the ids grow (up to block_size): every decode step attends over
    all its slots (those not written yet are masked), so a short conversation should not pay for a long
    context."""

    FIRST_SLOTS = 256

    def __init__(self, model, decode_fn=None):
        self.model, self.decode_fn = model, decode_fn or decode_one_token
        self.block_size = model.config.block_size
        self.cache = model.new_kv_cache(1, min(self.FIRST_SLOTS, self.block_size))
        self.ids: list[int] = []
        self.cached = 0  # the first `cached` ids have their keys and values in the cache

    @property
    def room(self) -> int:
        return self.block_size - len(self.ids)

    def append(self, ids: Sequence[int]) -> None:
        assert len(self.ids) + len(ids) <= self.block_size, "the caller keeps a conversation within the context"
        self.ids.extend(ids)

    def reset(self, ids: Sequence[int] = ()) -> None:
        """Start over from `ids`: nothing cached (the old slots are overwritten as the new ids run)."""
        self.ids, self.cached = [], 0
        self.append(ids)

    @torch.inference_mode()
    def logits(self) -> torch.Tensor:
        new = self.ids[self.cached:]
        assert new, "no new ids to run: append the last sampled id first"
        self._fit(len(self.ids))
        device = self.model.transformer.wte.weight.device
        idx = torch.tensor([new], dtype=torch.long, device=device)
        if len(new) == 1:
            logits = self.decode_fn(self.model, idx, torch.tensor([self.cached], device=device), self.cache)
        else:
            logits = prefill(self.model, idx, self.cache, start=self.cached)
        self.cached = len(self.ids)
        return logits

    def _fit(self, n: int) -> None:
        """A cache of at least n slots, the cached ones copied over."""
        slots = self.cache[0].k.size(2)
        if n <= slots:
            return
        while slots < n:
            slots *= 2
        bigger = self.model.new_kv_cache(1, min(slots, self.block_size))
        for old, new in zip(self.cache, bigger):
            new.k[:, :, :self.cached] = old.k[:, :, :self.cached]
            new.v[:, :, :self.cached] = old.v[:, :, :self.cached]
        self.cache = bigger


def _left_pad(prompts: Sequence[Sequence[int]], device) -> tuple[torch.Tensor, torch.Tensor | None]:
    width = max(len(p) for p in prompts)
    idx = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, p in enumerate(prompts):
        if len(p):
            idx[row, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            mask[row, width - len(p) :] = True
    pad = None if bool(mask.all()) else mask.to(device)
    return idx.to(device), pad


@torch.inference_mode()
def generate_stream(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eot: int | None = None,
    stop_at_eot: bool = True,
    use_cache: bool = True,
    vocab_size: int | None = None,
    decode_fn=None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
) -> Iterator[list[int | None]]:
    """Yield, once per step, each row's new token id, or None for a row that has finished.

    prompts: one non-empty list of token ids per row (lengths may differ). The model must be in eval
    mode; it runs on the device and dtype of its weights, and so does the cache. use_cache=False runs
    the plain uncached loop under the same crop rule (for comparison). vocab_size: sample only ids below
    it (a model whose embedding is padded past the tokenizer's vocabulary). decode_fn replaces
    `decode_one_token` (e.g. a torch.compile'd version of it); one that has `new_cache(B, S, padded)` and
    `set_pad(pad)` also owns the KV cache (runtime/static_decode.py: static buffers for a CUDA graph). min_p, repetition_penalty: see
    logits_to_probs; the penalty applies to every token of the row so far (the whole prompt and all it
    generated, not only the window), as in HF transformers.
    """
    # the callers (sample.py's options, serve's requests, a chat turn) bound these where a user gives them
    assert prompts and all(len(p) for p in prompts), "every prompt needs a token (start an empty one from EOT)"
    assert max_new_tokens >= 1, max_new_tokens
    decode_fn = decode_fn or decode_one_token
    block_size = model.config.block_size
    device = model.transformer.wte.weight.device
    B = len(prompts)

    prompt_idx, prompt_pad = _left_pad(prompts, device)
    P = prompt_idx.size(1)
    total = P + max_new_tokens
    # The padded sequence, row r's real tokens right-most. Only the last block_size columns are ever read
    # again, so the buffer holds at most P + block_size columns and drops its oldest ones when full:
    # memory does not grow with max_new_tokens. Column w of the sequence is seq[:, w - offset].
    cap = P + min(max_new_tokens, block_size)
    seq = torch.zeros(B, cap, dtype=torch.long, device=device)
    seq[:, :P] = prompt_idx
    offset = 0
    pad = None
    if prompt_pad is not None:
        pad = torch.ones(B, cap, dtype=torch.bool, device=device)
        pad[:, :P] = prompt_pad

    def window_logits(width: int) -> torch.Tensor:
        """Logits after the last min(width, block_size) columns, computed without the cache."""
        start = max(0, width - block_size) - offset
        w_pad = None if pad is None else pad[:, start:width - offset]
        if w_pad is not None and bool(w_pad.all()):
            w_pad = None
        return model(seq[:, start:width - offset], pad_mask=w_pad)[:, -1]

    cache = cache_pad = None
    if use_cache and P <= block_size:
        # slots for everything that fits before the first crop; after that the cache is not used
        S = min(total, block_size)
        if hasattr(decode_fn, "new_cache"):  # a step over static buffers (runtime/static_decode.py) owns its cache
            cache = decode_fn.new_cache(B, S, padded=pad is not None)
            cache_pad = None if pad is None else decode_fn.set_pad(pad[:, :S])
        else:
            cache = model.new_kv_cache(B, S)
            cache_pad = None if pad is None else pad[:, :S].clone()
        logits = prefill(model, prompt_idx, cache, cache_pad)
    else:
        logits = window_logits(P)

    seen = None  # (B, V): the tokens each row has had; only the repetition penalty needs them
    if repetition_penalty is not None and repetition_penalty != 1.0:
        seen = torch.zeros(B, logits.size(-1), dtype=torch.bool)
        for row, p in enumerate(prompts):
            seen[row, torch.as_tensor(list(p), dtype=torch.long)] = True
        seen = seen.to(device)

    input_pos = torch.zeros(1, dtype=torch.long, device=device)  # the slot of the token being decoded
    done = [False] * B  # on the host: the step's one sync (tok.tolist) tells everything
    check_eot = stop_at_eot and eot is not None
    for step in range(max_new_tokens):
        if vocab_size is not None:
            logits = logits[:, :vocab_size]
        tok = sample(logits, temperature, top_k, top_p, generator, min_p, repetition_penalty,
                     None if seen is None else seen[:, :logits.size(-1)])  # (B,)
        if seen is not None:
            seen.scatter_(1, tok.view(B, 1), True)
        width = P + step  # columns filled so far; tok goes to column `width`
        if width - offset == cap:  # full: keep the last block_size - 1 columns, the window's past
            drop = cap - (block_size - 1)
            seq[:, : cap - drop] = seq[:, drop:].clone()
            if pad is not None:
                pad[:, : cap - drop] = pad[:, drop:].clone()
                pad[:, cap - drop:] = True
            offset += drop
        seq[:, width - offset] = tok
        out = tok.tolist()
        if check_eot:
            done = [d or t == eot for t, d in zip(out, done)]  # the EOT itself is not emitted
            yield [None if d else t for t, d in zip(out, done)]
            if all(done):
                return
        else:
            yield out
        if step == max_new_tokens - 1:
            return
        width += 1
        if cache is not None and width <= block_size:
            input_pos.fill_(width - 1)  # in place on the device: no host-to-device copy per token
            logits = decode_fn(model, tok.view(B, 1), input_pos, cache, cache_pad)
        else:
            logits = window_logits(width)


def generate(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
             into: list[list[int]] | None = None, **kwargs) -> list[list[int]]:
    """The generated token ids of every row (prompt not included); see generate_stream. `into`: the
    lists to append them to, so that what was generated before an interrupt is still there."""
    out: list[list[int]] = into if into is not None else [[] for _ in prompts]
    for step in generate_stream(model, prompts, max_new_tokens, **kwargs):
        for row, t in enumerate(step):
            if t is not None:
                out[row].append(t)
    return out
