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
    for row, key in PLAN_ROWS.items():  # the run's other start-up decisions, as its plan saved them
        assert card_row(card, row) == str(saved["plan"][key]), row


TINY = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=50257)


@settings(max_examples=10)  # each writes an export
@given(version=st.sampled_from([1, 2, 3]), dtype=st.sampled_from(["float32", "bfloat16", "float16", ""]),
       elapsed=st.sampled_from([12.4, 0.4, 0.0, None, 10**400, True]))  # (an int past a float: math.isfinite raised)
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
    # version 1 kept no wall time (its upgrade's 0 s was shown as "0 s"), and a run's wall time is never 0
    shown = {12.4: "12 s", 0.4: "0.4 s"}.get(elapsed, "not recorded") if version > 1 else "not recorded"
    assert card_row(card, "wall time") == shown
    assert card_row(card, "run id") == f"r{version}" and "null" not in card.split("## Training")[1].split("```")[0]


PLAN_ROWS = {"attention kernel": "attention", "LM head's weight gradient by": "loss_product",
             "micro-batch (sequences per rank)": "micro_batch", "micro-steps per step (all ranks)": "accum",
             "steps planned": "max_iters", "warm-up steps": "warmup_iters"}
PLANS = st.fixed_dictionaries({}, optional={
    "attention": st.sampled_from(["flash", "cudnn", "efficient", "default"]), "loss_product": st.just("torch.mm"),
    "micro_batch": st.integers(1, 64), "accum": st.integers(1, 16), "max_iters": st.integers(1, 9000),
    "warmup_iters": st.integers(0, 100)})


@settings(max_examples=8)  # each writes an export
@given(plan=PLANS)
def test_the_card_gives_each_start_up_decision_of_the_plan_or_not_recorded(plan, tmp_path_factory):
    """Before: of the plan the card gave the dtype only; a reader could not tell the batch a run measured, the
    steps a time budget left or the GPU's attention kernel. Each row is the plan's value, "not recorded" without."""
    base = tmp_path_factory.mktemp("plan")
    torch.save({"format": "smallgpt-checkpoint", "version": 3, "model": GPT(TINY).state_dict(),
                "model_config": dataclasses.asdict(TINY), "tokenizer": GPT2, "plan": {**plan, "notes": {}},
                "train": {"iter": 1, "best_val_loss": 3.5, "tokens_seen": 64, "elapsed_s": 2.0, "run_id": "r"}},
               base / "ckpt.pt")
    assert export.main(["--checkpoint", str(base / "ckpt.pt"), "--out", str(base / "hf")]) == 0
    card = (base / "hf" / "README.md").read_text()
    for row, key in PLAN_ROWS.items():
        assert card_row(card, row) == (str(plan[key]) if key in plan else "not recorded"), row
    both = "micro_batch" in plan and "accum" in plan
    assert card_row(card, "sequences per step") == (str(plan["micro_batch"] * plan["accum"]) if both else "not recorded")


# ------------------------------------------------------------------ what the export says it wrote

SHAKESPEARE_LINES = ["First Citizen: Before we proceed any further, hear me speak.",
                     "All: Speak, speak.", "First Citizen: You are all resolved rather to die than to famish?"]


@settings(max_examples=8)  # each writes an export
@given(kind=st.sampled_from(["gpt2", "bpe", "char"]), bpe_size=st.integers(300, 600))
def test_the_export_line_and_the_card_say_which_tokenizer_files_were_written(kind, bpe_size, tmp_path_factory, capsys):
    """Before: a checkpoint of a BPE trained on its corpus (bpe:<n>) was exported with its own tokenizer.json,
    but the line printed said "GPT-2's tokenizer" and the card "Tokenizer: GPT-2's BPE (bpe:<n>)". The
    reference: the files in the exported directory, and the tokenizer.json written read back against the
    checkpoint's. A character-level checkpoint is refused in one line, nothing written."""
    from data.tokenizer import train_bpe
    from errors import run_cli

    base = tmp_path_factory.mktemp("tok")
    capsys.readouterr()
    if kind == "bpe":
        tokenizer = {"tokenizer": f"bpe:{bpe_size}", "chars": None, "bpe": train_bpe(SHAKESPEARE_LINES * 20, bpe_size)}
    elif kind == "char":
        tokenizer = {"tokenizer": "char", "chars": "".join(sorted(set("".join(SHAKESPEARE_LINES))))}
    else:
        tokenizer = GPT2
    config = dataclasses.replace(TINY, vocab_size=bpe_size if kind == "bpe" else 50257 if kind == "gpt2" else 64)
    torch.save({"format": "smallgpt-checkpoint", "version": 3, "model": GPT(config).state_dict(),
                "model_config": dataclasses.asdict(config), "tokenizer": tokenizer}, base / "ckpt.pt")
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: export.main(["--checkpoint", str(base / "ckpt.pt"), "--out", str(base / "hf")]))
    out, err = capsys.readouterr()
    if kind == "char":
        assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "character-level" in err, err
        assert not (base / "hf").exists()
        return
    assert e.value.code == 0, err
    written = sorted(p.name for p in (base / "hf").iterdir())
    line = out.strip()
    assert line.startswith(f"wrote {base / 'hf'} as HF gpt2 ({', '.join(written)}); tokenizer: "), line
    said = re.search(r"Tokenizer: (.*?)\. Its logits", (base / "hf" / "README.md").read_text()).group(1)
    assert f"tokenizer: {said}; load it with" in line  # the card and the line say the same
    if kind == "bpe":
        assert (base / "hf" / "tokenizer.json").read_text() == tokenizer["bpe"] and "vocab.json" not in written
        assert "tokenizer.json" in said and f"(bpe:{bpe_size})" in said
        assert "GPT-2" not in said and "GPT-2" not in line and "vocab.json" not in said
    else:
        assert {"vocab.json", "merges.txt"} <= set(written) and "tokenizer.json" not in written
        assert "GPT-2's BPE" in said and "vocab.json and merges.txt" in said and "tokenizer.json" not in line


@settings(max_examples=4)  # each writes an export
@given(where=st.sampled_from(["wandb.run_name", "eval.sample_prompts", "data.dataset"]),
       size=st.integers(300_000, 2_000_000))
def test_a_config_of_absurd_size_is_left_out_of_the_card_by_its_size(where, size, tmp_path_factory):
    """Found from outside: a checkpoint whose config held a 200 MB run name made the export take 4 minutes and
    ~880 MB, and the string went whole into README.md. A config over the bound is left out, said in one line."""
    base = tmp_path_factory.mktemp("big")
    section, key = where.split(".")
    value = ["x" * size] if key == "sample_prompts" else "x" * size
    torch.save({"format": "smallgpt-checkpoint", "version": 3, "model": GPT(TINY).state_dict(),
                "model_config": dataclasses.asdict(TINY), "tokenizer": GPT2, "plan": {"notes": {}},
                "config": {section: {key: value}},
                "train": {"iter": 1, "best_val_loss": 3.5, "tokens_seen": 64, "elapsed_s": 2.0, "run_id": "r"}},
               base / "ckpt.pt")
    assert export.main(["--checkpoint", str(base / "ckpt.pt"), "--out", str(base / "hf")]) == 0
    card = (base / "hf" / "README.md").read_text()
    assert len(card) < 20_000 and "The resolved training config is left out" in card, len(card)
    assert "x" * 1000 not in card
