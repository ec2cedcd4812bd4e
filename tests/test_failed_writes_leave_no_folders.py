"""Every writer that makes the folders its output goes into leaves none of them when the write fails (a full
disk, a quota): `python -m training.plot --out new/dir/curves.png`, save_checkpoint (`python -m checkpoint
consolidate --out new/dir/x.pt`), a run's inspect pictures (<out_dir>/inspect/step-N/), the tiny shakespeare
download and the cache of measured choices. The failure is injected at the write itself (as tests/faults.py
injects faults), and the folder tree under the test's temp dir is compared with what it was before."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import checkpoint.format as ckpt_format
import data.download as download
import runtime.choices as choices
import training.plot as plot
import training.report.showcase as showcase
from checkpoint import save_checkpoint
from errors import UserError


def full_disk(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def folders(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_dir()}


def write_plot(t: Path, monkeypatch) -> None:
    run = t / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"iter": i, "train/loss": 3.0 - i / 10}) + "\n"
                                               for i in range(1, 4)))
    import matplotlib.figure

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full_disk)
    with pytest.raises(UserError, match="No space left"):
        plot.plot([run], t / "new" / "dir" / "curves.png")


def write_checkpoint(t: Path, monkeypatch) -> None:
    monkeypatch.setattr(ckpt_format.torch, "save", full_disk)
    with pytest.raises(OSError):
        save_checkpoint(t / "new" / "dir" / "consolidated.pt", {"format": "smallgpt-checkpoint", "version": 3},
                        follow=True)


def write_inspect_pictures(t: Path, monkeypatch) -> None:
    (t / "out").mkdir()  # a run's out_dir exists: the folders made are inspect/ and step-7/
    monkeypatch.setattr(showcase, "atomic_write_bytes", full_disk)
    shown = showcase.Showcase()
    monkeypatch.setattr(shown, "inspect", lambda r: (SimpleNamespace(mean_bits=lambda: 1.0), {"attention.png": b"x"}),
                        raising=False)
    run = SimpleNamespace(state=SimpleNamespace(iter=7), cfg=SimpleNamespace(train=SimpleNamespace(out_dir=str(t / "out"))))
    with pytest.raises(UserError, match="cannot write"):
        shown._log_inspection(run)


def write_download(t: Path, monkeypatch) -> None:
    body = Path(os.environ["SMALLGPT_SHAKESPEARE"]).read_bytes()  # the real file: its sha256 is checked first

    class Answer:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, n):
            return body[:n]

    import urllib.request

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: Answer())
    monkeypatch.setattr(download, "atomic_write_bytes", full_disk)
    with pytest.raises(OSError):
        download._download_shakespeare(t / "new" / "dir" / "input.txt")


def write_choices(t: Path, monkeypatch) -> None:
    monkeypatch.setenv(choices.CACHE_ENV, str(t / "new" / "dir"))
    monkeypatch.setattr(choices, "atomic_write_bytes", full_disk)
    assert choices._write("key", {"choice": "a"}) is False


WRITERS = {"training.plot": write_plot, "save_checkpoint (consolidate)": write_checkpoint,
           "a run's inspect pictures": write_inspect_pictures, "the shakespeare download": write_download,
           "the cache of measured choices": write_choices}


MADE = ("new", "dir", "inspect", "step-7")  # the folders the writers above make for their outputs


@pytest.mark.parametrize("writer", WRITERS)
def test_a_failed_write_leaves_none_of_the_folders_made_for_it(writer, tmp_path, monkeypatch):
    WRITERS[writer](tmp_path, monkeypatch)
    left = {p for p in folders(tmp_path) if p.name in MADE}
    assert not left, left
