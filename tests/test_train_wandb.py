"""wandb from train.py's side: an offline run's summary, config and history, one run id across resumes,
each logged step reaching wandb exactly once across a kill -9 or a crash, a failing or key-less wandb never
stopping training, and the reader of a torn offline file (checked by this suite's own reader, wandb_files)."""
from __future__ import annotations

import glob
import json
import re
import signal
import time
from pathlib import Path

import pytest

from checkpoint import load_checkpoint
from faults import inject
from tiny_runs import ROOT, _one_thread, run, sub_env, tiny_argv  # noqa: F401 (_one_thread: an autouse fixture)
from wandb_files import file_records, history_steps
import warm_runs


def test_wandb_offline_run_has_summary_and_config_and_resume_reuses_the_id(tmp_path, data_root):
    out = tmp_path / "out"
    common = ("--wandb.mode=offline", "--train.max_iters=6", "--train.eval_interval=6")
    with inject(interrupt_after=3):
        first = run(out, data_root, *common)
    run_id = first["wandb_run_id"]
    assert load_checkpoint(out)["train"]["run_id"] == run_id
    second = run(out, data_root, *common)
    assert second["wandb_run_id"] == run_id and load_checkpoint(out)["train"]["run_id"] == run_id
    run_dirs = sorted((out / "wandb").glob("offline-run-*"))
    # offline-run-<time>-<id>, with a -1 suffix when both runs start within the same second
    assert len(run_dirs) == 2 and all(re.search(rf"-{run_id}(-\d+)?$", d.name) for d in run_dirs)

    summary, config, history_keys = {}, {}, set()
    for rec in file_records(run_dirs[-1] / f"run-{run_id}.wandb"):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            assert rec.run.run_id == run_id
            config.update({u.key: json.loads(u.value_json) for u in rec.run.config.update})
        elif kind == "summary":
            for u in rec.summary.update:
                summary["/".join(u.nested_key) or u.key] = json.loads(u.value_json)
        elif kind == "history":
            history_keys |= {"/".join(i.nested_key) or i.key for i in rec.history.item}
    assert summary["val/loss"] == pytest.approx(second["eval"]["val/loss"])
    assert config["model"]["n_layer"] == 2 and config["model"]["n_embd"] == 32
    assert {"train/loss", "val/loss", "val/bpb", "lr", "grad_norm", "tokens_per_sec", "mfu", "tokens_seen"} <= history_keys


def test_wandb_online_without_api_key_falls_back_to_offline_with_hint(tmp_path):
    from training.report.wandb_logger import resolve_mode

    no_key = {"NETRC": str(tmp_path / "no_netrc")}
    mode, hint = resolve_mode("online", no_key)
    assert mode == "offline" and hint.startswith("wandb: no API key found") and "\n" not in hint
    assert resolve_mode("online", {**no_key, "WANDB_API_KEY": "x" * 40}) == ("online", "")
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    assert resolve_mode("online", {"NETRC": str(netrc)}) == ("online", "")
    assert resolve_mode("online", {**no_key, "WANDB_MODE": "disabled"}) == ("disabled", "")
    assert resolve_mode("offline", {"WANDB_MODE": "online"}) == ("offline", "")  # env never makes it less private


def test_wandb_failure_at_init_warns_once_and_training_continues(tmp_path, data_root, monkeypatch, capsys):
    import wandb

    def broken(*a, **k):
        raise RuntimeError("wandb service exploded")

    monkeypatch.setattr(wandb, "init", broken)
    res = run(tmp_path / "out", data_root, "--wandb.mode=offline", "--train.max_iters=3")
    assert res["iter"] == 3
    warnings = [l for l in capsys.readouterr().out.splitlines() if "wandb failed to start" in l]
    assert warnings == ["warning: wandb failed to start (RuntimeError: wandb service exploded); continuing without wandb"]


def _steps_per_file_once_written(folders: list[str], run_id: str, last: int) -> list[list[int]]:
    """The logged steps of each run file, read once the last file holds step `last`: wandb-core finishes
    writing a file a moment after run.finish() returns (up to 60 s on a loaded machine)."""
    deadline = time.time() + 60
    while True:
        steps = [history_steps((Path(f) / f"run-{run_id}.wandb").read_bytes()) for f in folders]
        if steps[-1][-1:] == [last] or time.time() > deadline:
            return steps
        time.sleep(0.2)


