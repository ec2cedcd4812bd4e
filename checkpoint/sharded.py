"""The sharded checkpoint: torch.distributed.checkpoint (DCP), the second storage backend.

One directory per checkpoint (`ckpt.dcp/`, `best.dcp/`):

    ckpt.dcp/.metadata            DCP's index of every tensor and where its pieces are
    ckpt.dcp/__<rank>_0.distcp    each rank's shards of the "model" and "optimizer" entries
    ckpt.dcp/state.pt             everything else, written once by rank 0 (step, RNG streams of every
                                  rank, data position, dtype, config, tokenizer, model_config): a
                                  torch.save file like ckpt.pt, read with weights_only=True

The entries in the shards are keyed by parameter name (torch.distributed.checkpoint.state_dict), not by
rank, so DCP reshards them on load: a checkpoint written by N ranks loads into M ranks, or into one
process with no process group at all (inference, the export, `python -m checkpoint consolidate`).

Writing: rank 0 makes a temp directory beside the target (fileio.temp_dir), every rank writes its
shards into it, rank 0 adds state.pt and renames the directory into place (fileio.replace_dir). A
writer killed at any moment leaves the previous checkpoint intact and a temp directory that the next
trainer removes (checkpoint/out_dir.py).

Reading never runs code from the files: DCP's .metadata is a pickle, so it is read by an unpickler
that admits only DCP's own metadata classes and a few plain types; tensors and other values come
from torch's weights_only loader.
"""
from __future__ import annotations

import functools
import io
import os
import pickle
import stat
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from bounded import TooLarge, read_at_most
from errors import UserError, clipped, short_error
from fileio import path_kind, replace_dir, temp_dir
from model.gpt import GPT, GPTConfig

from .meta import meta_model
from .model_config import model_config_problem

if TYPE_CHECKING:  # imported for real on first use (_dcp)
    from torch.distributed.checkpoint.metadata import Metadata

STATE_NAME = "state.pt"  # the entries written once, beside the shards
METADATA_NAME = ".metadata"
SHARDED_ENTRIES = ("model", "optimizer")  # what each rank writes its shards of
# The most of a .metadata this reads: far past any index this project writes (20 KB for a one-layer model,
# about 1.5 MB for GPT-2 124M sharded over 8 ranks), so a huge or sparse file is refused by its size, unread.
MAX_METADATA_BYTES = 256 * 2**20
DAMAGED = ("the checkpoint is damaged: use another one (e.g. best.dcp), or one consolidated from a good one "
           "(python -m checkpoint consolidate)")


def is_sharded_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / METADATA_NAME).is_file()


# ---------------------------------------------------------------------------------- safe metadata

# what DCP's .metadata pickles, by name: its own metadata dataclasses and enum, torch.Size, dtypes,
# layouts and the checkpoint's path. Nothing else is looked up, so nothing that can run code.
_DCP_CLASSES = {("torch.distributed.checkpoint.metadata", name) for name in (
    "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
    "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo")}
_SAFE_GLOBALS = _DCP_CLASSES | {("torch", "Size"), ("torch.serialization", "_get_layout"),
                                ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
                                ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):  # torch.float32, ...
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in DCP metadata")


def _dcp():
    """torch.distributed.checkpoint, imported on first use: it pulls in DTensor and sympy (~1 s of every
    start-up), which sampling, exporting and single-file training never need."""
    import torch.distributed.checkpoint as dcp

    return dcp


@functools.cache
def _safe_reader() -> type:
    """DCP's file reader, with .metadata read by the restricted unpickler above (a class built on first
    use, see _dcp)."""
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    class SafeReader(_dcp().FileSystemReader):
        """`known`: the .metadata already read (and checked) by this load, handed to DCP instead of read again."""

        def __init__(self, path: str | os.PathLike, known: Metadata | None = None):
            super().__init__(path)
            self.known = known

        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            metadata = self.known
            if metadata is None:
                metadata = _MetadataUnpickler(io.BytesIO(_metadata_bytes(Path(self.path)))).load()
            if not isinstance(metadata, Metadata):
                raise pickle.UnpicklingError(f"{METADATA_NAME} holds a {type(metadata).__name__}, not DCP's Metadata")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader


