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
