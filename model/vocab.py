"""Growing a model's vocabulary: the chat markers of a model whose embedding does not reach them (fine-tuning
from a checkpoint or HF GPT-2, training/chat.py; the base model's evaluation, eval/chat_tasks.py)."""
from __future__ import annotations

import torch

NEW_ROW_STD = 0.02  # GPT.init_weights' scale: the noise that keeps the new rows apart from one another


@torch.no_grad()
def grow_vocab(model, vocab_size: int, seed: int) -> str:
    """Grow the model's token embedding (and an untied LM head) to `vocab_size` rows. Each new row is the mean
    of the existing rows plus normal noise of NEW_ROW_STD drawn from `seed`: the mean makes a new token look
    like an average token to the layers that follow (no outlier norm, no logit far above the others), and
    the noise lets the markers differ from one another from the first step. Returns the note to print."""
    wte = model.transformer.wte
    old, dim = wte.weight.shape
    if vocab_size <= old:
        return ""
    gen = torch.Generator().manual_seed(seed)

    def grown(weight: torch.Tensor) -> torch.nn.Parameter:
        new = weight.float().mean(0, keepdim=True) + NEW_ROW_STD * torch.randn(vocab_size - old, dim, generator=gen)
        return torch.nn.Parameter(torch.cat([weight, new.to(weight.dtype)]))

    wte.weight = grown(wte.weight)
    wte.num_embeddings = vocab_size
    if model.config.tie_embeddings:
        model.tie_weights()
    else:
        head = model.lm_head
        head.weight = grown(head.weight)
        head.out_features = vocab_size
    model.config.vocab_size = vocab_size
    return (f"model vocabulary grown {old} -> {vocab_size} for the chat markers (new rows: the mean of the "
            f"existing rows + N(0, {NEW_ROW_STD}^2) noise)")