def _metadata_bytes(path: Path) -> bytes:
    """The .metadata's bytes, at most MAX_METADATA_BYTES of them (a 20 GB sparse file is refused by its size)."""
    try:  # (read at its own size: read(MAX + 1) would take 256 MiB of memory for a 20 KB index)
        return read_at_most(path / METADATA_NAME, MAX_METADATA_BYTES)
    except TooLarge as e:
        raise UserError(f"sharded checkpoint {path}: its {METADATA_NAME} is {e.words(MAX_METADATA_BYTES)}, more than the "
                        f"{MAX_METADATA_BYTES // 2**20} MiB any checkpoint's index takes; {DAMAGED}") from None


def _metadata(path: Path) -> Metadata:
    try:
        return _safe_reader()(path).read_metadata()
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError, IndexError, KeyError,
            RecursionError) as e:
        raise UserError(f"sharded checkpoint {path} has an unreadable {METADATA_NAME} ({short_error(e, 120)}); "
                        "use another checkpoint (e.g. best.dcp)") from None


def check_shards(path: Path, metadata: Metadata) -> int:
    """Every shard file the .metadata points into is there, a regular file, and long enough for every
    piece it should hold: a missing, empty or truncated shard is named in one line before DCP reads
    anything (DCP itself fails deep in its reader, or reads a piece that ends early into a tensor).
    Returns the bytes those shard files hold together: all that any tensor of the checkpoint can be."""
    ends: dict[str, int] = {}
    total = 0
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
            raise UserError(f"sharded checkpoint {path}: its {METADATA_NAME} names a shard {clipped(name, 80)} outside the "
                            "checkpoint; the checkpoint is damaged: use another one (e.g. best.dcp)")
        try:
            ends[name] = max(ends.get(name, 0), int(info.offset) + int(info.length))
        except (AttributeError, TypeError, ValueError) as e:
            raise UserError(f"sharded checkpoint {path} has an unreadable {METADATA_NAME} ({short_error(e, 120)}); "
                            "use another checkpoint (e.g. best.dcp)") from None
    for name, end in sorted(ends.items()):
        shard = path / name
        try:
            st = shard.stat()
        except OSError as e:
            raise UserError(f"sharded checkpoint {path}: shard {name} is missing or unreadable ({e.strerror or short_error(e)}); "
                            "the checkpoint is incomplete: use another one (e.g. best.dcp)") from None
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"sharded checkpoint {path}: shard {name} is not a regular file; use another checkpoint "
                            "(e.g. best.dcp)")
        if st.st_size < end:
            raise UserError(f"sharded checkpoint {path}: shard {name} is truncated ({st.st_size} bytes, its "
                            f"{METADATA_NAME} says at least {end}); use another checkpoint (e.g. best.dcp)")
        total += st.st_size
    return total


