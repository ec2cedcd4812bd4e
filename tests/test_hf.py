"""HF GPT-2 weights in and out, checked against transformers itself (random weights, nothing downloaded)."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from model import GPT, GPTConfig  # noqa: E402
from checkpoint.hf import from_pretrained, write_hf_weights  # noqa: E402
from checkpoint.export import export_hf  # noqa: E402

HF_TINY = dict(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=50257)


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**HF_TINY)).eval()
    with torch.no_grad():  # HF inits biases to zero; make them non-zero so the bias path is compared too
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
    return model


@pytest.fixture(scope="module")
def hf_dir(hf_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("hf")
    hf_model.save_pretrained(path)
    return path


def random_tokens(T=40, vocab=50257):
    return torch.randint(0, vocab, (2, T), generator=torch.Generator().manual_seed(3))


def test_from_pretrained_matches_transformers_logits(hf_model, hf_dir):
    ours = from_pretrained(str(hf_dir)).eval()
    assert ours.config.n_layer == 2 and ours.config.block_size == 64
    # filled from the file's tensors (no init first): parameters as a built model's, trainable, tied
    for name, p in ours.named_parameters():
        assert p.dtype == torch.float32 and p.is_contiguous() and p.requires_grad and not p.is_meta, name
    assert ours.lm_head.weight is ours.transformer.wte.weight
    assert not any(b.is_meta for b in ours.buffers())
    idx = random_tokens()
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf_model(idx).logits, rtol=0, atol=1e-4)


def test_from_pretrained_reads_legacy_pytorch_model_bin(hf_model, tmp_path):
    # the original OpenAI-converted files: no "transformer." prefix, attention-mask buffers included
    sd = {k.removeprefix("transformer."): v for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}
    sd["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
    torch.save(sd, tmp_path / "pytorch_model.bin")
    hf_model.config.to_json_file(tmp_path / "config.json")
    ours = from_pretrained(str(tmp_path)).eval()
    idx = random_tokens()
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf_model(idx).logits, rtol=0, atol=1e-4)


def test_exported_directory_loads_in_transformers_with_same_logits(hf_dir, tmp_path):
    ours = from_pretrained(str(hf_dir)).eval()
    (tmp_path / "out").mkdir()
    write_hf_weights(ours, tmp_path / "out")
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    idx = random_tokens()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(idx).logits, ours(idx), rtol=0, atol=1e-4)


def test_export_of_a_biasless_exact_gelu_model_loads_in_transformers(tmp_path):
    torch.manual_seed(1)
    ours = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65, bias=False,
                         gelu_approximate="none")).eval()
    write_hf_weights(ours, tmp_path)
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert reloaded.config.activation_function == "gelu"
    idx = random_tokens(T=16, vocab=65)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(idx).logits, ours(idx), rtol=0, atol=1e-4)


def test_from_pretrained_of_a_directory_without_config_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(str(tmp_path))


def test_a_config_json_far_bigger_than_its_weights_is_refused_before_the_model_is_built(hf_model, tmp_path, monkeypatch):
    import json

    import checkpoint.meta as meta

    hf_model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    built = []

    class Recording(meta.GPT):  # every GPT from_pretrained builds comes from checkpoint/meta.py's meta_model
        def __init__(self, config):
            built.append((config.n_layer, str(torch.get_default_device())))
            super().__init__(config)
    monkeypatch.setattr(meta, "GPT", Recording)
    # one layer more than the weights have, then ~330B parameters' worth (weights of 2 tiny layers)
    for change, error in ((dict(n_layer=3), r"lacks \['transformer.h.2"),
                          (dict(n_layer=100, n_embd=16384, n_head=128), r"lacks|shape mismatch")):
        (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
        built.clear()
        with pytest.raises(ValueError, match=error):
            from_pretrained(str(tmp_path))
        assert built and all(device == "meta" for _, device in built), built  # shapes only, no memory


def test_from_pretrained_of_an_unreachable_hub_name_is_refused(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="neither a local HF directory nor a reachable hub model"):
        from_pretrained("gpt2-this-name-does-not-exist")


def run_export_cli(*args):
    from pathlib import Path

    import warm_runs

    return warm_runs.run(["-m", "checkpoint.export", *args], cwd=Path(__file__).resolve().parents[1])


def test_export_cli_writes_a_directory_transformers_loads(tmp_path):
    import dataclasses

    from checkpoint import save_checkpoint

    torch.manual_seed(2)
    ours = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=50257)).eval()
    save_checkpoint(tmp_path / "run" / "ckpt.pt", {"model": ours.state_dict(),
                                                   "model_config": dataclasses.asdict(ours.config),
                                                   "tokenizer": {"tokenizer": "gpt2", "chars": None}})
    result = run_export_cli("--checkpoint", tmp_path / "run", "--out", tmp_path / "hf")
    assert result.returncode == 0, result.stderr
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert reloaded.config.eos_token_id == 50256
    idx = random_tokens(T=16)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(idx).logits, ours(idx), rtol=0, atol=1e-4)

    # a second export into the same directory is refused, and the first one is left as it was
    before = (tmp_path / "hf" / "model.safetensors").read_bytes()
    again = run_export_cli("--checkpoint", tmp_path / "run", "--out", tmp_path / "hf")
    assert again.returncode == 2
    assert again.stderr.startswith("error:") and len(again.stderr.strip().splitlines()) == 1
    assert "another --out" in again.stderr
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == before


def test_export_cli_with_a_missing_checkpoint_fails_in_one_line(tmp_path):
    result = run_export_cli("--checkpoint", tmp_path / "nope.pt", "--out", tmp_path / "hf")
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "hf").exists()


def test_export_cli_with_a_checkpoint_whose_config_is_broken_fails_in_one_line(tmp_path):
    from checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "ckpt.pt", {"model": {}, "model_config": {"n_embd": 30, "n_head": 4}})
    result = run_export_cli("--checkpoint", tmp_path / "ckpt.pt", "--out", tmp_path / "hf")
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and len(result.stderr.strip().splitlines()) == 1
    assert "invalid model_config" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "hf").exists()


# ------------------------------------------------------------------------------------------ a complete export

GPT2_TOKENIZER = {"tokenizer": "gpt2", "chars": None}
PARAGRAPH = ("Hello, world!  Two spaces, a tab\tand a newline\n"
             "Ünïcödé: naïve café — 你好, 12345 and 3.14; it's 'quoted' \"text\"...\n\n<|endoftext|> stays text.")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A checkpoint (a tiny random model, GPT-2's tokenizer) and its export, made once."""
    import dataclasses

    from checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("export")
    torch.manual_seed(4)
    ours = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=50257)).eval()
    save_checkpoint(root / "run" / "ckpt.pt", {"model": ours.state_dict(), "model_config": dataclasses.asdict(ours.config),
                                               "tokenizer": GPT2_TOKENIZER})
    result = run_export_cli("--checkpoint", root / "run", "--out", root / "hf")
    assert result.returncode == 0, result.stderr
    return root


