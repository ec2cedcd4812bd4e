"""The static-buffer decode step (runtime/static_decode.py), which a GPU replays as one CUDA graph, run
uncaptured on the CPU: its greedy text must equal the plain eager loop's and nanoGPT's uncached loop's
(the reference: no cache at all), also across calls that reuse its buffers, with left-padded batches,
with rotary positions, and past block_size (where generation leaves the cache)."""
from __future__ import annotations

import pytest
import torch

from model import GPT, GPTConfig
from model.generate import generate
from runtime.static_decode import StaticDecode


def uncached_greedy(model: GPT, prompt: list[int], new: int) -> list[int]:
    """nanoGPT's loop: the whole cropped context through the model for every token, argmax."""
    idx = torch.tensor([prompt])
    out = []
    with torch.no_grad():
        for _ in range(new):
            logits = model(idx[:, -model.config.block_size:])[0, -1]
            nxt = int(logits.argmax())
            out.append(nxt)
            idx = torch.cat([idx, torch.tensor([[nxt]])], dim=1)
    return out


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=24, vocab_size=97, **kw)
    model = GPT(cfg).eval()
    with torch.no_grad():  # sharper logits than the 0.02 init: argmax ties become impossible in practice
        for p in model.parameters():
            p.mul_(8.0) if p.dim() > 1 else None
    return model


@pytest.mark.parametrize("kw", [{}, {"pos_embedding": "rope", "norm": "rmsnorm"}], ids=["gpt2", "rope"])
def test_static_step_greedy_text_equals_eager_and_uncached_loop(kw):
    model = tiny(**kw)
    step = StaticDecode(model, capture=False)
    prompts = [[3, 14, 15, 92], [65, 35], [8]]
    for new in (5, 30):  # 30 runs past block_size 24: the cache is left, the window recomputed
        for p in prompts:
            eager = generate(model, [p], new, temperature=0)[0]
            static = generate(model, [p], new, temperature=0, decode_fn=step)[0]
            assert static == eager == uncached_greedy(model, p, new), (p, new)


def test_static_step_reuses_its_buffers_without_stale_state():
    model = tiny()
    step = StaticDecode(model, capture=False)
    long_first = generate(model, [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], 10, temperature=0, decode_fn=step)[0]
    short_after = generate(model, [[42]], 6, temperature=0, decode_fn=step)[0]  # slots 1.. hold the old keys
    assert short_after == uncached_greedy(model, [42], 6)
    assert long_first == uncached_greedy(model, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 10)
    assert len(step._static) == 1  # one set of buffers for batch 1, reused


def test_static_step_left_padded_batch_equals_each_row_alone():
    model = tiny()
    step = StaticDecode(model, capture=False)
    prompts = [[3, 14, 15, 92, 6], [65, 35], [8, 9, 10]]
    batched = generate(model, prompts, 7, temperature=0, decode_fn=step)
    assert batched == [uncached_greedy(model, p, 7) for p in prompts]
    assert (3, True) in step._static


def test_static_step_keeps_the_position_on_the_device_and_copies_it_in():
    """The graph reads its token and slot from its own buffers: after a call they hold what was passed."""
    model = tiny()
    step = StaticDecode(model, capture=False)
    with torch.inference_mode():
        cache = step.new_cache(1, 10)
        logits = step(model, torch.tensor([[7]]), torch.tensor([0]), cache)
        s = step._current
        assert s.tok.item() == 7 and s.pos.item() == 0 and s.cache is cache
        # the static step at slot 0 is the model's first-token logits, whatever the cache holds later on
        assert torch.allclose(logits[0], model(torch.tensor([[7]]))[0, -1], atol=1e-5)