def check_claims(path: Path, metadata: Metadata, held: int, prefixes: tuple[str, ...],
                 expected: dict[str, tuple[int, ...]] | None = None, whose: str = "") -> None:
    """The tensors the .metadata claims under `prefixes` (e.g. "model."), refused by arithmetic before any is
    allocated: each one's bytes (numel x itemsize), and all of them together, at most the `held` bytes of the
    shard files (a tensor cannot hold more than was written), and each of the shape `expected` gives it (the
    checkpoint's own model_config, or the tensors a resumed run loads into: `whose` says which). Else one line
    naming the tensor:
    a hand-edited index claiming a (2**20, 2**20) embedding would make the reader allocate 4 TiB."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    claimed = 0
    for key, md in (metadata.state_dict_metadata or {}).items():
        if not (isinstance(key, str) and key.startswith(prefixes) and isinstance(md, TensorStorageMetadata)):
            continue
        size, nbytes = _claimed_size(path, key, md)
        if nbytes > held:
            raise UserError(f"sharded checkpoint {path}: its {METADATA_NAME} says tensor {clipped(key, 80)} is "
                            f"{_shape(size)} ({nbytes:,} bytes), but its shard files hold only {held:,} bytes; {DAMAGED}")
        want = (expected or {}).get(key)
        if want is not None and tuple(want) != size:
            raise UserError(f"sharded checkpoint {path}: its {METADATA_NAME} says tensor {clipped(key, 80)} is "
                            f"{_shape(size)}, but {whose} is {_shape(want)}; {DAMAGED}")
        claimed += nbytes
        if claimed > held:
            raise UserError(f"sharded checkpoint {path}: its {METADATA_NAME} claims more tensor bytes (over "
                            f"{claimed:,}) than its shard files hold ({held:,}); {DAMAGED}")


def _shape(size: tuple[int, ...]) -> str:
    """A shape for a one-line message, cut (a claim can have thousands of dimensions)."""
    text = "x".join(map(str, size)) or "a scalar"
    return text if len(text) <= 60 else text[:59] + "…"


def _claimed_size(path: Path, key: str, md: Any) -> tuple[tuple[int, ...], int]:
    """(shape, bytes) of a tensor as the .metadata claims it; one line where it is no shape of a dtype."""
    try:
        size = tuple(md.size)
        itemsize = md.properties.dtype.itemsize
        if not all(isinstance(n, int) and n >= 0 for n in size) or not isinstance(itemsize, int):
            raise ValueError("a size that is not a list of counts")
    except (AttributeError, TypeError, ValueError) as e:
        raise UserError(f"sharded checkpoint {path} has an unreadable {METADATA_NAME} (tensor {clipped(key, 80)}: "
                        f"{short_error(e, 80)}); {DAMAGED}") from None
    nbytes = itemsize
    for n in size:  # exact integers: no float rounds a claim of 2**20 x 2**20 down to something that fits
        nbytes *= n
    return size, nbytes


# ---------------------------------------------------------------------------------- the backend

def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


class ShardedDir:
    """Backend: a DCP directory per checkpoint (see the module docstring). `write` is collective: every
    rank calls it with its own payload (its shards of "model" and "optimizer"; the other entries are
    taken from rank 0). `state_file` is the single-file backend that writes and reads state.pt."""

    def __init__(self, state_file):
        self.state_file = state_file

    def write(self, path: Path, payload: dict[str, Any]) -> None:
        distributed = dist.is_initialized()
        tmp = None
        if _rank() == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = temp_dir(path)
        if distributed:  # every rank writes into rank 0's temp dir (the out_dir is shared by all nodes)
            box = [str(tmp) if tmp is not None else None]
            dist.broadcast_object_list(box, src=0)
            tmp = Path(box[0])
        shards = {k: payload[k] for k in SHARDED_ENTRIES if k in payload}
        dcp = _dcp()
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            with warnings.catch_warnings():  # one process: "assuming the intent is to save in a single process"
                warnings.simplefilter("ignore", UserWarning)
                dcp.save(shards, storage_writer=dcp.FileSystemWriter(tmp, single_file_per_rank=True, sync_files=True),
                         no_dist=not distributed)
        except CheckpointException as e:  # DCP gathers every rank's failure (a full disk, a quota) into one
            raise OSError(short_error(e, 200)) from None
        # when dcp.save returns on rank 0 (its coordinator), every rank's shards and the .metadata are written
        if _rank() == 0:
            rest = {k: v for k, v in payload.items() if k not in SHARDED_ENTRIES}
            self.state_file.write(tmp / STATE_NAME, rest)
            replace_dir(tmp, path)

    def read(self, path: Path, needed: tuple[str, ...] = ()) -> dict[str, Any]:
        """state.pt's entries; of the sharded ones, those in `needed` loaded whole into this process
        (inference asks for "model"); a training run restores them in place instead (load_into)."""
        if not path.is_dir():  # a file named *.dcp: no sharded checkpoint, whatever its name says
            raise UserError(f"{path} is {path_kind(path)}, not a sharded checkpoint's folder; pass a ckpt.dcp/ folder, "
                            "a ckpt.pt or a training out_dir")
        for name in (STATE_NAME, METADATA_NAME):  # both, before anything is read: a save killed mid-write
            if not (path / name).is_file():
                raise UserError(f"sharded checkpoint {path} has no {name}; it is incomplete: use another "
                                "checkpoint (e.g. best.dcp)")
        payload = self.state_file.read(path / STATE_NAME)
        if isinstance(payload, dict):
            for name in set(needed) & set(SHARDED_ENTRIES):
                expected = model_shapes(saved_meta_model(payload.get("model_config"))) if name == "model" else None
                payload[name] = load_whole(path, name, expected)
        return payload


def saved_meta_model(saved: Any) -> GPT | None:
    """The meta model (checkpoint/meta.py) of a checkpoint's model_config; None where it is no valid config (its
    reader refuses it then, naming the field: checkpoint/load.py)."""
    try:
        config = GPTConfig(**saved)
        if model_config_problem(config):
            return None
    except TypeError:  # not a dict, or a field GPTConfig does not have
        return None
    return meta_model(config)


def model_shapes(model: GPT | None) -> dict[str, tuple[int, ...]] | None:
    """The shapes of `model`'s tensors (a meta model: built once per load, and the one its weights are then
    assigned to), keyed as in the shards ("model.<name>"); None for None."""
    return None if model is None else {f"model.{k}": tuple(t.shape) for k, t in model.state_dict().items()}


def load_whole(path: Path, name: str, expected: dict[str, tuple[int, ...]] | None = None) -> dict[str, torch.Tensor]:
    """The entry `name` of a sharded checkpoint, every tensor whole, in this process alone (no process
    group needed, whatever number of ranks wrote it). Keyed as saved: parameter names for "model".
    `expected`: the shapes the tensors must have (model_shapes); each claim is checked before it is allocated."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = _metadata(path)
    prefix = name + "."
    check_claims(path, metadata, check_shards(path, metadata), (prefix,), expected,
                 "the checkpoint's model_config makes it")
    template = {key: torch.empty(md.size, dtype=md.properties.dtype)
                for key, md in metadata.state_dict_metadata.items()
                if key.startswith(prefix) and isinstance(md, TensorStorageMetadata)}
    if not template:
        raise UserError(f"sharded checkpoint {path} holds no {name!r} tensors; use a checkpoint written by train.py")
    _load(path, template, metadata, no_dist=True)
    return {key[len(prefix):]: t for key, t in template.items()}


