"""HF GPT-2 directories whose layout our reader once got wrong, against transformers' own loading of the same
folder (AutoModelForCausalLM): a config that ties the head to wte while the weights store a head of their own
(transformers unties it; we tied it and dropped the stored head, another model), and a save_pretrained with
max_shard_size (model.safetensors.index.json + model-0000N-of-0000M.safetensors: refused as "no weights").
Every loader (sample.py, chat.py, serve.py, eval/, init_from) loads through checkpoint/load.py, so the
properties run there in-process; sample.py is the entry point run end to end.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

transformers = pytest.importorskip("transformers")

from inference import sample_cli  # noqa: E402
from checkpoint import load_for_inference  # noqa: E402
from errors import UserError  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from hostile_world import run_entry  # noqa: E402

TINY = dict(n_layer=1, n_head=2, n_embd=8, n_positions=32, vocab_size=50257)
IDX = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf-base")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**TINY))
    with torch.no_grad():  # non-zero biases: their path is compared too
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
    model.save_pretrained(path)  # tied: model.safetensors without lm_head.weight
    return path


def theirs(path: Path) -> torch.Tensor:
    with warnings.catch_warnings():  # "both are present ... we will NOT tie them": the case under test
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        return model(IDX).logits


def ours(path: Path) -> torch.Tensor:
    with torch.no_grad():
        return load_for_inference(str(path)).model(IDX)


def make_dir(base: Path, where: Path, tie: bool | None, head: str, seed: int = 0) -> Path:
    """`base` with config.json's tie_word_embeddings `tie` (None: absent) and lm_head.weight `head`."""
    hf = where / "hf"
    shutil.copytree(base, hf)
    config = json.loads((hf / "config.json").read_text())
    config.pop("tie_word_embeddings", None)
    if tie is not None:
        config["tie_word_embeddings"] = tie
    (hf / "config.json").write_text(json.dumps(config))
    tensors = load_file(hf / "model.safetensors")
    wte = tensors["transformer.wte.weight"]
    if head == "equal to wte":
        tensors["lm_head.weight"] = wte.clone()
    elif head == "different":
        tensors["lm_head.weight"] = torch.randn(wte.shape, generator=torch.Generator().manual_seed(seed))
    save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
    return hf


@settings(max_examples=9)  # 3 x 3 cases; each loads transformers' model too
@given(tie=st.sampled_from([True, False, None]), head=st.sampled_from(["absent", "equal to wte", "different"]),
       seed=st.integers(0, 2**16))
def test_the_head_is_the_one_transformers_uses_whatever_the_tie_flag(base, tie, head, seed):
    with tempfile.TemporaryDirectory() as tmp:
        hf = make_dir(base, Path(tmp), tie, head, seed)
        if tie is False and head == "absent":  # transformers makes up a random head: refused, naming the fix
            with pytest.raises(UserError) as e:
                ours(hf)
            assert "\n" not in str(e.value) and "set tie_word_embeddings to true" in str(e.value), e.value
            return
        torch.testing.assert_close(ours(hf), theirs(hf), rtol=0, atol=1e-4)
        model = load_for_inference(str(hf)).model
        # equal or absent, and tied in the config: still one tensor (as transformers ties it)
        assert (model.lm_head.weight is model.transformer.wte.weight) == (tie is not False and head != "different")


def test_sample_py_continues_with_the_stored_head(base, tmp_path, capsys):
    import tiktoken

    hf = make_dir(base, tmp_path, True, "different")
    code, out, err = run_entry(sample_cli.main, ["--checkpoint", hf, "--prompt", "ROMEO:", "--temperature", "0",
                                             "--max-new-tokens", "8", "--no-stop-at-eot", "--dtype", "float32",
                                             "--no-stream"], capsys)
    enc = tiktoken.get_encoding("gpt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    ids = torch.tensor([enc.encode("ROMEO:")])
    with torch.no_grad():
        want = model.generate(ids, do_sample=False, max_new_tokens=8, min_new_tokens=8, attention_mask=torch.ones_like(ids))
    assert code == 0 and out.rstrip("\n") == enc.decode(want[0].tolist()), (err, out)


# ------------------------------------------------------------------------------- sharded safetensors

@settings(max_examples=6)
@given(shard_kb=st.sampled_from([200, 500, 1000]), tie=st.sampled_from([True, None]),
       head=st.sampled_from(["absent", "different"]))
def test_a_sharded_save_pretrained_loads_as_transformers_loads_it(base, shard_kb, tie, head):
    with tempfile.TemporaryDirectory() as tmp:
        one = make_dir(base, Path(tmp), tie, head)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = transformers.AutoModelForCausalLM.from_pretrained(one)
        sharded = Path(tmp) / "sharded"
        model.save_pretrained(sharded, max_shard_size=f"{shard_kb}KB")
        assert not (sharded / "model.safetensors").exists() and (sharded / "model.safetensors.index.json").is_file()
        torch.testing.assert_close(ours(sharded), theirs(sharded), rtol=0, atol=1e-4)


DAMAGE = {  # an index and shards that disagree: one line naming the index or the shard
    "a shard missing": lambda d, shards, index: shards[0].unlink(),
    "a shard a folder": lambda d, shards, index: (shards[0].unlink(), shards[0].mkdir()),
    "a shard cut short": lambda d, shards, index: shards[0].write_bytes(shards[0].read_bytes()[:100]),
    "a shard outside": lambda d, shards, index: index["weight_map"].update({next(iter(index["weight_map"])): "../x.safetensors"}),
    "a name moved": lambda d, shards, index: index["weight_map"].update(
        {next(k for k, v in index["weight_map"].items() if v != shards[-1].name): shards[-1].name}),
    "an extra name": lambda d, shards, index: index["weight_map"].update({"transformer.h.0.extra": shards[0].name}),
    "no weight_map": lambda d, shards, index: index.pop("weight_map"),
    "not JSON": lambda d, shards, index: index.clear() or index.update({"__raw__": "{"}),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_sharded_directory_is_one_line(base, tmp_path, damage):
    model = transformers.GPT2LMHeadModel.from_pretrained(base)
    model.save_pretrained(tmp_path / "hf", max_shard_size="300KB")
    hf = tmp_path / "hf"
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    shards = sorted(hf.glob("model-*.safetensors"))
    assert len(shards) > 1
    DAMAGE[damage](hf, shards, index)
    text = "{" if "__raw__" in index else json.dumps(index)
    (hf / "model.safetensors.index.json").write_text(text)
    with pytest.raises(UserError) as e:
        ours(hf)
    line = str(e.value)
    assert "\n" not in line and str(hf) in line and ("index.json" in line or "model-0" in line), line


def test_our_smallgpt_export_is_refused_with_advice_that_works(tmp_path):
    from checkpoint.hf import write_hf_model
    from model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=50257, block_size=32, n_layer=1, n_head=2, n_embd=8, pos_embedding="rope",
                          norm="rmsnorm", mlp_act="swiglu", bias=False, logit_softcap=30.0))
    (tmp_path / "hf").mkdir()
    fmt = write_hf_model(model, tmp_path / "hf", 50257, 50256)
    with pytest.raises(UserError) as e:
        ours(tmp_path / "hf")
    line = str(e.value)
    assert fmt in line and "re-export" not in line and "pass the checkpoint it was exported from" in line, line
