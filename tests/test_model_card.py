"""The exported model card (checkpoint/model_card.py) says what the checkpoint holds, read from where the
checkpoint keeps it, and what the export actually wrote: checked against the checkpoint file read back with
torch.load, and against the files in the exported directory."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from checkpoint import export  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from tiny_runs import _one_thread, run  # noqa: E402,F401 (_one_thread: an autouse fixture)

GPT2 = {"tokenizer": "gpt2", "chars": None}


def card_row(card: str, field: str) -> str:
    """The value of one row of the card's tables, `| `field` | value |`."""
    found = re.findall(rf"^\| `{re.escape(field)}` \| (.*) \|$", card, re.M)
    assert len(found) == 1, (field, card)
    return found[0]


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, data_root):
    """A tiny run on GPT-2's tokenizer (the export's), trained in bfloat16, and its export."""
    base = tmp_path_factory.mktemp("bf16")
    run(base / "run", data_root, "--data.tokenizer=gpt2", "--train.dtype=bfloat16", "--train.max_iters=2",
        "--train.eval_interval=2", "--train.eval_iters=1")
    assert export.main(["--checkpoint", str(base / "run"), "--out", str(base / "hf")]) == 0
    return base


def test_the_card_gives_the_dtype_the_run_trained_in(bf16_run):
    """Before: the card read the dtype from the counters ("train"), where format 3 no longer keeps it, and
    always showed `null`. The reference: the plan entry of ckpt.pt, read back by torch.load."""
    saved = torch.load(bf16_run / "run" / "ckpt.pt", map_location="cpu", weights_only=True)
    assert saved["plan"]["dtype"] == "bfloat16" and "dtype" not in saved["train"]
    card = (bf16_run / "hf" / "README.md").read_text()
    assert card_row(card, "dtype") == saved["plan"]["dtype"]
    assert card_row(card, "run id") == saved["train"]["run_id"] and card_row(card, "steps") == str(saved["train"]["iter"])
    assert card_row(card, "tokens seen") == str(saved["train"]["tokens_seen"])


TINY = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=50257)


@settings(max_examples=10)  # each writes an export
@given(version=st.sampled_from([1, 2, 3]), dtype=st.sampled_from(["float32", "bfloat16", "float16", ""]),
       elapsed=st.sampled_from([12.4, None]))
def test_every_checkpoint_version_gives_its_dtype_or_not_recorded(version, dtype, elapsed, tmp_path_factory):
    """A checkpoint of each format version, written by hand as that version wrote it: version 1 recorded no
    dtype, version 2 kept it among the counters ("" when not decided), version 3 in its own "plan" entry.
    The card gives the dtype written, or "not recorded" (never null, never a guess)."""
    base = tmp_path_factory.mktemp("v")
    counters = {"iter": 5, "best_val_loss": 3.5, "tokens_seen": 640, **({"elapsed_s": elapsed} if elapsed else {})}
    payload = {"format": "smallgpt-checkpoint", "version": version, "model": GPT(TINY).state_dict(),
               "model_config": dataclasses.asdict(TINY), "tokenizer": GPT2}
    if version == 1:
        payload.update(counters, wandb_run_id="r1")
    elif version == 2:
        payload["train"] = {**counters, "run_id": "r2", "dtype": dtype}
    else:
        payload["train"] = {**counters, "run_id": "r3"}
        payload["plan"] = {"notes": {"dtype": f"dtype {dtype}"}, "dtype": dtype} if dtype else {"notes": {}}
    torch.save(payload, base / "ckpt.pt")
    assert export.main(["--checkpoint", str(base / "ckpt.pt"), "--out", str(base / "hf")]) == 0
    card = (base / "hf" / "README.md").read_text()
    assert card_row(card, "dtype") == (dtype if dtype and version > 1 else "not recorded")
    if version > 1:  # (version 1's upgrade counts its wall time from 0 s: a resumed run adds to it)
        assert card_row(card, "wall time") == ("12 s" if elapsed else "not recorded")
    assert card_row(card, "run id") == f"r{version}" and "null" not in card.split("## Training")[1].split("```")[0]