def test_exported_tokenizer_encodes_exactly_like_tiktoken_and_decodes_back(run_dir):
    import tiktoken
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run_dir / "hf")
    expected = tiktoken.get_encoding("gpt2").encode_ordinary(PARAGRAPH)
    assert tok(PARAGRAPH)["input_ids"] == expected
    assert tok.decode(expected) == PARAGRAPH
    assert tok.eos_token_id == 50256 and len(tok) == 50257


def test_exported_directory_generates_with_a_pipeline_and_reads_its_generation_config(run_dir):
    from transformers import GenerationConfig, pipeline

    gen = GenerationConfig.from_pretrained(run_dir / "hf")
    assert (gen.eos_token_id, gen.bos_token_id, gen.temperature, gen.top_k) == (50256, 50256, 0.8, 200)
    assert gen.max_length == 64 and gen.max_new_tokens is None  # the context, prompt included
    pipe = pipeline("text-generation", model=str(run_dir / "hf"), device="cpu")
    out = pipe("Hello", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    assert out.startswith("Hello") and len(out) > len("Hello")


def test_a_pipeline_with_transformers_defaults_generates_within_the_context(run_dir):
    """pipeline(...)(prompt) with no arguments: transformers does not crop the context as sample.py does, so
    a generation config asking for more tokens than n_positions (64) ran past GPT-2's position table."""
    import tiktoken
    from transformers import pipeline, set_seed

    set_seed(0)
    pipe = pipeline("text-generation", model=str(run_dir / "hf"), device="cpu")
    prompt = "ROMEO: " * 20  # 40 tokens of the 64
    for _ in range(2):  # sampled: the random model seldom ends on <|endoftext|>
        text = pipe(prompt)[0]["generated_text"]
        assert text.startswith(prompt)
        assert len(tiktoken.get_encoding("gpt2").encode(text, allowed_special="all")) <= 64 + 2  # a decode may re-merge


def test_greedy_text_from_the_export_equals_sample_py_at_temperature_zero(run_dir, capsys):
    from transformers import AutoTokenizer

    from inference import sample_cli
    from errors import run_cli

    with pytest.raises(SystemExit):
        run_cli(lambda: sample_cli.main(["--checkpoint", str(run_dir / "run"), "--prompt", "ROMEO:", "--temperature", "0",
                                     "--max-new-tokens", "20", "--no-stop-at-eot", "--dtype", "float32"]))
    ours = capsys.readouterr().out.rstrip("\n")
    tok = AutoTokenizer.from_pretrained(run_dir / "hf")
    hf = GPT2LMHeadModel.from_pretrained(run_dir / "hf").eval()
    ids = tok("ROMEO:", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = hf.generate(ids, do_sample=False, max_new_tokens=20, min_new_tokens=20, attention_mask=torch.ones_like(ids))
    assert tok.decode(out[0]) == ours


def test_a_padded_vocabulary_is_cut_to_the_tokenizer_on_export(tmp_path):
    """gpt2_124m.yaml pads the vocabulary to 50304: no exported logit column may lie outside the tokenizer,
    and the 50257 that remain are ours."""
    from safetensors import safe_open
    from transformers import AutoTokenizer

    torch.manual_seed(5)
    ours = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=50304)).eval()
    with torch.no_grad():
        ours.transformer.wte.weight[50257:] = ours.transformer.wte.weight[:1].abs() * 50  # padded ids would win
    export_hf(ours, GPT2_TOKENIZER, tmp_path / "hf")
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        assert f.get_slice("transformer.wte.weight").get_shape() == [len(tok), 32]
    ids = tok("Hi there", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert ours(ids)[0, -1].argmax() >= 50257  # the raw argmax is a padded id
        logits = hf(ids).logits
        assert logits.shape[-1] == len(tok) == hf.config.vocab_size == 50257
        torch.testing.assert_close(logits, ours(ids)[..., :50257], rtol=0, atol=1e-5)
        out = hf.generate(ids, do_sample=False, max_new_tokens=5, attention_mask=torch.ones_like(ids))
    assert out[0, ids.shape[1]:].max() < len(tok)


def test_exported_files_follow_the_umask_and_config_json_says_dtype(tmp_path):
    import json
    import os

    from transformers import AutoConfig

    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=50257))
    for umask in (0o022, 0o002):
        old = os.umask(umask)
        try:
            export_hf(model, GPT2_TOKENIZER, tmp_path / f"hf{umask:o}")
        finally:
            os.umask(old)
        modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / f"hf{umask:o}").iterdir()}
        assert modes["model.safetensors"] == 0o666 & ~umask, modes  # safetensors itself writes 0600
        assert set(modes.values()) == {0o666 & ~umask}, modes
    config = json.loads((tmp_path / "hf22" / "config.json").read_text())
    assert config["dtype"] == "float32"  # transformers 5 reads dtype, and drops torch_dtype when dtype is there
    assert AutoConfig.from_pretrained(tmp_path / "hf22").dtype == torch.float32


