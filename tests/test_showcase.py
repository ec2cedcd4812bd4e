"""training/report/showcase.py: samples and attention maps during training. An offline wandb run holds the sample
table and the pictures at the steps asked for (read back from its files); the text is what the model of
that step writes with the fixed seed (an independent sampling loop); a resumed run logs the same table;
samples and maps leave the training trajectory bit for bit as it was; bad values are one line before
anything is built; 2 ranks (DDP and FSDP, where every rank takes part in each forward) finish."""
from __future__ import annotations

import functools
import json
import math
import os
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from hypothesis import event, given, strategies as st

from training import chain, loop

from training import cli as train_cli
from checkpoint import load_checkpoint
from data import DataConfig, load_meta, prepare_data, tokenizer_entry
from errors import UserError
from faults import InjectedCrash, inject
from model import GPT, GPTConfig
from training.config.sections import load_config
from training.timing.schedule import Cadence
from training.report.showcase import build_showcase

from multirank_runs import argv as multirank_argv, two_ranks
from tiny_runs import _one_thread, run, tiny_argv  # noqa: F401 (_one_thread: an autouse fixture)
from wandb_files import file_records
import warm_runs

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 12  # generated per prompt: enough to tell two texts apart, cheap on a tiny model


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def sample_records(out: Path) -> dict[int, list[dict]]:
    return {r["iter"]: r["samples"] for r in records(out) if "samples" in r}


def wandb_media(folder: Path, last: int) -> dict[str, dict[int, dict]]:
    """{history key: {step: its value}} of the offline run in `folder`, read with this suite's own reader of
    the transaction log, once the file holds step `last` (wandb-core writes it a moment after finish)."""
    run_file = next(folder.glob("run-*.wandb"))
    deadline = time.time() + 60
    while True:
        by_key: dict[str, dict[int, dict]] = {}
        for rec in file_records(run_file):
            if rec.WhichOneof("record_type") != "history":
                continue
            items: dict = {}
            for i in rec.history.item:  # a media value comes as its fields: nested keys (key, field)
                key, *inner = list(i.nested_key) or [i.key]
                if inner:
                    items.setdefault(key, {})[inner[0]] = json.loads(i.value_json)
                else:
                    items[key] = json.loads(i.value_json)
            for key, value in items.items():
                by_key.setdefault(key, {})[items["_step"]] = value
        if last in by_key.get("_step", {}) or time.time() > deadline:
            return by_key
        time.sleep(0.2)


def table_rows(folder: Path, value: dict) -> list[list]:
    assert value["_type"] == "table-file"
    table = json.loads((folder / "files" / value["path"]).read_text())
    assert table["columns"] == ["step", "prompt", "text"]
    return table["data"]


def reference_text(ckpt: dict, tok, prompt: str, seed: int, n: int) -> str:
    """nanoGPT's uncached sampling loop at temperature 0.8 (top-k 200 keeps the whole 66-token vocabulary),
    written here without model/generate.py: what the checkpoint's model writes after `prompt`, up to an
    end-of-text token if it draws one."""
    model = GPT(GPTConfig(**ckpt["model_config"])).eval()
    model.load_state_dict(ckpt["model"])
    g = torch.Generator().manual_seed(seed)
    idx = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        for _ in range(n):
            logits = model(idx[:, -model.config.block_size:])[:, -1, : tok.vocab_size]
            nxt = torch.multinomial(F.softmax(logits.float() / 0.8, dim=-1), 1, generator=g)
            idx = torch.cat([idx, nxt], dim=1)
    new = idx[0, len(tok.encode(prompt)):].tolist()
    return tok.decode(new[: new.index(tok.eot)] if tok.eot in new else new)


def char_tok(data_root: Path):
    from data import tokenizer_from_meta

    return tokenizer_from_meta(char_entry(data_root))


@functools.lru_cache(maxsize=None)
def char_entry(data_root: Path) -> dict:
    return tokenizer_entry(load_meta(prepare_data(DataConfig(tokenizer="char", root=str(data_root)), progress=False)))


# ------------------------------------------------------------------------------------------ when

