"""Data pipeline: text sources -> tokens on disk (prepare) -> random-window batches (BatchLoader).

    from data import DataConfig, prepare_data, load_meta, get_tokenizer, tokenizer_from_meta, BatchLoader
"""
from .build import prepare_data
from .config import DataConfig
from .holds import hold_data
from .manifest import load_meta
from .tokenizer import Tokenizer, get_tokenizer, tokenizer_entry, tokenizer_from_meta

__all__ = ["BatchLoader", "DataConfig", "Tokenizer", "get_tokenizer", "hold_data", "load_meta", "prepare_data",
           "tokenizer_entry", "tokenizer_from_meta"]


def __getattr__(name: str):
    # BatchLoader needs torch, which takes ~2 s to import; `python -m data.prepare` never does.
    if name == "BatchLoader":
        from .loader import BatchLoader

        return BatchLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
