"""Outputs that would damage an input, and leftover temps under the trainer's lock.

An output inside what is being read: for every command with an input and an output, the output named as
one of the files it reads, or as a new file inside a folder it reads, spelled directly, through a
symlink, through a hard link or with `..` detours (drawn by hypothesis): one line naming the output, and
the input left exactly as it was.

Temps under the lock: while the trainer holds an out_dir's lock no one else writes its checkpoints, so
every temp of a checkpoint's name is an orphan, whatever pid its name carries (a live one, a reused one,
an older name without the start time): claim_out_dir removes each; the temps of other names, of live
writers (a consolidate writing consolidated.pt beside the run), stay.
"""
from __future__ import annotations

import os
import time
import secrets
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from benchmarks import cli as bench_cli
from inference import sample_cli
from checkpoint.__main__ import main as checkpoint_main
from checkpoint.export import main as export_main
from checkpoint import claim_out_dir
from data.prepare import main as prepare_main
from fileio import process_start_time
from training import plot

from hostile_world import SAMPLE_FAST, run_entry, snapshot
from cli_lines import an_error_line



def tree(path: Path) -> dict:
    if not path.is_dir():
        return {"": snapshot(path)}
    return {str(p.relative_to(path)): snapshot(p) for p in sorted(path.rglob("*"))}


# Each case: (the command, its argv given the output path and the case folder, the input it reads, the
# output's place relative to that input: a file of it, or a new name inside it).
def _run(t: Path) -> Path:
    return t / "run"


CASES = {
    "sample.py --out .metadata": (sample_cli.main, lambda o, t: ["--checkpoint", _run(t), "--out", o, *SAMPLE_FAST],
                                  "run/ckpt.dcp", ".metadata"),
    "sample.py --out a shard": (sample_cli.main, lambda o, t: ["--checkpoint", _run(t), "--out", o, *SAMPLE_FAST],
                                "run/ckpt.dcp", "__0_0.distcp"),
    "sample.py --out state.pt": (sample_cli.main, lambda o, t: ["--checkpoint", _run(t) / "ckpt.dcp", "--out", o,
                                                            *SAMPLE_FAST], "run/ckpt.dcp", "state.pt"),
    "sample.py --out new in ckpt.dcp": (sample_cli.main, lambda o, t: ["--checkpoint", _run(t), "--out", o, *SAMPLE_FAST],
                                        "run/ckpt.dcp", "samples.txt"),
    "sample.py --out the prompt file": (sample_cli.main, lambda o, t: ["--checkpoint", _run(t), "--prompt-file",
                                                                   t / "prompt.txt", "--out", o, *SAMPLE_FAST],
                                        "prompt.txt", ""),
    "consolidate --out state.pt": (checkpoint_main, lambda o, t: ["consolidate", _run(t) / "ckpt.dcp", "--out", o],
                                   "run/ckpt.dcp", "state.pt"),
    "consolidate --out a shard": (checkpoint_main, lambda o, t: ["consolidate", _run(t), "--out", o],
                                  "run/ckpt.dcp", "__0_0.distcp"),
    "consolidate --out .metadata": (checkpoint_main, lambda o, t: ["consolidate", _run(t), "--out", o],
                                    "run/ckpt.dcp", ".metadata"),
    "consolidate --out new in ckpt.dcp": (checkpoint_main, lambda o, t: ["consolidate", _run(t), "--out", o],
                                          "run/ckpt.dcp", "one.pt"),
    "export --out the checkpoint file": (export_main, lambda o, t: ["--checkpoint", t / "gpt2" / "ckpt.pt", "--out", o],
                                         "gpt2/ckpt.pt", ""),
    "export --out new in its run": (export_main, lambda o, t: ["--checkpoint", t / "gpt2", "--out", o], "gpt2", "hf"),
    "training.plot --out its metrics file": (plot.main, lambda o, t: [t / "m.svg", "--out", o], "m.svg", ""),
    "data.prepare --root in its source folder": (prepare_main, lambda o, t: [
        "--dataset", t / "corpus", "--tokenizer", "char", "--root", o, "--no-progress"], "corpus", "prepared"),
    "bench.py --json a --budget-configs file": (bench_cli.parse_args, lambda o, t: [
        "--json", o, "--budget-configs", t / "cfg.yaml"], "cfg.yaml", ""),
}
SPELLINGS = ("direct", "detour", "symlink", "hard link")