def test_samples_and_maps_are_due_at_each_interval_and_at_the_last_step_ceil_n_over_k_times():
    cadence = Cadence(max_iters=10, log=5, eval=5, sample=4, inspect=3)
    due = [cadence.after(s, stopping=False) for s in range(1, 11)]
    assert [s for s, d in enumerate(due, 1) if d.sample] == [4, 8, 10]  # ceil(10 / 4) = 3 rounds
    assert [s for s, d in enumerate(due, 1) if d.inspect] == [3, 6, 9, 10]  # ceil(10 / 3) = 4
    # each of them logs (the loop checks the weights for NaNs before it logs), besides every 5th step
    assert [s for s, d in enumerate(due, 1) if d.log] == [3, 4, 5, 6, 8, 9, 10]
    off = [Cadence(max_iters=10, log=5, eval=5).after(s, stopping=False) for s in range(1, 11)]
    assert not any(d.sample or d.inspect for d in off)


# ------------------------------------------------------------------------------------ what is logged

def test_an_offline_wandb_run_holds_the_sample_table_and_the_pictures_at_the_intervals_asked_for(tmp_path, data_root,
                                                                                                 capsys):
    out = tmp_path / "out"
    res = run(out, data_root, "--wandb.mode=offline", "--train.max_iters=6", "--train.eval_interval=6",
              "--eval.sample_interval=4", f"--eval.sample_tokens={TOKENS}", '--eval.sample_prompts=["ROMEO:"]',
              "--eval.inspect_interval=3")
    (folder,) = sorted((out / "wandb").glob(f"offline-run-*-{res['wandb_run_id']}*"))
    media = wandb_media(folder, 6)
    # the table at 4 and at 6 (the last step), each time every row so far; the same rows as metrics.jsonl's
    assert sorted(media["samples"]) == [4, 6]
    expected = [[step, s["prompt"], s["text"]] for step, rows in sample_records(out).items() for s in rows]
    assert [r[0] for r in expected] == [4, 6] and all(r[1] == "ROMEO:" for r in expected)
    assert table_rows(folder, media["samples"][4]) == expected[:1]
    assert table_rows(folder, media["samples"][6]) == expected
    # the text at step 6 is what the final weights write with train.seed's generator
    tok = char_tok(data_root)
    assert expected[1][2] == reference_text(load_checkpoint(out), tok, "ROMEO:", 1337, TOKENS)
    assert f"iter 6: sample 1/1:\nROMEO:{expected[1][2]}\n" in capsys.readouterr().out
    # the pictures at 3 and 6: in wandb (its copies of the files on disk) and under out/inspect/step-N/
    for key in ("inspect/attention", "inspect/surprisal"):
        assert sorted(media[key]) == [3, 6]
        for step, value in media[key].items():
            assert value["_type"] == "image-file"
            png = (out / "inspect" / f"step-{step}" / f"{key.split('/')[1]}.png").read_bytes()
            assert png.startswith(b"\x89PNG\r\n\x1a\n") and (folder / "files" / value["path"]).read_bytes() == png
    assert sorted(media["inspect/surprisal_html"]) == [3, 6]
    html = (out / "inspect" / "step-6" / "surprisal.html").read_text()
    assert "Surprisal at iter 6" in html
    bits = {r["iter"]: r["inspect/bits_per_token"] for r in records(out) if "inspect/bits_per_token" in r}
    assert sorted(bits) == [3, 6] and bits[6] == pytest.approx(media["inspect/bits_per_token"][6])
    # the snippet is the val split's first block_size (32) tokens: its mean surprisal, by hand from the weights
    from prepared_files import read_split

    val = torch.tensor(read_split(prepare_data(DataConfig(tokenizer="char", root=str(data_root)), progress=False),
                                  "val")[:32], dtype=torch.long)
    model = GPT(GPTConfig(**load_checkpoint(out)["model_config"])).eval()
    model.load_state_dict(load_checkpoint(out)["model"])
    with torch.no_grad():
        nats = F.cross_entropy(model(val[None, :-1])[0], val[1:]).item()
    assert bits[6] == pytest.approx(nats / math.log(2), rel=1e-4)


