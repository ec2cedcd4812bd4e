"""HF datasets as sources: from the hub (downloaded, or streamed) or saved with `save_to_disk`; a document per row."""
from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from typing import Any, Iterator

from errors import UserError, short_error
from network import hub_offline_unless_reachable

from .config import DataConfig
from .formats import row_kind
from .pieces import Piece, Source, safe_slug

HF_ROWS_PER_READ = 1000


# datasets' packaged builders: with no data_files they read the current directory, never what was meant
_BUILDERS = {"json", "csv", "parquet", "text", "arrow", "pandas", "webdataset", "imagefolder", "audiofolder",
             "videofolder", "sql", "xml", "generator"}


def _hub_url(name: str) -> str:
    """The dataset's hub page, only for names that look like a hub id (owner/name or name)."""
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", name) and not Path(name).exists():
        return f"; check the name, data.hf_subset and data.hf_split on https://huggingface.co/datasets/{name} and your network (or HF_DATASETS_OFFLINE)"
    return "; check the path, data.hf_subset and data.hf_split"


def hf_source(cfg: DataConfig, name: str, saved: bool = False) -> Source:
    subset = cfg.hf_subset or None
    kind = row_kind(cfg)
    fld = kind.field
    setting = "data.messages_field" if kind.chat else "data.text_field"
    if not saved and name.lower() in _BUILDERS:
        raise UserError(f"'hf:{name}' names datasets' {name} builder, which would read the current directory; give "
                        f"the files themselves: data.dataset: path/to/*.jsonl (or a folder, or a .parquet file)")
    where = (f"dataset saved at {name}" if saved else f"HF dataset {name!r}" + (f" (subset {subset!r})" if subset else "")) \
        + f" split {cfg.hf_split!r}"

    @functools.cache
    def dataset():
        import datasets  # slow to import; only HF sources need it

        try:
            if saved:
                ds = datasets.load_from_disk(name)
                if isinstance(ds, datasets.DatasetDict):
                    if cfg.hf_split not in ds:
                        raise UserError(f"the dataset saved at {name} has no split {cfg.hf_split!r} (splits: "
                                        f"{', '.join(ds)}); set data.hf_split to one of them")
                    ds = ds[cfg.hf_split]
            else:
                hub_offline_unless_reachable()  # an unreachable hub: the cache or HF's quick offline error
                kwargs: dict[str, Any] = {"split": cfg.hf_split, "streaming": cfg.streaming}
                if cfg.num_proc > 1 and not cfg.streaming:
                    kwargs["num_proc"] = cfg.num_proc
                ds = datasets.load_dataset(name, subset, **kwargs)
        except UserError:
            raise
        except Exception as e:  # the hub, the network and the builders raise many types; all mean "can't load this"
            detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise UserError(f"could not load {where}: {detail}{_hub_url(name) if not saved else '; check the folder'}") from None
        columns = ds.column_names
        if columns is None:  # a streamed dataset may not know its features until the first row
            first = next(iter(ds), None)
            columns = list(first) if first is not None else [fld]
        if fld not in columns:
            raise UserError(
                f"{where} has no column {fld!r} (columns: {', '.join(map(str, columns))}); "
                f"set {setting} to the one holding the {'messages' if kind.chat else 'text'}"
            )
        return ds.select_columns([fld])

    def read(pos: Any) -> Iterator[Piece]:
        try:
            yield from rows(pos)
        except UserError:
            raise
        except Exception as e:  # as when loading: many types, all "can't read this"; the build would blame data.root
            fix = ("check your network (a streamed dataset is read as it goes) and rerun" if cfg.streaming and not saved
                   else "its files may be damaged: " + ("save it again" if saved else "remove its copy in the HF "
                                                        "datasets cache and rerun to download it again"))
            raise UserError(f"could not read {where} ({short_error(e)}); {fix}") from None

    def rows(pos: Any) -> Iterator[Piece]:
        start = pos[1] if pos is not None else 0
        ds = dataset()
        if start:
            ds = ds.skip(start) if cfg.streaming and not saved else ds.select(range(start, len(ds)))
        row = start
        for batch in ds.iter(batch_size=HF_ROWS_PER_READ):
            for value in batch[fld]:
                row += 1
                if value is None and not kind.chat:  # a null text: an empty document
                    yield Piece(True, "", 1, [0, row - 1], None)
                    continue
                out = kind.take(value, True, [0, row - 1], 1)
                if isinstance(out, str):
                    if cfg.skip_bad_rows:
                        source.skipped.append([name, row, out])
                        continue
                    if kind.chat:
                        raise UserError(f"row {row} of {where}: {out}; fix that row, or set data.skip_bad_rows: true "
                                        f"to skip bad rows (they are counted)")
                    raise UserError(
                        f"row {row} of {where} has a {type(value).__name__} in column {fld!r}, not text; "
                        f"set data.text_field to a text column (or data.skip_bad_rows: true to skip such rows)"
                    )
                yield from out

    # A downloaded or saved dataset has a content fingerprint, so it is loaded now. A streamed one is
    # identified by name alone and opened only when it must be read: an up-to-date prepare needs no network.
    streaming = cfg.streaming and not saved
    content = None if streaming else getattr(dataset(), "_fingerprint", None)
    slug = ("saved-" + Path(name).resolve().name + "-" + hashlib.sha256(str(Path(name).resolve()).encode()).hexdigest()[:8]
            if saved else "hf-" + name.replace("/", "-") + (f"-{subset}" if subset else ""))
    source = Source(
        slug=safe_slug(f"{slug}-{cfg.hf_split}"),
        identity={"kind": "saved" if saved else "hf", "name": name, "subset": subset, "split": cfg.hf_split,
                  "field": fld, "content": content, **({"skip_bad_rows": True} if cfg.skip_bad_rows else {}),
                  **({"format": "chat"} if kind.chat else {})},
        total=None if streaming else len(dataset()),
        unit="doc",
        read=read,
    )
    return source