def test_a_resumed_offline_run_logs_each_step_once_and_says_how_to_sync_it(tmp_path, data_root, capsys):
    """The process dies after logging steps 4-5 but before checkpointing them; the resumed run redoes 4
    and 5 and must not log them to wandb a second time, nor drop any."""
    from faults import InjectedCrash

    out = tmp_path / "out"
    common = ("--wandb.mode=offline", "--train.max_iters=8", "--train.checkpoint_interval=3",
              "--train.eval_interval=100", "--train.log_interval=1")
    with inject(crash_at=5), pytest.raises(InjectedCrash):
        run(out, data_root, *common)
    assert load_checkpoint(out)["train"]["iter"] == 3
    res = run(out, data_root, *common)
    run_id = res["wandb_run_id"]
    folders = sorted(glob.glob(str(out / "wandb" / f"offline-run-*-{run_id}*")))  # start order: time-stamped
    assert len(folders) == 2
    first, second = _steps_per_file_once_written(folders, run_id, 8)
    assert first == [1, 2, 3, 4, 5] and second == [6, 7, 8]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records] == list(range(1, 9))  # replayed steps once, the resumed values
    assert [r["train/loss"] for r in records] == [res["losses"].get(i, r["train/loss"]) for i, r in enumerate(records, 1)]
    hint = next(line for line in capsys.readouterr().out.splitlines() if "wandb sync" in line)
    command = hint.split("with: ", 1)[1]
    assert command.startswith(f"wandb sync --id {run_id} ")
    assert sorted(glob.glob(command.split()[-1])) == folders  # the command's pattern names both parts


