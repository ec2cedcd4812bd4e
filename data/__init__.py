"""Data pipeline: text sources -> tokens on disk (prepare) -> random-window batches (BatchLoader).

    from data import DataConfig, prepare_data, load_meta, get_tokenizer, tokenizer_from_meta, BatchLoader
"""
from lazy import exports_on_first_use

_EXPORTS = {  # each name and the module it lives in: imported on first use (lazy.py)
    "prepare_data": "build", "DataConfig": "config", "hold_data": "holds", "load_meta": "manifest",
    "Tokenizer": "tokenizer", "get_tokenizer": "tokenizer", "tokenizer_entry": "tokenizer",
    "tokenizer_from_meta": "tokenizer", "BatchLoader": "loader",
}

__all__ = ["BatchLoader", "DataConfig", "Tokenizer", "get_tokenizer", "hold_data", "load_meta", "prepare_data",
           "tokenizer_entry", "tokenizer_from_meta"]


__getattr__ = exports_on_first_use(__name__, _EXPORTS)  # (lazy.py: why)
