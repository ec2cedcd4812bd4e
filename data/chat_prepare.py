"""Preparing a chat source (data.format: chat): every row read and checked, the skipped ones counted.

A stand-in for the SFT preparation (token shards with a loss mask, a manifest, resume after a kill), which
codes against data/conversations.py's chat_rows and data/chat_template.py's encode_conversation and replaces
this file: until then, a chat source is read whole, so a bad row is the same one-line error it will be, and
then the preparation stops in one line.
"""
from __future__ import annotations

from pathlib import Path

from errors import UserError, to_stderr

from .config import DataConfig
from .conversations import chat_rows, skip_report


def prepare_chat(cfg: DataConfig, progress: bool = True) -> Path:
    sources = [chat_rows(cfg)] + ([chat_rows(cfg, cfg.val_dataset, key="data.val_dataset")] if cfg.val_dataset else [])
    count = 0
    for rows in sources:
        count += sum(1 for _ in rows.read())
        report = skip_report(rows.skipped())
        if report:
            to_stderr(report)
    raise UserError(f"data.format: chat: {count} conversation(s) read and checked, but this version cannot write "
                    f"SFT token shards yet; use data.format: text")
