"""Data pipeline: text sources -> tokens on disk (prepare) -> random-window batches (BatchLoader).

    from data import DataConfig, prepare_data, load_meta, get_tokenizer, tokenizer_from_meta, BatchLoader
"""
import importlib

_EXPORTS = {  # each name and the module it lives in: imported on first use (__getattr__ below)
    "prepare_data": "build", "DataConfig": "config", "hold_data": "holds", "load_meta": "manifest",
    "Tokenizer": "tokenizer", "get_tokenizer": "tokenizer", "tokenizer_entry": "tokenizer",
    "tokenizer_from_meta": "tokenizer", "BatchLoader": "loader",
}

__all__ = ["BatchLoader", "DataConfig", "Tokenizer", "get_tokenizer", "hold_data", "load_meta", "prepare_data",
           "tokenizer_entry", "tokenizer_from_meta"]


def __getattr__(name: str):
    # The package imports its modules when a name is first used, not when it is imported: BatchLoader needs
    # torch (~1 s), which `python -m data.prepare` never does, and `python -m data.prepare` / `data.tasks` import
    # this package before their own first line, where Ctrl-C during start-up becomes one line
    # (errors.quiet_interrupts).
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