def test_the_model_card_gives_the_config_data_val_loss_bits_per_byte_and_training(tmp_path):
    import dataclasses
    import json

    from checkpoint import save_checkpoint
    from training.config.sections import Config, load_config

    cfg = Config()
    cfg.data.dataset, cfg.train.max_iters = "shakespeare", 30
    config = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=50304)
    save_checkpoint(tmp_path / "run" / "ckpt.pt", {
        "model": GPT(config).state_dict(), "model_config": dataclasses.asdict(config), "tokenizer": GPT2_TOKENIZER,
        "config": cfg.to_dict(), "train": {"iter": 30, "best_val_loss": 6.25, "tokens_seen": 1920, "elapsed_s": 12.5,
                                           "run_id": "abcd1234"}, "plan": {"dtype": "float32", "notes": {}}})
    records = [{"iter": 10, "train/loss": 7.0}, {"iter": 20, "val/loss": 6.25, "val/bpb": 2.5},
               {"iter": 30, "val/loss": 6.3125, "val/bpb": 2.625, "eval/train_loss": 6.0}]
    (tmp_path / "run" / "metrics.jsonl").write_bytes(b"\xff not json\n" + "".join(json.dumps(r) + "\n" for r in records).encode())
    result = run_export_cli("--checkpoint", tmp_path / "run", "--out", tmp_path / "hf")
    assert result.returncode == 0, result.stderr
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "val loss **6.3125** nats/token, **2.6250** bits/byte" in card  # the eval at the checkpoint's step
    assert "Best val loss of the run so far: 6.2500" in card
    assert "| `dataset` | shakespeare |" in card and "| `tokenizer` | gpt2 |" in card
    assert "| `n_embd` | 32 |" in card and "| `steps` | 30 |" in card and "| `tokens seen` | 1920 |" in card
    assert "padded to 50304 rows for GPU speed, is cut here to the tokenizer's 50257" in card
    assert 'pipeline("text-generation", model="hf")' in card
    # the card's config block is the run's resolved config, which train.py reads back as it is
    (tmp_path / "run.yaml").write_text(card.split("```yaml\n")[1].split("```")[0])
    again = load_config(["--config", str(tmp_path / "run.yaml")])
    assert again.to_dict() == cfg.to_dict()