def test_after_kill_9_every_logged_step_reaches_wandb_exactly_once(tmp_path, data_root):
    """kill -9 right after step 7 (steps 1-6 logged, checkpoints at 3 and 6): wandb writes its offline
    file in batches, so the killed process's folder may lack steps it logged. Over both folders (what
    `wandb sync --id` uploads, in start order), read with this test's own reader, each step is there
    exactly once and in order."""
    out = tmp_path / "out"
    common = ("--wandb.mode=offline", "--train.max_iters=10", "--train.checkpoint_interval=3",
              "--train.eval_interval=100", "--train.log_interval=1")
    killed = warm_runs.run([ROOT / "tests" / "faults.py", *tiny_argv(out, data_root, *common)],
                           env={**{k: v for k, v in sub_env().items() if k != "WANDB_SERVICE"},  # its own wandb-core
                                "SMALLGPT_TEST_KILL_AFTER": "7"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert load_checkpoint(out)["train"]["iter"] == 6
    res = run(out, data_root, *common)
    run_id = res["wandb_run_id"]
    folders = sorted(glob.glob(str(out / "wandb" / f"offline-run-*-{run_id}*")))
    assert len(folders) == 2
    steps = [s for per_file in _steps_per_file_once_written(folders, run_id, 10) for s in per_file]
    assert steps == list(range(1, 11)), steps


def test_the_offline_reader_stops_at_a_torn_record_and_finds_the_last_step(tmp_path):
    """training.report.wandb_logger.last_offline_step reads what a killed process left: a file cut mid-record
    (or with a damaged byte) yields the steps before the damage, as this test's own reader counts them."""
    import wandb

    from training.report.wandb_logger import last_offline_step

    run = wandb.init(project="p", id="tornrun1", dir=str(tmp_path), mode="offline",
                     settings=wandb.Settings(console="off", silent=True))
    for step in range(1, 41):
        run.log({"x": float(step), "pad": "y" * 3000}, step=step)  # records spanning 32 KiB blocks
    run.finish()
    (run_file,) = sorted(tmp_path.glob("wandb/offline-run-*-tornrun1/run-tornrun1.wandb"))
    assert last_offline_step(str(tmp_path), "tornrun1") == 40  # (it waits until wandb-core has closed the file)
    assert history_steps(run_file.read_bytes()) == list(range(1, 41))
    data = run_file.read_bytes()
    cut = data.index(b'"x"' if b'"x"' in data else b"x", len(data) // 2)
    run_file.write_bytes(data[:cut])  # torn in the middle of a record
    expected = max([0, *history_steps(data, upto=cut)])
    assert 1 <= last_offline_step(str(tmp_path), "tornrun1") == expected < 40
    damaged = bytearray(data)
    damaged[len(data) // 3] ^= 0xFF
    run_file.write_bytes(bytes(damaged))
    assert last_offline_step(str(tmp_path), "tornrun1") < 40



def test_a_step_reaches_wandb_whole_in_one_call_or_not_at_all():
    """Found from outside: two Ctrl-C during the eval at step 12 left wandb a step 12 of the training numbers only
    (wandb commits what a step logged so far), and the resumed run, finding step 12 in wandb, never sent its val
    loss. Each part a step logs (log_step's numbers, the eval's, HellaSwag's, the samples table, the maps) now
    waits for the loop's end_step, which sends them in one call; a step cut short sends nothing."""
    from training.report.wandb_logger import WandbLogger

    sent = []

    class Run:
        def log(self, data, step):
            sent.append((step, sorted(data)))

    logger = WandbLogger.__new__(WandbLogger)  # its sending only, over a run that records each call
    logger.run, logger.logged_through, logger._pending, logger._pending_step = Run(), 0, [], -1
    logger.log({"train/loss": 3.0, "lr": 1e-3}, 11)
    logger.log({"val/loss": 3.1}, 11)
    logger.end_step()
    logger.log({"train/loss": 2.9, "lr": 1e-3}, 12)  # then a stop during step 12's eval: no end_step
    assert sent == [(11, ["lr", "train/loss", "val/loss"])]
    logger._pending = []  # (what the stopped process held dies with it)
    logger.log({"train/loss": 2.9, "lr": 1e-3}, 12)  # the resumed run's step 12, whole
    logger.log({"val/loss": 3.0}, 12)
    logger.end_step()
    assert sent[1] == (12, ["lr", "train/loss", "val/loss"]) and len(sent) == 2


def test_a_replayed_step_carries_the_pictures_still_on_disk(tmp_path):
    """Found from outside: after a kill -9 the steps re-sent to wandb from metrics.jsonl lacked their attention
    maps and surprisal page, which are still in <out_dir>/inspect/step-N/. They go with the step's numbers now; a
    step without maps, or whose files are gone, carries none."""
    from PIL import Image

    from training.report.showcase import Replay
    from training.report.wandb_logger import WandbLogger

    folder = tmp_path / "inspect" / "step-4"
    folder.mkdir(parents=True)
    for name in ("attention.png", "surprisal.png"):
        Image.new("RGB", (4, 4)).save(folder / name)
    (folder / "surprisal.html").write_text("<p>surprisal</p>")
    sent = []

    class Run:
        def log(self, data, step):
            sent.append((step, sorted(data)))

    logger = WandbLogger.__new__(WandbLogger)
    logger.run, logger.logged_through, logger._pending, logger._pending_step = Run(), 2, [], -1
    logger._print, logger._media = lambda line: None, Replay(tmp_path)
    logger._send_missing([{"iter": 3, "train/loss": 1.0}, {"iter": 4, "train/loss": 0.9, "inspect/bits_per_token": 2.0},
                          {"iter": 6, "inspect/bits_per_token": 1.9}])  # (step-6's files are gone)
    assert sent == [(3, ["train/loss"]),
                    (4, ["inspect/attention", "inspect/bits_per_token", "inspect/surprisal", "inspect/surprisal_html",
                         "train/loss"]),
                    (6, ["inspect/bits_per_token"])]


def test_a_replayed_step_that_sampled_carries_the_samples_table_as_it_stood_then():
    """Left alone last session: after a kill -9 the steps re-sent to wandb from metrics.jsonl lacked the samples
    table's versions (wandb shows a table's last version; the next sampling step's table held their rows). A
    replayed step that sampled now carries the table of every row up to it, those of the steps wandb already had
    (here step 2) included. The reference: the rows written into the records, by hand."""
    from training.report.showcase import Replay
    from training.report.wandb_logger import WandbLogger

    tables = []

    class Run:
        def log(self, data, step):
            if "samples" in data:
                tables.append((step, data["samples"].columns, [list(row) for row in data["samples"].data]))

    logger = WandbLogger.__new__(WandbLogger)
    logger.run, logger.logged_through, logger._pending, logger._pending_step = Run(), 2, [], -1
    logger._print, logger._media = lambda line: None, Replay("/nonexistent")
    sample = lambda step, text: {"iter": step, "samples": [{"prompt": "A", "text": text}, {"prompt": "B", "text": text + "!"}]}
    logger._send_missing([sample(2, "two"), {"iter": 3, "train/loss": 1.0}, sample(4, "four"), sample(6, "six")])
    two, four, six = ([[s, "A", t], [s, "B", t + "!"]] for s, t in ((2, "two"), (4, "four"), (6, "six")))
    assert tables == [(4, ["step", "prompt", "text"], two + four), (6, ["step", "prompt", "text"], two + four + six)]
