"""Tokenizers: tiktoken encodings (gpt2 by default), a character-level vocabulary, and a byte-level BPE
trained on the corpus (`bpe:<vocab_size>`, with HF `tokenizers`).

All expose the same surface: `name`, `vocab_size`, `eot`, `chars`, `encode(str) -> list[int]`,
`decode(list[int]) -> str`. Documents are separated by the `eot` id in the prepared token stream;
`encode` never emits it, so the text "<|endoftext|>" inside a document is tokenized as plain text.
"""
from __future__ import annotations

from functools import cached_property
from typing import Sequence

import numpy as np
import tiktoken

from errors import UserError

CHAR = "char"
BPE_PREFIX = "bpe:"
BPE_MIN, BPE_MAX = 512, 1 << 20  # 256 byte tokens + eot + room for merges; a vocabulary no model needs
EOT_TEXT = "<|endoftext|>"


class Tokenizer:
    name: str
    vocab_size: int
    eot: int
    chars: str | None = None  # the char vocabulary, None for tiktoken encodings
    bpe: str | None = None  # a trained BPE's tokenizer.json (HF tokenizers' format), None for the others

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def encode_arrays(self, texts: list[str], num_threads: int = 1) -> list[np.ndarray]:
        """Encode many texts at once into integer arrays (the fast path used by prepare)."""
        raise NotImplementedError

    def token_byte_lengths(self) -> np.ndarray:
        """UTF-8 byte length of every token id (0 for eot), so a split's byte count is a table lookup."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


def bpe_vocab_size(name: str) -> int | None:
    """The vocab size of a 'bpe:<n>' name, None for other names; UserError for a bad n."""
    if not isinstance(name, str) or not name.startswith(BPE_PREFIX):
        return None
    n = name[len(BPE_PREFIX):]
    if not (n.isascii() and n.isdigit()) or len(n) > 12 or not BPE_MIN <= int(n) <= BPE_MAX:  # ("²", 5000 digits)
        raise UserError(f"data.tokenizer {name!r:.40} needs a vocab size from {BPE_MIN} to {BPE_MAX} after 'bpe:'; "
                        f"e.g. 'bpe:32768'")
    return int(n)


def check_tokenizer_name(name: str) -> None:
    if bpe_vocab_size(name) is not None:
        return
    if name != CHAR and name not in tiktoken.list_encoding_names():
        raise UserError(
            f"unknown tokenizer {name!r}; set data.tokenizer to 'char', 'bpe:<vocab_size>' or one of: "
            f"{', '.join(tiktoken.list_encoding_names())}"
        )


class TiktokenTokenizer(Tokenizer):
    def __init__(self, name: str):
        check_tokenizer_name(name)
        try:
            self._enc = tiktoken.get_encoding(name)
        except Exception as e:  # tiktoken fetches its BPE files over the network the first time
            raise UserError(
                f"could not load the tiktoken encoding {name!r} ({type(e).__name__}); connect to the network once, "
                f"or set TIKTOKEN_CACHE_DIR to a directory holding its files"
            ) from None
        self.name = name
        self.vocab_size = self._enc.n_vocab
        self.eot = self._enc.eot_token

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))

    def encode_arrays(self, texts: list[str], num_threads: int = 1) -> list[np.ndarray]:
        if num_threads > 1 or not hasattr(self._enc, "encode_to_numpy"):  # tiktoken < 0.8 has no numpy path
            # tiktoken releases the GIL while encoding, so threads scale without pickling text to processes
            return [np.array(ids, dtype=np.int64) for ids in self._enc.encode_ordinary_batch(texts, num_threads=num_threads)]
        # one process: the ids go from tiktoken's buffer straight into an array, never through a list of
        # Python ints (~36 bytes a token): 10-30% faster and ~9 MB less per MB of text. No special tokens
        # allowed and none refused: "<|endoftext|>" in the text is ordinary text, as in encode_ordinary.
        out = []
        for text in texts:
            try:
                out.append(self._enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=()))
            except UnicodeEncodeError:  # a lone surrogate: encode_ordinary's own repair
                out.append(np.array(self._enc.encode_ordinary(text), dtype=np.int64))
        return out

    @cached_property
    def _byte_lengths(self) -> np.ndarray:
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        specials = {self._enc.encode_single_token(s) for s in self._enc.special_tokens_set}
        for i in range(self.vocab_size):
            if i in specials:
                continue
            try:
                lengths[i] = len(self._enc.decode_single_token_bytes(i))
            except KeyError:  # some encodings leave unused ids below n_vocab
                pass
        return lengths

    def token_byte_lengths(self) -> np.ndarray:
        return self._byte_lengths


class CharTokenizer(Tokenizer):
    """One id per character of `chars` (sorted, unique), plus one extra id for eot: `len(chars)`.

    Reserving an id keeps documents separated exactly as with gpt2, without guessing a separator
    character; a single-document source such as shakespeare simply never uses it.
    """

    def __init__(self, chars: str):
        if not isinstance(chars, str) or not chars:
            raise UserError("the char tokenizer needs its vocabulary; build it with prepare, or load it from meta.json")
        if "".join(sorted(set(chars))) != chars:
            raise UserError("the char vocabulary is not a sorted string of unique characters; re-run prepare to rebuild it")
        self.name = CHAR
        self.chars = chars
        self.eot = len(chars)
        self.vocab_size = len(chars) + 1
        # Sorted code points let numpy map a whole text to ids with one searchsorted.
        self._codepoints = np.array([ord(c) for c in chars], dtype=np.uint32)

    def _to_ids(self, text: str) -> np.ndarray:
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = np.searchsorted(self._codepoints, cps)
        known = ids < len(self.chars)
        known[known] = self._codepoints[ids[known]] == cps[known]
        if not known.all():
            unknown = sorted({chr(c) for c in cps[~known]})
            shown = ", ".join(repr(c) for c in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
            # a shell keeps "\n" inside quotes as two characters: say how to type a newline
            typed = " (a \\n typed in quotes stays a backslash and an n: write $'...\\n...' in bash for a newline)" \
                if "\\n" in text and "\\" in unknown else ""
            raise UserError(
                f"{len(unknown)} character(s) not in the char vocabulary: {shown}; remove them from the text, "
                f"or prepare data that contains them (or use the gpt2 tokenizer){typed}"
            )
        return ids.astype(np.int64)

    def encode(self, text: str) -> list[int]:
        return self._to_ids(text).tolist()

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(EOT_TEXT if i == self.eot else self.chars[i] for i in ids)

    def encode_arrays(self, texts: list[str], num_threads: int = 1) -> list[np.ndarray]:
        return [self._to_ids(t) for t in texts]

    def token_byte_lengths(self) -> np.ndarray:
        return np.array([len(c.encode("utf-8")) for c in self.chars] + [0], dtype=np.int64)


class BpeTokenizer(Tokenizer):
    """A byte-level BPE trained on the corpus by HF `tokenizers` (train_bpe), from its tokenizer.json.

    GPT-2's scheme: text is split by GPT-2's pre-tokenizer regex, each piece's UTF-8 bytes are merged by
    the learned merges, so every text round-trips. eot is the one special token, "<|endoftext|>"; like the
    others, `encode` treats that text in a document as plain text.
    """

    def __init__(self, name: str, json_text: str):
        import tokenizers  # only bpe: tokenizers need it

        try:
            self._tok = tokenizers.Tokenizer.from_str(json_text)
        except Exception as e:  # tokenizers raises its own exception type for a bad file
            raise UserError(f"the {name} tokenizer's tokenizer.json does not load ({str(e)[:120]}); re-run "
                            f"`python -m data.prepare` to train it again") from None
        self._tok.encode_special_tokens = True  # "<|endoftext|>" typed in a text is text, not eot
        eot = self._tok.token_to_id(EOT_TEXT)
        if eot is None:
            raise UserError(f"the {name} tokenizer has no {EOT_TEXT} token; re-run `python -m data.prepare` to train it again")
        self.name, self.bpe, self.eot = name, json_text, eot
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def encode_arrays(self, texts: list[str], num_threads: int = 1) -> list[np.ndarray]:
        return [np.array(e.ids, dtype=np.int64) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    @cached_property
    def _byte_lengths(self) -> np.ndarray:
        # byte-level tokens spell each byte as one character (GPT-2's byte-to-unicode table)
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for token, i in self._tok.get_vocab(with_added_tokens=False).items():
            lengths[i] = len(token)
        lengths[self.eot] = 0
        return lengths

    def token_byte_lengths(self) -> np.ndarray:
        return self._byte_lengths


def train_bpe(texts, vocab_size: int) -> str:
    """Train a byte-level BPE of `vocab_size` ids (eot included, id 0) on the texts; its tokenizer.json."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2's regex
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT_TEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok.to_str()