def test_the_model_card_of_a_checkpoint_without_metrics_says_not_recorded(tmp_path):
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=50257))
    export_hf(model, GPT2_TOKENIZER, tmp_path / "hf", {"train": {"iter": 7}}, tmp_path / "ckpt.pt")
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "Val loss and bits/byte at this step: not recorded" in card and "at step 7" in card


def _checkpoint(path, config: GPTConfig, tokenizer: dict):
    import dataclasses

    from checkpoint import save_checkpoint

    save_checkpoint(path, {"model": GPT(config).state_dict(), "model_config": dataclasses.asdict(config),
                           "tokenizer": tokenizer})
    return path


def _one_line(result, *words):
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_a_char_level_or_non_gpt2_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    import subprocess

    from checkpoint.export import main as export_main
    from errors import run_cli

    small = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=50257)
    char = _checkpoint(tmp_path / "char.pt", GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=66),
                       {"tokenizer": "char", "chars": "abc"})
    _one_line(run_export_cli("--checkpoint", char, "--out", tmp_path / "a"), "character-level")  # a real process
    cl100k = _checkpoint(tmp_path / "cl.pt", small, {"tokenizer": "cl100k_base", "chars": None})
    with pytest.raises(SystemExit) as e:  # the same CLI in this process
        run_cli(lambda: export_main(["--checkpoint", str(cl100k), "--out", str(tmp_path / "b")]))
    _one_line(subprocess.CompletedProcess([], e.value.code, "", capsys.readouterr().err), "'cl100k_base'")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_write_errors_are_one_line_and_leave_nothing_behind(tmp_path, monkeypatch):
    import errno

    from errors import UserError

    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=50257))
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        export_hf(model, GPT2_TOKENIZER, tmp_path / "file")
    with pytest.raises(UserError, match="cannot create"):
        export_hf(model, GPT2_TOKENIZER, tmp_path / "file" / "hf")  # under a file

    import checkpoint.hf as hf_module

    real = hf_module.save_file  # model.safetensors goes through it

    def full_disk(*a, **k):
        real(*a, **k)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hf_module, "save_file", full_disk)
    with pytest.raises(UserError, match=r"cannot write the export to .*No space left on device.*nothing was left behind"):
        export_hf(model, GPT2_TOKENIZER, tmp_path / "out" / "hf")
    # no partial export, no temp directory, and not the folder made for it (fileio.no_empty_dirs_left)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing_behind(tmp_path, monkeypatch):
    """safetensors reports a full disk as its own SafetensorError, not an OSError."""
    from safetensors import SafetensorError

    import checkpoint.hf as hf_module
    from errors import UserError

    def full_disk(*a, **k):
        raise SafetensorError("Error while serializing: IoError(No space left on device (os error 28))")

    monkeypatch.setattr(hf_module, "save_file", full_disk)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=50257))
    with pytest.raises(UserError, match="No space left on device") as e:
        export_hf(model, GPT2_TOKENIZER, tmp_path / "hf")
    assert "\n" not in str(e.value) and not (tmp_path / "hf").exists() and not list(tmp_path.glob(".*.tmp"))


def _json_values():
    from hypothesis import strategies as st
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                        st.text(max_size=12))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                        max_size=3), max_leaves=6)


def test_every_config_json_value_either_loads_or_is_one_line_naming_the_directory(hf_dir, tmp_path_factory):
    """The whole class of config.json fields this GPT reads or refuses (the features it cannot express, the
    sizes, the whole document not being an object), any JSON value in each, through load_model, the edge
    every script loads by: the model, or a one-line UserError naming the directory; never another error.
    What loads equals the oracle's expectation: only GPT-2's own values load (the weights are the tiny model's)."""
    import json
    import shutil

    from hypothesis import HealthCheck, given, settings, strategies as st

    from checkpoint.load import load_model
    from errors import UserError

    base = json.loads((hf_dir / "config.json").read_text())
    fields = ["activation_function", "n_inner", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
              "scale_attn_weights", "n_embd", "n_layer", "n_head", "n_positions", "vocab_size", "layer_norm_epsilon",
              "tie_word_embeddings"]
    work = tmp_path_factory.mktemp("hfprop") / "hf"
    shutil.copytree(hf_dir, work)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(st.dictionaries(st.sampled_from(fields), _json_values(), min_size=1, max_size=3),
                     _json_values().filter(lambda v: not isinstance(v, dict))))
    def check(change):
        doc = {**base, **change} if isinstance(change, dict) else change
        (work / "config.json").write_text(json.dumps(doc))
        try:
            loaded = load_model(str(work))
        except UserError as e:
            assert "\n" not in str(e) and str(work) in str(e) and "config.json" in str(e), str(e)
            return
        # loaded: every changed field must hold a value GPT-2's loader takes for these weights
        assert isinstance(change, dict)
        cfg = loaded.model.config
        assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size) == (2, 4, 64, 50257)

    check()