def load_into(path: Path, state: dict[str, Any]) -> None:
    """Load the sharded entries of `state` ({"model": ..., "optimizer": ...}, state dicts of this run's
    sharded or plain tensors) in place from the checkpoint at `path`; DCP reshards as needed. Every
    rank calls it. Each tensor's claimed shape must be its destination's (a DTensor's size is the whole one)."""
    metadata = _metadata(path)
    expected = {key: tuple(t.size()) for key, t in _flat_tensors(state, "")}
    check_claims(path, metadata, check_shards(path, metadata), tuple(f"{k}." for k in state), expected,
                 "this run's tensor")
    _load(path, state, metadata, no_dist=not dist.is_initialized())


def _flat_tensors(obj: Any, key: str):
    """(dotted key, tensor) of every tensor in nested dicts and lists, keyed as DCP flattens them."""
    if isinstance(obj, torch.Tensor):
        yield key, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flat_tensors(v, f"{key}.{k}" if key else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _flat_tensors(v, f"{key}.{i}" if key else str(i))


def _load(path: Path, state: dict[str, Any], metadata: Metadata, no_dist: bool) -> None:
    """DCP's load of `state` from `path`, whose .metadata this load read (and check_shards checked) once: DCP is
    handed it (a failure of DCP's own reader is logged as a traceback, and retried, before it raises)."""
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            _dcp().load(state, storage_reader=_safe_reader()(path, metadata), no_dist=no_dist)
    except UserError:
        raise
    except (Exception, _dcp().api.CheckpointException) as e:  # DCP wraps every rank's failure (a missing shard, a torn
        # file) in CheckpointException, a BaseException: `except Exception` alone lets it through as a traceback
        raise UserError(f"cannot read sharded checkpoint {path} ({short_error(e, 160)}); it is damaged or was "
                        "written by another model: use another checkpoint (e.g. best.dcp)") from None


def sharded_name(name: str) -> str:
    """ckpt.pt -> ckpt.dcp: the sharded checkpoint's directory name beside the single-file one."""
    return os.path.splitext(name)[0] + ".dcp"