def spell(how: str, path: Path, t: Path) -> Path:
    """Another name for `path` (which may not exist yet: only its folder is linked then)."""
    if how == "direct":
        return path
    if how == "detour":
        return path.parent / ".." / path.parent.name / "." / path.name
    if how == "symlink":
        link = t / f"link-{secrets.token_hex(3)}{path.suffix}"  # the suffix too: training.plot keeps it
        if path.exists():
            link.symlink_to(path)
            return link
        link.symlink_to(path.parent, target_is_directory=True)
        return link / path.name
    if path.is_file():  # a hard link: the same file under another name
        link = t / f"hard-{secrets.token_hex(3)}{path.suffix}"
        os.link(path, link)
        return link
    return path  # (no hard link to what does not exist)


@pytest.mark.parametrize("case", CASES)
@settings(max_examples=max(4, settings().max_examples // 5))
@given(how=st.sampled_from(SPELLINGS))
def test_an_output_is_never_an_input_or_inside_one(world, tmp_path_factory, capsys, case, how):
    t = tmp_path_factory.mktemp("out-in")
    shutil.copytree(world.run, t / "run")
    shutil.copy(world.prompt, t / "prompt.txt")
    (t / "gpt2").mkdir()
    shutil.copy(world.gpt2, t / "gpt2" / "ckpt.pt")
    shutil.copy(world.run / "metrics.jsonl", t / "m.svg")  # a metrics file whose name is an image's
    (t / "corpus").mkdir()
    shutil.copy(world.corpus, t / "corpus" / "a.txt")
    (t / "cfg.yaml").write_text("model:\n  n_layer: 1\n")
    main, argv, victim, inside = CASES[case]
    victim = t / victim
    out = spell(how, victim / inside if inside else victim, t)
    before = tree(victim)
    code, _, err = run_entry(main if main is not bench_cli.parse_args else (lambda a: bench_cli.parse_args(a) and 0),
                             argv(out, t), capsys)
    an_error_line(code, err, out.name)
    assert tree(victim) == before




# ------------------------------------------------------------------------------------------ temps under the lock

CHECKPOINT_NAMES = ("ckpt.pt", "best.pt", "ckpt.dcp", "best.dcp")
OTHER_NAMES = ("consolidated.pt", "curves.png")

temp_specs = st.lists(st.tuples(
    st.sampled_from(CHECKPOINT_NAMES + OTHER_NAMES),
    st.sampled_from(["me", "pid 1", "dead", "huge"]),  # whose pid the name carries
    st.sampled_from(["right", "old format", "wrong"]),  # the start time beside it
    st.booleans(),  # a temp directory (a sharded save) or a file
), min_size=1, max_size=6)


def temp_named(out: Path, final: str, who: str, start: str, is_dir: bool) -> Path:
    pid = {"me": os.getpid(), "pid 1": 1, "dead": 2**22 + 7, "huge": 10**30}[who]
    started = process_start_time(pid) if who in ("me", "pid 1") else "12345"
    stamp = {"right": f"-{started}", "old format": "", "wrong": "-1"}[start]
    path = out / f".{final}.{pid}{stamp}.{secrets.token_hex(4)}.tmp"
    path.mkdir() if is_dir else path.write_bytes(b"half a checkpoint")
    if is_dir:
        (path / "state.pt").write_bytes(b"half")
    return path


@given(specs=temp_specs)
def test_under_the_lock_every_checkpoint_temp_is_an_orphan(tmp_path_factory, specs):
    out = tmp_path_factory.mktemp("locked")
    temps = [(temp_named(out, *spec), spec) for spec in specs]
    lock = claim_out_dir(out, say=lambda line: None)
    try:
        for path, (final, who, start, _) in temps:
            # the spec, independent of the code: a checkpoint's temp always goes; another name's only when its
            # writer is gone (a live pid with its start time, or an old-format name with a live pid, stays)
            live = who in ("me", "pid 1") and start in ("right", "old format")
            assert path.exists() == (final not in CHECKPOINT_NAMES and live), (path.name, final, who, start)
    finally:
        lock.release()


def test_a_fifo_with_a_reader_gets_the_whole_output(tmp_path):
    """The output checks probe a FIFO for a reader once and keep that end open until the output is written:
    a probe that closed it would hand the reader an end of file before any text came (it read nothing)."""
    import threading

    from inference import sample_cli
    from errors import run_cli
    from sample_runs import make_char_checkpoint

    make_char_checkpoint(tmp_path / "ckpt.pt")
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    time.sleep(0.2)  # the reader has the FIFO open
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: sample_cli.main(["--checkpoint", str(tmp_path / "ckpt.pt"), "--max-new-tokens", "8",
                                     "--num-samples", "2", "--out", str(fifo)]))
    assert e.value.code == 0
    reader.join(timeout=30)
    assert got and len(got[0].decode()) > 8, got  # the samples, not an early end of file
