"""python -m training.plot: curves of one or more runs from their metrics.jsonl, without wandb."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from errors import run_cli
from training import plot

ROOT = Path(__file__).resolve().parents[1]


def write_run(path: Path, steps: int = 6, scale: float = 1.0) -> Path:
    path.mkdir(parents=True)
    lines = []
    for i in range(1, steps + 1):
        rec = {"iter": i, "train/loss": scale * (5 - 0.5 * i), "lr": 1e-3 * i / steps, "tokens_seen": 128 * i}
        if i % 3 == 0:
            rec["val/loss"] = scale * (5.2 - 0.5 * i)
        lines.append(json.dumps(rec))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_two_runs_in_one_figure_with_train_val_and_lr_curves(tmp_path):
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b", scale=0.9)
    fig = plot.make_figure([a, b])
    loss_step, loss_tokens, lr = fig.axes
    assert len(loss_step.lines) == len(loss_tokens.lines) == 4 and len(lr.lines) == 2  # train + val per run
    train_a = loss_step.lines[0]
    assert list(train_a.get_xdata()) == [1, 2, 3, 4, 5, 6] and list(train_a.get_ydata())[0] == 4.5
    val_a = loss_tokens.lines[1]
    assert list(val_a.get_xdata()) == [384, 768] and list(val_a.get_ydata()) == pytest.approx([3.7, 2.2])
    assert loss_tokens.get_xlabel() == "tokens seen" and lr.get_ylabel() == "learning rate"


def test_the_cli_writes_a_png(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: plot.main([str(a)]))
    assert e.value.code == 0
    png = (a / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert (width, height) == (1760, 495)  # 16 x 4.5 inches at 110 dpi
    assert capsys.readouterr().out.strip() == str(a / "curves.png")


@pytest.mark.parametrize("make,words", [
    (lambda d: d, "no metrics.jsonl"),
    (lambda d: (d.mkdir(), (d / "metrics.jsonl").write_text(""))[0] or d, "no train or val loss"),
    (lambda d: (d.mkdir(), (d / "metrics.jsonl").write_text('{"iter": 1}\nnot json\n{"iter": 2}\n'))[0] or d, "line 2 is not JSON"),
])
def test_bad_inputs_are_one_line(tmp_path, capsys, make, words):
    run_dir = make(tmp_path / "run")
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: plot.main([str(run_dir)]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_a_torn_last_line_is_skipped_and_an_unwritable_out_is_one_line(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    with open(a / "metrics.jsonl", "a") as f:
        f.write('{"iter": 7, "train/lo')  # a run killed mid-write
    assert len(plot.read_metrics(a)) == 6
    assert plot.main([str(a), "--out", str(tmp_path / "new" / "dir" / "x.png")]) == 0  # folders are made
    assert (tmp_path / "new" / "dir" / "x.png").stat().st_size > 0
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: plot.main([str(a), "--out", str(tmp_path / "file" / "x.png")]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: cannot write") and len(err.strip().splitlines()) == 1


def test_without_matplotlib_the_hint_is_one_line(tmp_path):
    a = write_run(tmp_path / "a")
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nsys.modules['matplotlib'] = None\n")
    r = subprocess.run([sys.executable, "-m", "training.plot", str(a)], cwd=ROOT, capture_output=True, text=True,
                       env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == ("error: plotting needs matplotlib, which is not installed; "
                                                     "pip install matplotlib")


def test_the_plot_is_written_atomically_and_a_killed_plots_temp_is_removed(tmp_path, monkeypatch):
    import matplotlib.figure

    from errors import UserError

    a = write_run(tmp_path / "a")
    out = tmp_path / "curves.png"
    leftover = tmp_path / ".curves.png.999999999-5.0123abcd.tmp"  # a pid above any pid_max: its writer is gone
    leftover.write_bytes(b"half a png")
    other = tmp_path / ".notes.txt.999999999-5.0123abcd.tmp"  # another file's temp: not the plot's to remove
    other.write_bytes(b"x")
    plot.plot([a], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not leftover.exists() and other.exists()

    before = out.read_bytes()

    def disk_full(self, fname, **kwargs):
        Path(fname).write_bytes(b"partial")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", disk_full)
    with pytest.raises(UserError, match="No space left on device"):
        plot.plot([a], out)
    assert out.read_bytes() == before and not list(tmp_path.glob(".curves.png.*.tmp"))