def test_a_resumed_runs_sample_table_equals_the_uninterrupted_runs(tmp_path, data_root):
    """The process dies after step 5 (it logged the samples of step 4) with its checkpoint at 3: the resumed
    run samples 4 again, and its table holds the same rows at the same steps as the run never interrupted."""
    common = ("--wandb.mode=offline", "--train.max_iters=8", "--train.checkpoint_interval=3",
              "--train.eval_interval=100", "--model.dropout=0.1", "--eval.sample_interval=2",
              f"--eval.sample_tokens={TOKENS}")
    full = run(tmp_path / "full", data_root, *common)
    out = tmp_path / "resumed"
    with inject(crash_at=5), pytest.raises(InjectedCrash):
        run(out, data_root, *common)
    assert load_checkpoint(out)["train"]["iter"] == 3 and sorted(sample_records(out)) == [2, 4]
    resumed = run(out, data_root, *common)
    assert sample_records(out) == sample_records(tmp_path / "full")
    assert sorted(sample_records(out)) == [2, 4, 6, 8]
    texts = [s["text"] for rows in sample_records(out).values() for s in rows]
    assert len(set(texts)) > 2  # the model changes between rounds (a constant text would prove nothing)
    tables = []
    for res, root in ((full, tmp_path / "full"), (resumed, out)):
        folder = sorted((root / "wandb").glob(f"offline-run-*-{res['wandb_run_id']}*"))[-1]
        media = wandb_media(folder, 8)
        tables.append(table_rows(folder, media["samples"][max(media["samples"])]))
    assert tables[0] == tables[1] and [r[0] for r in tables[0]] == [2, 2, 4, 4, 6, 6, 8, 8]  # 2 default prompts


REPLAY = """
import sys
sys.path.insert(0, sys.argv[1])
from training.report.wandb_logger import WandbLogger
history = [{"iter": 2, "train/loss": 1.5, "samples": [{"prompt": "ROMEO:", "text": "hi"}], "elapsed_s": 3.0}]
logger = WandbLogger(mode="offline", project="p", run_name="", run_id="replay01", out_dir=sys.argv[2], config={},
                     history=history)
logger.log_table("samples", ["step", "prompt", "text"], [[2, "ROMEO:", "hi"], [3, "ROMEO:", "ho"]], 3)
logger.end_step()  # (the loop's: step 3 whole)
logger.finish()
"""


def test_a_replayed_metrics_record_sends_its_numbers_and_leaves_its_samples_to_the_table(tmp_path):
    """A resumed run sends wandb the records of metrics.jsonl it lacks: their numbers are charted, their samples
    (a list) are not; the table holds them, logged whole at the next round. (In a process of its own: wandb's
    service is started fresh, as a run starts it.)"""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"} | {"WANDB_MODE": "offline"}
    r = warm_runs.run(["-c", REPLAY, ROOT, tmp_path], env=env)
    assert r.returncode == 0 and "warning" not in r.stdout + r.stderr, r.stdout + r.stderr
    (folder,) = sorted((tmp_path / "wandb").glob("offline-run-*-replay01*"))
    media = wandb_media(folder, 3)
    assert media["train/loss"] == {2: 1.5} and media["elapsed_s"] == {2: 3.0}
    assert sorted(media["samples"]) == [3] and table_rows(folder, media["samples"][3])[0] == [2, "ROMEO:", "hi"]


def test_samples_and_maps_leave_the_training_trajectory_bit_for_bit(tmp_path, data_root):
    """With dropout (the run's RNG stream in every step) and a sample and a map after every step: the same
    losses, weights, optimizer moments and RNG streams as a run without them."""
    common = ("--train.max_iters=6", "--model.dropout=0.1", "--train.eval_interval=3")
    plain = run(tmp_path / "plain", data_root, *common)
    shown = run(tmp_path / "shown", data_root, *common, "--eval.sample_interval=1", f"--eval.sample_tokens={TOKENS}",
                "--eval.inspect_interval=2")
    assert sorted(sample_records(tmp_path / "shown")) == list(range(1, 7))
    assert shown["losses"] == plain["losses"] and shown["eval"] == plain["eval"]
    a, b = load_checkpoint(tmp_path / "plain"), load_checkpoint(tmp_path / "shown")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for sa, sb in zip(a["optimizer"]["optimizers"], b["optimizer"]["optimizers"]):
        for i in sa["state"]:
            assert all(torch.equal(sa["state"][i][k], sb["state"][i][k]) for k in sa["state"][i])
    ra, rb = a["rng"]["ranks"][0], b["rng"]["ranks"][0]
    assert torch.equal(ra["torch"], rb["torch"]) and ra["python"] == rb["python"] and ra["numpy"] == rb["numpy"]


