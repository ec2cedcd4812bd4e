"""Tokenizers: round trips, the char vocabulary and eot, rebuilding from metadata."""
from __future__ import annotations

import pytest
import tiktoken

from data import DataConfig, get_tokenizer, tokenizer_from_meta
from errors import UserError

TEXTS = [
    "Hello, world!",
    "naïve café, Straße, Ελληνικά, русский, 日本語のテキスト",
    "emoji 🎉🚀 and a family 👩‍👩‍👧 with skin tone 👍🏽",
    "tabs\tand\r\nwindows newlines\n\n\nand   spaces  ",
    "a literal <|endoftext|> inside a document",
    "",
]


@pytest.fixture(scope="module")
def gpt2():
    return tiktoken.get_encoding("gpt2")


@pytest.mark.parametrize("text", TEXTS)
def test_gpt2_encodes_like_tiktoken_and_decodes_back(text, gpt2):
    tok = get_tokenizer("gpt2")
    ids = tok.encode(text)
    assert ids == gpt2.encode_ordinary(text)
    assert tok.decode(ids) == text


def test_gpt2_array_encoding_of_a_batch_equals_tiktoken_encode_ordinary(gpt2):
    """prepare's path (tiktoken's numpy buffer in one process, its threaded batch with several threads):
    special-token text stays ordinary text, and a lone surrogate (valid JSON: "\\ud800") gets tiktoken's
    own repair instead of an error."""
    tok = get_tokenizer("gpt2")
    texts = TEXTS + ["a lone surrogate \ud800 in the middle"]
    for threads in (1, 2):
        arrays = tok.encode_arrays(texts, num_threads=threads)
        assert [a.tolist() for a in arrays] == [gpt2.encode_ordinary(t) for t in texts]


def test_gpt2_reports_tiktoken_vocab_and_endoftext_as_eot(gpt2):
    tok = get_tokenizer("gpt2")
    assert (tok.name, tok.vocab_size, tok.eot) == ("gpt2", 50257, 50256)
    assert gpt2.decode([tok.eot]) == "<|endoftext|>"
    assert tok.chars is None


def test_literal_endoftext_text_is_not_the_eot_token():
    tok = get_tokenizer("gpt2")
    assert tok.eot not in tok.encode("<|endoftext|>")


@pytest.mark.parametrize("text", [t for t in TEXTS if t])
def test_char_encodes_by_sorted_vocab_position_and_decodes_back(text):
    chars = "".join(sorted(set(text)))
    tok = get_tokenizer("char", chars)
    ids = tok.encode(text)
    assert ids == [chars.index(c) for c in text]
    assert tok.decode(ids) == text


def test_char_vocab_reserves_the_id_after_the_characters_for_eot():
    tok = get_tokenizer("char", "\nab")
    assert (tok.name, tok.eot, tok.vocab_size, tok.chars) == ("char", 3, 4, "\nab")
    assert tok.decode([1, 3, 2]) == "a<|endoftext|>b"


def test_char_encode_of_characters_outside_the_vocab_names_them():
    tok = get_tokenizer("char", " abc")
    with pytest.raises(UserError) as e:
        tok.encode("a café 🎉")
    msg = str(e.value)
    assert "'é'" in msg and "'🎉'" in msg and "\n" not in msg


def test_char_tokenizer_needs_a_sorted_unique_vocab():
    with pytest.raises(UserError, match="vocabulary"):
        get_tokenizer("char")
    with pytest.raises(UserError, match="sorted"):
        get_tokenizer("char", "ba")
    with pytest.raises(UserError, match="sorted"):
        get_tokenizer("char", "aab")


def test_tokenizer_from_meta_accepts_the_checkpoint_subset():
    char = tokenizer_from_meta({"tokenizer": "char", "chars": " ab"})
    assert char.decode(char.encode("a b")) == "a b" and char.vocab_size == 4
    gpt2 = tokenizer_from_meta({"tokenizer": "gpt2", "chars": None})
    assert gpt2.vocab_size == 50257


def test_tokenizer_from_meta_refuses_a_vocab_size_it_cannot_reproduce():
    with pytest.raises(UserError, match="vocab_size"):
        tokenizer_from_meta({"tokenizer": "gpt2", "chars": None, "vocab_size": 50304})
    with pytest.raises(UserError, match="tokenizer"):
        tokenizer_from_meta({"chars": None})


def test_unknown_tokenizer_name_lists_the_valid_ones():
    for raise_it in (lambda: get_tokenizer("gpt5"), lambda: DataConfig(tokenizer="gpt5").validate()):
        with pytest.raises(UserError) as e:
            raise_it()
        msg = str(e.value)
        assert "'gpt5'" in msg and "char" in msg and "gpt2" in msg and "\n" not in msg


# --- a BPE trained on the corpus (bpe:<n>) -----------------------------------------------------------

import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from data import load_meta, prepare_data, tokenizer_entry  # noqa: E402
from prepared_files import read_bins, split_on  # noqa: E402

WORDS = ("мама мыла раму и папа читал книгу о том как живут люди в большом городе где много домов улиц и "
         "машин дети играли во дворе а бабушка пекла пироги с капустой и яблоками на кухне было тепло").split()


def russian_docs(n: int = 150, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))).capitalize() + "." for _ in range(n)]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("bpe")
    lines = [json.dumps({"text": d}, ensure_ascii=False) for d in russian_docs()]
    (root / "ru.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return prepare_data(DataConfig(dataset=str(root / "ru.jsonl"), tokenizer="bpe:600", root=str(root / "p"),
                                   val_fraction=0.2), progress=False)