def get_tokenizer(name: str, chars: str | None = None, bpe: str | None = None) -> Tokenizer:
    """A tokenizer by name; "char" needs its vocabulary (`chars`, saved in meta.json by prepare), "bpe:<n>"
    its tokenizer.json (`bpe`, saved in the prepared dir and in checkpoints)."""
    if name == CHAR:
        return CharTokenizer(chars)
    if bpe_vocab_size(name) is not None:
        if not isinstance(bpe, str):
            raise UserError(f"the {name} tokenizer is trained on a corpus and this metadata lacks it; prepare the data "
                            f"with `python -m data.prepare --tokenizer {name}` (or use a checkpoint that stores it)")
        return BpeTokenizer(name, bpe)
    return TiktokenTokenizer(name)


def tokenizer_entry(meta: dict) -> dict:
    """What a checkpoint keeps of a prepared dir's tokenizer: {"tokenizer", "chars"} (+ "bpe", a trained BPE's
    tokenizer.json); tokenizer_from_meta rebuilds the tokenizer from it."""
    entry = {"tokenizer": meta["tokenizer"], "chars": meta["chars"]}
    if meta.get("bpe") is not None:
        entry["bpe"] = meta["bpe"]
    return entry


def tokenizer_from_meta(meta: dict) -> Tokenizer:
    """Rebuild the tokenizer from meta.json, or from the {"tokenizer", "chars"} subset a checkpoint keeps."""
    if not isinstance(meta, dict) or not isinstance(meta.get("tokenizer"), str):
        raise UserError("no tokenizer name in the metadata; re-run prepare (or use a checkpoint that stores 'tokenizer')")
    tok = get_tokenizer(meta["tokenizer"], meta.get("chars"), meta.get("bpe"))
    if "vocab_size" in meta and meta["vocab_size"] != tok.vocab_size:
        raise UserError(
            f"metadata says vocab_size {meta['vocab_size']} but tokenizer {tok.name!r} has {tok.vocab_size}; "
            f"re-run prepare with this tiktoken version"
        )
    return tok