def test_weights_gone_non_finite_stop_the_run_in_one_line_before_any_sample_or_map_is_drawn(tmp_path, data_root,
                                                                                             capsys):
    """Sampling from NaN weights would fail inside torch.multinomial with a traceback: a step that samples or
    draws logs too, and the loop's guard stops the run before anything runs the poisoned model."""
    from errors import run_cli

    argv = tiny_argv(tmp_path / "out", data_root, "--train.max_iters=6", "--train.log_interval=100",
                     "--train.eval_interval=100", "--eval.sample_interval=3", "--eval.inspect_interval=3")
    with inject(nan_at=1), pytest.raises(SystemExit) as ei:
        run_cli(lambda: train_cli.main(argv))
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert ei.value.code == 2 and len(errors) == 1 and "Traceback" not in captured.err, captured.err[-2000:]
    assert "sample 1/" not in captured.out and not (tmp_path / "out" / "inspect").exists()


# ---------------------------------------------------------------------------------------- bad values

def test_a_prompt_the_char_vocabulary_lacks_is_one_line_before_the_model_is_built(tmp_path, data_root, monkeypatch):
    monkeypatch.setattr(chain, "build_model", lambda *a, **k: pytest.fail("the model was built"))
    with pytest.raises(UserError) as e:
        run(tmp_path / "out", data_root, "--eval.sample_interval=2", '--eval.sample_prompts=["ROMEO:", "JULIÉT☃"]')
    assert str(e.value).startswith("eval.sample_prompts: prompt 2 ('JULIÉT☃') cannot be encoded by the char tokenizer: "
                                   "2 character(s) not in the char vocabulary")
    assert "\n" not in str(e.value)


VOCAB_TEXT = st.text(alphabet="ROMEJULIT: \nabc", min_size=1, max_size=12)
NOT_AN_INT = st.one_of(st.none(), st.just("abc"), st.lists(st.integers(), max_size=1))
BAD_PROMPT = st.one_of(st.just(""), st.text(alphabet="é☃\t{}", min_size=1, max_size=4), st.integers(-3, 3), st.none(),
                       st.booleans(), st.lists(VOCAB_TEXT, max_size=2), st.just("x" * 1001))
VALID = {"sample_interval": st.one_of(st.integers(0, 50), st.just(2**70)),
         "inspect_interval": st.one_of(st.integers(0, 50), st.just(2**70)),
         "sample_tokens": st.integers(1, 1024),
         "sample_prompts": st.one_of(st.lists(VOCAB_TEXT, max_size=3), VOCAB_TEXT)}
BAD = {"sample_interval": st.one_of(st.integers(-3, -1), NOT_AN_INT),
       "inspect_interval": st.one_of(st.integers(-3, -1), NOT_AN_INT),
       "sample_tokens": st.one_of(st.integers(-3, 0), st.integers(1025, 10**6), st.just(2**70), NOT_AN_INT),
       "sample_prompts": st.one_of(BAD_PROMPT, st.lists(st.one_of(VOCAB_TEXT, BAD_PROMPT), min_size=1, max_size=4),
                                   st.lists(VOCAB_TEXT, min_size=17, max_size=18))}


@st.composite
def showcase_settings(draw) -> dict:
    """The four keys, none to two of them drawn from values that may be bad (the test's oracle judges)."""
    broken = draw(st.sets(st.sampled_from(sorted(VALID)), max_size=2))
    return {k: draw((BAD if k in broken else VALID)[k]) for k in VALID}


def expected_problems(values: dict, vocab: str) -> set[str]:
    """The keys this test's own rules refuse (none: all valid); a lone string is one prompt; the prompts'
    characters must be in the vocabulary only when sampling is on."""
    bad = {key for key, low, high in (("sample_interval", 0, None), ("inspect_interval", 0, None),
                                      ("sample_tokens", 1, 1024))
           if type(values[key]) is not int or values[key] < low or (high is not None and values[key] > high)
           or values[key] >= 2**63}  # every int key: at most 64 bits (settings.py)
    prompts = values["sample_prompts"]
    # a lone string is one prompt, except "": the empty list, the key's default (config_io's _coerce_list)
    prompts = ([] if not prompts.strip() else [prompts]) if isinstance(prompts, str) else prompts
    if not isinstance(prompts, list) or len(prompts) > 16 or any(type(p) is not str or not p or len(p) > 1000
                                                                  for p in prompts):
        bad.add("sample_prompts")
    elif not bad and values["sample_interval"] and any(set(p) - set(vocab) for p in prompts):
        bad.add("sample_prompts")
    return bad