def test_a_trained_bpe_round_trips_non_english_text_and_its_tokens_are_in_the_bins(bpe_dir):
    meta = load_meta(bpe_dir)
    tok = tokenizer_from_meta(meta)
    # at most 600: a small corpus runs out of pairs worth merging first
    assert tok.name == "bpe:600" and 300 < tok.vocab_size == meta["vocab_size"] <= 600
    for text in russian_docs(20, seed=1) + TEXTS:  # unseen text, other scripts, emoji, <|endoftext|> as text
        assert tok.decode(tok.encode(text)) == text
    assert tok.eot not in tok.encode("<|endoftext|>")
    train, val = (split_on(ids, tok.eot) for ids in read_bins(bpe_dir))
    assert sorted(train + val) == sorted(tok.encode(d) for d in russian_docs())


def test_a_trained_bpe_spends_fewer_tokens_per_byte_than_gpt2(bpe_dir, gpt2):
    tok = tokenizer_from_meta(load_meta(bpe_dir))
    text = "\n".join(russian_docs(50, seed=2))
    ours, theirs = len(tok.encode(text)), len(gpt2.encode_ordinary(text))
    assert ours < 0.5 * theirs, (ours, theirs)


def test_training_the_bpe_is_deterministic_across_processes(bpe_dir, tmp_path):
    src = bpe_dir.parent.parent / "ru.jsonl"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from data import DataConfig, prepare_data; "
            "print(prepare_data(DataConfig(dataset=sys.argv[2], tokenizer='bpe:600', root=sys.argv[3], val_fraction=0.2), progress=False))")
    r = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parents[1]), str(src), str(tmp_path)],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": "123"})
    other = Path(r.stdout.strip())
    assert r.returncode == 0, r.stderr
    name = load_meta(bpe_dir)["tokenizer_file"]
    assert (other / name).read_bytes() == (bpe_dir / name).read_bytes()
    assert read_bins(other) == read_bins(bpe_dir)


def test_the_checkpoint_entry_of_a_trained_bpe_rebuilds_it(bpe_dir):
    meta = load_meta(bpe_dir)
    entry = tokenizer_entry(meta)
    assert set(entry) == {"tokenizer", "chars", "bpe"} and all(isinstance(v, (str, type(None))) for v in entry.values())
    text = russian_docs(3, seed=5)[0]
    assert tokenizer_from_meta(entry).encode(text) == tokenizer_from_meta(meta).encode(text)
    with pytest.raises(UserError, match="bpe:600.*data.prepare"):
        tokenizer_from_meta({"tokenizer": "bpe:600", "chars": None})


@pytest.mark.parametrize("name", ["bpe:", "bpe:12", "bpe:x", "bpe:99999999"])
def test_a_bad_bpe_vocab_size_is_one_line(name):
    with pytest.raises(UserError, match="vocab size from 512"):
        DataConfig(tokenizer=name).validate()


def test_the_export_of_a_trained_bpe_loads_in_transformers_and_encodes_like_ours(bpe_dir, tmp_path):
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from model import GPT, GPTConfig
    from checkpoint.export import export_hf

    meta = load_meta(bpe_dir)
    tok = tokenizer_from_meta(meta)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=meta["vocab_size"])).eval()
    export_hf(model, tokenizer_entry(meta), tmp_path / "hf")
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in russian_docs(5, seed=3) + TEXTS:
        assert hf_tok(text)["input_ids"] == tok.encode(text)
        assert hf_tok.decode(tok.encode(text)) == text
    assert hf_tok.eos_token_id == tok.eot and len(hf_tok) == tok.vocab_size
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([tok.encode("мама мыла")])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids)[0] if isinstance(model(ids), tuple) else model(ids))


def test_a_run_on_a_trained_bpe_keeps_it_in_the_checkpoint_and_sample_py_speaks_it(bpe_dir, tmp_path, capsys):
    from inference import sample_cli
    from training import loop
    from errors import run_cli
    from checkpoint import load_checkpoint
    from training.config.sections import load_config

    out = tmp_path / "out"
    loop.train(load_config([
        f"--data.dataset={bpe_dir.parent.parent / 'ru.jsonl'}", "--data.tokenizer=bpe:600", "--data.val_fraction=0.2",
        f"--data.root={bpe_dir.parent}", f"--train.out_dir={out}", "--model.n_layer=1", "--model.n_head=2",
        "--model.n_embd=16", "--model.block_size=16", "--train.batch_size=2", "--train.max_iters=2",
        "--train.eval_interval=2", "--train.eval_iters=1", "--train.dtype=float32", "--train.device=cpu",
        "--train.peak_flops=1e11", "--wandb.mode=disabled"]))
    assert load_checkpoint(out)["tokenizer"] == tokenizer_entry(load_meta(bpe_dir))
    assert not list((bpe_dir / ".readers").glob("*.json"))  # the run let go of its data
    capsys.readouterr()
    with pytest.raises(SystemExit):
        run_cli(lambda: sample_cli.main(["--checkpoint", str(out), "--prompt", "мама мыла", "--max-new-tokens", "8",
                                     "--seed", "1", "--dtype", "float32"]))
    text = capsys.readouterr().out
    assert text.startswith("мама мыла") and len(text) > len("мама мыла")
