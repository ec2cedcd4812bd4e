"""The `data:` section of the training config."""
from __future__ import annotations

from dataclasses import dataclass

from errors import UserError
from settings import setting

from .tokenizer import check_tokenizer_name

SHAKESPEARE = "shakespeare"
HF_PREFIX = "hf:"


@dataclass
class DataConfig:
    dataset: str = setting(SHAKESPEARE, '"shakespeare" | a local path (.txt file, directory of .txt files, or glob) | '
                                        '"hf:<name>"')
    tokenizer: str = setting("gpt2", '"char", or any tiktoken encoding name ("gpt2", "cl100k_base", ...)')
    val_fraction: float = setting(0.1, "the last val_fraction of the token stream becomes the val split")
    root: str = setting("data/prepared", "prepared dirs go under here, one per (source, tokenizer)", resume=True)
    local_path: str = setting("", "a local copy of tiny shakespeare; the env var SMALLGPT_SHAKESPEARE works too",
                              resume=True)
    hf_subset: str = setting("", "HF datasets: the config (subset) name, if the dataset has several")
    hf_split: str = setting("train", "HF datasets: the split to read")
    text_field: str = setting("text", "HF datasets: the column holding the text")
    streaming: bool = setting(False, "HF datasets: stream the rows instead of downloading the dataset first",
                              resume=True)
    num_proc: int = setting(0, "tokenizer threads; 0 = one per available core", resume=True)

    def validate(self) -> None:
        """Raise UserError naming the first bad value and how to fix it."""
        for name in ("dataset", "tokenizer", "root", "local_path", "hf_subset", "hf_split", "text_field"):
            if not isinstance(getattr(self, name), str):
                raise UserError(f"data.{name} must be a string, got {getattr(self, name)!r}; quote it in the config")
        if not self.dataset.strip():
            raise UserError("data.dataset is empty; set it to 'shakespeare', a local .txt file/dir/glob, or 'hf:<name>'")
        if self.dataset.startswith(HF_PREFIX):
            if not self.dataset[len(HF_PREFIX):].strip():
                raise UserError(f"data.dataset {self.dataset!r} names no HF dataset; write it as 'hf:<name>', e.g. 'hf:roneneldan/TinyStories'")
            if not self.hf_split:
                raise UserError("data.hf_split is empty; set it to a split of the HF dataset, e.g. 'train'")
            if not self.text_field:
                raise UserError("data.text_field is empty; set it to the dataset column that holds the text, e.g. 'text'")
        check_tokenizer_name(self.tokenizer)
        if isinstance(self.val_fraction, bool) or not isinstance(self.val_fraction, (int, float)) or not 0 < self.val_fraction < 1:
            raise UserError(f"data.val_fraction must be a number strictly between 0 and 1, got {self.val_fraction!r}; e.g. 0.1")
        if not self.root:
            raise UserError("data.root is empty; set it to the directory that holds prepared data, e.g. 'data/prepared'")
        if not isinstance(self.streaming, bool):
            raise UserError(f"data.streaming must be a boolean, got {self.streaming!r}; write true or false")
        if isinstance(self.num_proc, bool) or not isinstance(self.num_proc, int) or self.num_proc < 0:
            raise UserError(f"data.num_proc must be a whole number >= 0, got {self.num_proc!r}; use 0 for one thread per core")
