"""The `data:` section of the training config."""
from __future__ import annotations

from dataclasses import dataclass

from errors import UserError
from settings import Freezable, check_path_fields, setting

from .tokenizer import check_tokenizer_name

SHAKESPEARE = "shakespeare"
HF_PREFIX = "hf:"
TEXT, CHAT = "text", "chat"  # data.format
FORMATS = (TEXT, CHAT)
MAX_PROCS = 1024  # tokenizer processes: each is started, so 10**30 of them would never finish starting


@dataclass
class DataConfig(Freezable):
    dataset: str = setting(SHAKESPEARE, '"shakespeare" | a local path: a file, folder or glob of .txt, .jsonl/.json, '
                                        '.parquet (plain, .gz or .zst), or a folder written by datasets\' save_to_disk '
                                        '| "hf:<name>"', path=True)
    tokenizer: str = setting("gpt2", '"char", any tiktoken encoding name ("gpt2", "cl100k_base", ...), or '
                                     '"bpe:<vocab_size>"')
    val_fraction: float = setting(0.1, "the share of documents (chosen by a hash of each) that becomes the val split; "
                                       "of a single text file, its tail")
    val_dataset: str = setting("", "a separate val source (same forms as dataset); then all of dataset is train",
                               path=True)
    root: str = setting("data/prepared", "prepared dirs go under here, one per (source, tokenizer)", resume=True,
                        path=True)
    local_path: str = setting("", "a local copy of tiny shakespeare; the env var SMALLGPT_SHAKESPEARE works too",
                              resume=True, path=True)
    hf_subset: str = setting("", "HF datasets: the config (subset) name, if the dataset has several")
    hf_split: str = setting("train", "HF datasets: the split to read")
    text_field: str = setting("text", "jsonl, parquet and HF datasets: the field holding the text")
    format: str = setting(TEXT, '"text": a document per file or row | "chat": a conversation per row of a jsonl, '
                                'parquet or HF source, {"messages": [{"role", "content"}, ...]} (fine-tuning)',
                          before=TEXT)
    messages_field: str = setting("messages", "data.format: chat: the field holding a row's list of messages",
                                  before="messages")
    skip_bad_rows: bool = setting(False, "skip (and count) bad rows (no text in text_field; a broken conversation) "
                                         "instead of stopping")
    streaming: bool = setting(False, "HF datasets: stream the rows instead of downloading the dataset first",
                              resume=True)
    num_proc: int = setting(0, "tokenizer processes; 0 = one per available core", resume=True)
    shard_tokens: int = setting(100_000_000, "tokens per shard file (the last one of a split is shorter)", resume=True)
    tokenizer_sample_mb: int = setting(200, "bpe:<n>: MB of the corpus (whole documents, chosen by hash) to train it on")

    def validate(self) -> None:
        """Raise UserError naming the first bad value and how to fix it."""
        for name in ("dataset", "tokenizer", "root", "local_path", "hf_subset", "hf_split", "text_field", "val_dataset",
                     "format", "messages_field"):
            if not isinstance(getattr(self, name), str):
                raise UserError(f"data.{name} must be a string, got {getattr(self, name)!r}; quote it in the config")
        check_path_fields(self, "data")  # NUL, a name over 255 bytes, not UTF-8: one line (fileio.path_problem)
        if self.val_dataset and self.val_dataset.strip() == self.dataset.strip():
            raise UserError("data.val_dataset names the same source as data.dataset; name a separate val source, "
                            "or leave val_dataset empty to hold out val_fraction of the documents")
        if not self.dataset.strip():
            raise UserError("data.dataset is empty; set it to 'shakespeare', a local .txt file/dir/glob, or 'hf:<name>'")
        if self.dataset.startswith(HF_PREFIX):
            if not self.dataset[len(HF_PREFIX):].strip():
                raise UserError(f"data.dataset {self.dataset!r} names no HF dataset; write it as 'hf:<name>', e.g. 'hf:roneneldan/TinyStories'")
            if not self.hf_split:
                raise UserError("data.hf_split is empty; set it to a split of the HF dataset, e.g. 'train'")
            if not self.text_field:
                raise UserError("data.text_field is empty; set it to the dataset column that holds the text, e.g. 'text'")
        if self.format not in FORMATS:
            raise UserError(f"data.format must be one of {', '.join(FORMATS)}, got {self.format[:40]!r}; "
                            f"'chat' reads conversations, 'text' documents")
        if self.format == CHAT and not self.messages_field:
            raise UserError("data.messages_field is empty; set it to the field holding the messages, e.g. 'messages'")
        check_tokenizer_name(self.tokenizer)
        if isinstance(self.val_fraction, bool) or not isinstance(self.val_fraction, (int, float)) or not 0 < self.val_fraction < 1:
            raise UserError(f"data.val_fraction must be a number strictly between 0 and 1, got {self.val_fraction!r}; e.g. 0.1")
        if not self.root:
            raise UserError("data.root is empty; set it to the directory that holds prepared data, e.g. 'data/prepared'")
        for name in ("streaming", "skip_bad_rows"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"data.{name} must be a boolean, got {getattr(self, name)!r}; write true or false")
        for name, low, high in (("shard_tokens", 1, 1 << 40), ("tokenizer_sample_mb", 1, 1 << 20)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise UserError(f"data.{name} must be a whole number from {low} to {high}, got {value!r}; "
                                f"leave it out for the default {getattr(DataConfig, name)}")
        if isinstance(self.num_proc, bool) or not isinstance(self.num_proc, int) or not 0 <= self.num_proc <= MAX_PROCS:
            raise UserError(f"data.num_proc must be a whole number from 0 to {MAX_PROCS}, got {self.num_proc!r}; use 0 "
                            "for one process per core")
