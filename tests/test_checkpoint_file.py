"""model/checkpoint.py: atomic writes survive a crash mid-write; every bad file is a one-line UserError."""
from __future__ import annotations

import os
import pickle
import textwrap
from pathlib import Path

import pytest
import torch

from errors import UserError
from checkpoint import FORMAT, load_checkpoint, save_checkpoint
import warm_runs

ROOT = Path(__file__).resolve().parents[1]


def _payload(value: float) -> dict:
    return {"model": {"w": torch.full((4, 4), value)}, "iter": int(value), "config": {"train": {"lr": 1e-3}},
            "rng": {"python": [3, list(range(5)), None]}, "scaler": None}


def test_saved_checkpoint_loads_back_with_weights_only_and_is_stamped(tmp_path):
    save_checkpoint(tmp_path / "ckpt.pt", _payload(2.0))
    ck = load_checkpoint(tmp_path / "ckpt.pt")
    assert ck["format"] == FORMAT and ck["version"] == 4
    assert torch.equal(ck["model"]["w"], torch.full((4, 4), 2.0))
    # a directory means its ckpt.pt; plain torch.load with weights_only works too (other readers)
    assert load_checkpoint(tmp_path)["iter"] == 2
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["iter"] == 2


def test_version_1_checkpoint_is_read_with_its_counters_under_train(tmp_path):
    """Files written before the one-state refactor: counters at the top level, one optimizer state,
    rank 0's RNG streams, scaler None."""
    v1 = {"format": FORMAT, "version": 1, "model": {"w": torch.ones(2)}, "iter": 7, "best_val_loss": 2.5,
          "tokens_seen": 700, "wandb_run_id": "abcd1234", "optimizer": {"state": {}, "param_groups": []},
          "rng": {"torch": torch.zeros(3, dtype=torch.uint8)}, "scaler": None}
    torch.save(v1, tmp_path / "ckpt.pt")
    ck = load_checkpoint(tmp_path)
    assert ck["version"] == 4 and ck["window"] == {"steps": 0, "loss_sums": [], "seconds": 0.0}  # none was kept
    assert ck["train"] == {"iter": 7, "best_val_loss": 2.5, "tokens_seen": 700, "run_id": "abcd1234", "elapsed_s": 0.0}
    assert ck["plan"] == {"notes": {"loss_product": "LM head's weight gradient by torch.mm"}, "loss_product": "torch.mm"}
    assert ck["optimizer"] == {"optimizers": [{"state": {}, "param_groups": []}]}
    assert torch.equal(ck["rng"]["ranks"][0]["torch"], torch.zeros(3, dtype=torch.uint8)) and ck["scaler"] == {}
    assert "iter" not in ck and torch.equal(ck["model"]["w"], torch.ones(2))


def test_failure_between_write_and_rename_keeps_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, _payload(1.0))

    def crash(*a, **k):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(path, _payload(2.0))
    monkeypatch.undo()
    ck = load_checkpoint(path)
    assert ck["iter"] == 1 and torch.equal(ck["model"]["w"], torch.ones(4, 4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # temp file cleaned up


def test_failure_while_writing_keeps_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, _payload(1.0))
    real_save = torch.save

    def half_write(obj, f, *a, **k):
        f.write(b"PK\x03\x04 half a zip file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", half_write)
    with pytest.raises(OSError):
        save_checkpoint(path, _payload(2.0))
    monkeypatch.setattr(torch, "save", real_save)
    assert load_checkpoint(path)["iter"] == 1


def test_process_killed_between_write_and_rename_leaves_old_checkpoint_loadable(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, _payload(1.0))
    child = textwrap.dedent(f"""
        import os, signal, sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        from checkpoint import save_checkpoint
        os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)   # die right before the rename
        save_checkpoint({str(path)!r}, {{"model": {{"w": torch.full((4, 4), 2.0)}}, "iter": 2}})
    """)
    r = warm_runs.run(["-c", child], text=False)
    assert r.returncode == -9, r.stderr.decode()
    assert len(list(tmp_path.glob(".ckpt.pt.*.tmp"))) == 1  # the new bytes were written, not renamed
    assert load_checkpoint(path)["iter"] == 1
    save_checkpoint(path, _payload(3.0))  # a stale temp file does not block the next save
    assert load_checkpoint(path)["iter"] == 3


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "MARKER"
    evil = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "version": 1, "model": _Evil(marker)}, evil)
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps(_Evil(marker)))
    for p in (evil, raw):
        with pytest.raises(UserError, match="would run code.*refused"):
            load_checkpoint(p)
    assert not marker.exists()


@pytest.mark.parametrize("case", ["missing", "dir_without_ckpt", "truncated", "garbage", "not_ours", "newer"])
def test_bad_checkpoint_files_raise_one_line_user_error(tmp_path, case):
    good = tmp_path / "good.pt"
    save_checkpoint(good, _payload(1.0))
    target = tmp_path / "target.pt"
    if case == "missing":
        pattern = "does not exist"
    elif case == "dir_without_ckpt":
        target = tmp_path / "empty_dir"
        target.mkdir()
        pattern = "no ckpt.pt or ckpt.dcp in directory"
    elif case == "truncated":
        data = good.read_bytes()
        target.write_bytes(data[: len(data) // 2])
        pattern = "corrupt or truncated"
    elif case == "garbage":
        target.write_bytes(b"this is not a checkpoint at all")
        pattern = "corrupt"
    elif case == "not_ours":
        torch.save({"model": {"w": torch.ones(2)}}, target)
        pattern = "not a smallgpt checkpoint"
    else:
        torch.save({"format": FORMAT, "version": 99}, target)
        pattern = "format version 99"
    with pytest.raises(UserError, match=pattern) as ei:
        load_checkpoint(target)
    assert "\n" not in str(ei.value)


# -------------------------------------------------------------- values from a file are quoted cut

MODEL_FIELDS = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "attn_backend",
                "gelu_approximate", "layer_norm_eps", "pos_embedding", "rope_base", "norm", "qk_norm", "mlp_act",
                "tie_embeddings", "zero_init_proj", "logit_softcap")
HUGE = [lambda n: "9" * n, lambda n: "x" * n, lambda n: int("9" * min(n, 4000)), lambda n: -int("9" * min(n, 4000)),
        lambda n: ["a"] * n, lambda n: {"k" * n: 1}]


@pytest.mark.parametrize("field", MODEL_FIELDS)
@pytest.mark.parametrize("huge", range(len(HUGE)))
def test_a_huge_value_in_a_checkpoints_model_config_is_quoted_cut(field, huge):
    """A checkpoint whose model_config.n_embd was a 10,000-character string gave a 10,177-character line: every
    field of it, given a huge string, number or list, is refused in a line of under 300 characters."""
    from dataclasses import asdict

    from checkpoint.load import checked_model_config
    from model import GPTConfig

    saved = {**asdict(GPTConfig(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=8)),
             field: HUGE[huge](10_000)}
    with pytest.raises(UserError) as e:
        checked_model_config(saved, "out/ckpt.pt")
    line = str(e.value)
    assert "\n" not in line and len(line) < 300 and "out/ckpt.pt" in line, (len(line), line[:400])
