"""This suite's own reader of wandb's offline transaction log (run-<id>.wandb): leveldb-log framing,
32 KiB blocks, 7-byte record headers, records of wandb's protobuf. Independent of
training/report/wandb_logger.py's reader, which the tests check against it."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterator

BLOCK, HEADER = 32768, 7


def records(data: bytes, upto: int | None = None) -> Iterator:
    """The records of a whole log `data`, those that end at or before byte `upto` (all by default): a record
    cut short is read from the whole data, so a torn file's intact prefix is known exactly."""
    from wandb.proto import wandb_internal_pb2 as pb

    upto = len(data) if upto is None else upto
    pos, pending = HEADER, b""  # the file's own 7-byte header first
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0:
            break
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        pending = chunk if kind in (1, 2) else pending + chunk  # full/first start a record, middle/last extend it
        if kind in (1, 4) and pos <= upto:
            rec = pb.Record()
            rec.ParseFromString(pending)
            yield rec


def file_records(run_file: Path) -> Iterator:
    return records(run_file.read_bytes())


def history_steps(data: bytes, upto: int | None = None) -> list[int]:
    """The `_step` of each history record, in order."""
    return [json.loads(i.value_json) for rec in records(data, upto) if rec.WhichOneof("record_type") == "history"
            for i in rec.history.item if (i.key or "/".join(i.nested_key)) == "_step"]
