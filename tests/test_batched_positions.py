"""Per-row positions: `GPT.forward(idx, input_pos=(B, T), kv_cache=...)` lets rows at different lengths
decode in one batch (the server's continuous batching). Reference: each row run alone, with no cache at
all, its whole sequence through the plain causal forward (fp32, 1e-5)."""
from __future__ import annotations

import pytest
import torch

from model import GPT, GPTConfig

VOCAB = 50


def tiny(pos_embedding: str) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=24, n_layer=2, n_head=2, n_embd=16,
                         pos_embedding=pos_embedding)).eval()


def alone(model: GPT, seq: list[int]) -> torch.Tensor:
    """The next-token logits after `seq`, from the uncached forward of the row by itself."""
    return model(torch.tensor([seq]))[0, -1]


@pytest.mark.parametrize("pos_embedding", ["learned", "rope"])
@torch.no_grad()
def test_rows_that_join_at_different_steps_decode_as_each_alone(pos_embedding):
    model = tiny(pos_embedding)
    starts = [0, 3, 7]  # row r joins at step starts[r]; until then it idles on slot 0 (overwritten on joining)
    g = torch.Generator().manual_seed(1)
    seqs = [[int(t) for t in torch.randint(VOCAB, (2,), generator=g)] for _ in starts]
    cache = model.new_kv_cache(len(starts), 20)
    checked = 0
    for step in range(12):
        lens = [step - s if step >= s else 0 for s in starts]  # tokens each row has already in its cache
        feed = [seqs[r][lens[r]] if step >= starts[r] else 0 for r in range(len(starts))]
        pos = torch.tensor([[n] for n in lens])  # (B, 1): each row at its own slot
        logits = model(torch.tensor([[t] for t in feed]), input_pos=pos, kv_cache=cache)[:, -1]
        for r, s in enumerate(starts):
            if step < s:
                continue
            ref = alone(model, seqs[r][: lens[r] + 1])
            torch.testing.assert_close(logits[r], ref, rtol=1e-5, atol=1e-5)
            checked += 1
            if lens[r] + 1 == len(seqs[r]):  # past its prompt: the row goes on with its own greedy token
                seqs[r].append(int(logits[r].argmax()))
    assert checked == 12 + 9 + 5


@pytest.mark.parametrize("pos_embedding", ["learned", "rope"])
@torch.no_grad()
def test_several_tokens_per_row_at_different_offsets(pos_embedding):
    model = tiny(pos_embedding)
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(VOCAB, (9,), generator=g).tolist() for _ in range(2)]
    cache = model.new_kv_cache(2, 16)
    # row 0 gets 3 tokens ahead of row 1 by a first chunk in which row 1 writes dummies (overwritten next)
    model(torch.tensor([seqs[0][:3], [7, 7, 7]]), input_pos=torch.tensor([[0, 1, 2], [0, 1, 2]]), kv_cache=cache)
    out = model(torch.tensor([seqs[0][3:6], seqs[1][0:3]]), input_pos=torch.tensor([[3, 4, 5], [0, 1, 2]]),
                kv_cache=cache)
    for r, n in ((0, 6), (1, 3)):
        for j in range(3):  # every position of the chunk, not only the last
            ref = model(torch.tensor([seqs[r][:n]]))[0, n - 3 + j]
            torch.testing.assert_close(out[r, j], ref, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_a_row_of_the_cache_holds_exactly_its_own_keys():
    model = tiny("learned")
    cache = model.new_kv_cache(2, 8)
    before = cache[0].k.clone()
    model(torch.tensor([[1], [2]]), input_pos=torch.tensor([[5], [2]]), kv_cache=cache)
    changed = (cache[0].k != before).any(dim=-1).any(dim=1)  # (B, S): which slots of which row were written
    assert changed.nonzero().tolist() == [[0, 5], [1, 2]]