@given(values=showcase_settings(),
       entry=st.sampled_from(["yaml", "cli"]))
def test_any_showcase_setting_is_accepted_as_valid_or_refused_in_one_line_naming_its_key(tmp_path, data_root, values,
                                                                                          entry):
    """Every entry point that takes these keys (a YAML config, --eval.key=value, where a list is written as
    YAML's flow list) then the run's check of the prompts against the tokenizer: valid values build a
    Showcase, anything else is a one-line UserError naming the key, and never any other exception."""
    vocab = char_entry(data_root)["chars"]
    if entry == "yaml":
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({"eval": values}))
        argv = ["--config", str(path)]
    else:
        if not isinstance(values["sample_prompts"], list):  # one string on the command line is one prompt
            values["sample_prompts"] = [values["sample_prompts"]]
        argv = [f"--eval.{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in values.items()]
    bad = expected_problems(values, vocab)
    try:
        cfg = load_config(argv)
        showcase = build_showcase(cfg, char_entry(data_root))
    except UserError as e:
        assert bad, f"refused valid values: {e}"
        assert "\n" not in str(e) and any(f"eval.{k}" in str(e) for k in bad), (str(e), bad)
        event(f"refused: {sorted(bad)}")
        return
    event("accepted")
    assert not bad, f"accepted bad values of {bad}: {values}"
    if cfg.eval.sample_interval:
        given = values["sample_prompts"]
        given = ([given] if given.strip() else []) if isinstance(given, str) else given  # "": the default
        assert [t for t, _ in showcase.prompts] == (given or ["ROMEO:", "JULIET:"])


def char_entry_of_a_newline() -> dict:
    return {"tokenizer": "char", "chars": "\n abc"}


def test_a_default_prompt_the_vocabulary_lacks_starts_from_the_end_of_text(tmp_path):
    """Another char corpus (no new line in it): the default prompt, a new line, becomes the EOT token."""
    cfg = load_config(["--eval.sample_interval=5", f"--data.dataset={tmp_path / 'abc.txt'}", "--data.tokenizer=char"])
    (prompt,) = build_showcase(cfg, {"tokenizer": "char", "chars": " abc"}).prompts
    assert prompt == ("<|endoftext|>", [4])  # the char tokenizer's EOT id, after its 4 characters
    (shakespeare,) = build_showcase(cfg, char_entry_of_a_newline()).prompts
    assert shakespeare == ("\n", [0])  # a vocabulary with a new line: sample.py's default prompt


# ------------------------------------------------------------------------------------------ ranks

@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_sample_and_draw_at_the_intervals_and_finish(tmp_path, data_root, parallel):
    """Under FSDP every rank takes part in each forward: a rank that skipped the samples' forwards would
    leave the other waiting in an all-gather. Rank 0 alone writes the text, the same as one plain rank's (no
    time budget timing the step first, no inspections: neither may move the trajectory)."""
    extra = ("--model.dropout=0.0", f"--train.parallel={parallel}", "--eval.sample_interval=4",
             f"--eval.sample_tokens={TOKENS}")
    r = two_ranks(multirank_argv(tmp_path / "two", data_root, *extra, "--eval.inspect_interval=8",
                                 "--train.time_budget=10m"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("iter 4: sample 1/2:") == 1 and ", samples " in r.stdout  # rank 0's; the budget timed it
    assert sorted(sample_records(tmp_path / "two")) == [4, 8]
    assert (tmp_path / "two" / "inspect" / "step-8" / "attention.png").is_file()
    one = loop.train(load_config(multirank_argv(tmp_path / "one", data_root, *extra)))
    assert one["iter"] == 8
    assert sample_records(tmp_path / "two") == sample_records(tmp_path / "one")


def test_a_prompt_in_brackets_stays_one_string_and_an_empty_one_means_the_default():
    from training.config.sections import load_config

    assert load_config(["--eval.sample_prompts=[Enter ROMEO]"]).eval.sample_prompts == ["[Enter ROMEO]"]
    assert load_config(['--eval.sample_prompts=["ROMEO:", "JULIET:"]']).eval.sample_prompts == ["ROMEO:", "JULIET:"]
    assert load_config(["--eval.sample_prompts="]).eval.sample_prompts == []  # the data's default prompts
