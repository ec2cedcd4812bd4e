"""eval/hellaswag.py: the scores equal transformers' GPT-2 run one (context, ending) pair at a time;
batching, sharding and the HF datasets path change nothing; every bad input is one error line."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from errors import run_cli
from eval import hellaswag
from eval.hellaswag import evaluate_hellaswag, hellaswag_metrics, load_items, score_items
from model import GPT, GPTConfig
from checkpoint import load_model, save_checkpoint
from runtime.precision import autocast
import warm_runs

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
BLOCK = 48  # n_positions of the tiny model: item 3's context is longer, so it gets cropped




@pytest.fixture(scope="module")
def data_path(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("hs") / "hellaswag_val.jsonl", ITEMS)


@pytest.fixture(scope="module")
def hf_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=BLOCK, vocab_size=50257)).eval()
    with torch.no_grad():  # peaky logits and non-zero biases: the endings' scores are far apart
        for name, p in hf.named_parameters():
            p.normal_(0.0, 0.3 if p.dim() == 2 else 0.05)
    return hf


@pytest.fixture(scope="module")
def hf_dir(hf_model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf")
    hf_model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def ours(hf_dir):
    """Our model and tokenizer, loaded through the HF directory as the CLI loads it."""
    from data import tokenizer_from_meta

    loaded = load_model(str(hf_dir), dropout=0.0)
    return loaded.model, tokenizer_from_meta(loaded.tokenizer)


@pytest.fixture(scope="module")
def reference(hf_model):
    """transformers' GPT-2, each (context, ending) pair alone and unpadded: (sum, mean) log-probs (6, 4)."""
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")
    sums, means = torch.zeros(len(ITEMS), 4), torch.zeros(len(ITEMS), 4)
    for i, item in enumerate(ITEMS):
        ctx = enc.encode(item["ctx"])
        for j, ending in enumerate(item["endings"]):
            end = enc.encode(" " + ending)
            ids = (ctx + end)[-BLOCK:]  # a long context loses its start; the ending stays whole
            with torch.no_grad():
                logits = hf_model(torch.tensor([ids])).logits[0].double()  # (T, V)
            logp = torch.log_softmax(logits, dim=-1)
            # the k-th ending token sits at position len(ids) - len(end) + k, predicted one position earlier
            picked = [logp[len(ids) - len(end) + k - 1, t] for k, t in enumerate(end)]
            sums[i, j] = sum(picked)
            means[i, j] = sum(picked) / len(end)
    return sums, means


def test_fixture_has_a_context_longer_than_the_block(ours):
    _, tok = ours
    assert len(tok.encode(ITEMS[3]["ctx"])) > BLOCK  # so the cropping path is exercised


def test_scores_and_choices_equal_transformers_one_pair_at_a_time(ours, data_path, reference):
    model, tok = ours
    ref_sum, ref_mean = reference
    scores = score_items(model, load_items(data_path), tok, batch_size=4)
    torch.testing.assert_close(scores.sum_logprob, ref_sum, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(scores.mean_logprob, ref_mean, atol=1e-4, rtol=1e-5)
    # the choices: the endings' scores are well apart, so float noise can't flip an argmax
    for ref in (ref_sum, ref_mean):
        top2 = ref.topk(2, dim=1).values
        assert (top2[:, 0] - top2[:, 1]).min() > 1e-3
    assert scores.pred.tolist() == ref_sum.argmax(1).tolist()
    assert scores.pred_norm.tolist() == ref_mean.argmax(1).tolist()
    # acc and acc_norm disagree on at least one item here, so the two are really told apart
    assert ref_sum.argmax(1).tolist() != ref_mean.argmax(1).tolist()

    labels = torch.tensor([it["label"] for it in ITEMS])
    counts = evaluate_hellaswag(model, load_items(data_path), tok, batch_size=4)
    assert counts == {"correct": int((ref_sum.argmax(1) == labels).sum()),
                      "correct_norm": int((ref_mean.argmax(1) == labels).sum()), "total": 6}


def test_batched_padded_scores_equal_one_item_at_a_time(ours, data_path):
    model, tok = ours
    items = load_items(data_path)
    alone = score_items(model, items, tok, batch_size=1)
    batched = score_items(model, items, tok, batch_size=len(items))  # 24 rows of different lengths, left-padded
    torch.testing.assert_close(batched.sum_logprob, alone.sum_logprob, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batched.mean_logprob, alone.mean_logprob, atol=1e-5, rtol=1e-5)


def test_an_ending_longer_than_the_block_is_cropped_and_scored_like_transformers(ours, hf_model):
    import tiktoken

    model, tok = ours
    long_ending = "and then " * 30  # ~60 tokens > BLOCK
    item = hellaswag.Item("He", ("stops.", long_ending, "runs.", "sits."), 0)
    scores = score_items(model, [item], tok)
    end = tiktoken.get_encoding("gpt2").encode(" " + long_ending)
    assert len(end) > BLOCK
    ids = end[-BLOCK:]  # the window: the last BLOCK tokens; its first one has no predecessor to score it
    with torch.no_grad():
        logp = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].double(), dim=-1)
    picked = [logp[k - 1, ids[k]] for k in range(1, BLOCK)]
    assert scores.sum_logprob[0, 1].item() == pytest.approx(float(sum(picked)), abs=1e-4)
    assert scores.mean_logprob[0, 1].item() == pytest.approx(float(sum(picked)) / (BLOCK - 1), abs=1e-4)


def test_sharded_counts_add_up_to_the_unsharded_counts(ours, data_path):
    model, tok = ours
    items = load_items(data_path)
    whole = evaluate_hellaswag(model, items, tok, batch_size=2)
    for world_size in (2, 4, 8):  # 8 > 6 items: two ranks get nothing
        shards = [evaluate_hellaswag(model, items, tok, batch_size=2, rank=r, world_size=world_size)
                  for r in range(world_size)]
        assert {k: sum(s[k] for s in shards) for k in whole} == whole
    assert hellaswag_metrics(whole) == {"hellaswag/acc": whole["correct"] / 6,
                                        "hellaswag/acc_norm": whole["correct_norm"] / 6}
    as_tensors = {k: torch.tensor(v) for k, v in whole.items()}  # as all_reduce leaves them
    assert hellaswag_metrics(as_tensors) == hellaswag_metrics(whole)


def test_evaluation_restores_the_training_mode(ours, data_path):
    model, tok = ours
    model.train()
    evaluate_hellaswag(model, load_items(data_path, limit=1), tok)
    assert model.training
    model.eval()


def test_hf_datasets_path_gives_the_same_items_and_result_as_the_jsonl(ours, data_path, monkeypatch):
    import datasets

    model, tok = ours
    calls = []
    columns = {k: [it[k] for it in ITEMS] for k in ITEMS[0]}
    columns["label"] = [str(it["label"]) for it in ITEMS]  # the HF copy stores labels as strings

    def fake_load_dataset(path, *args, **kwargs):
        calls.append((path, kwargs.get("split")))
        return datasets.Dataset.from_dict(columns)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    from_hf = load_items(None)
    assert calls == [("Rowan/hellaswag", "validation")]
    assert from_hf == load_items(data_path)
    assert evaluate_hellaswag(model, from_hf, tok, batch_size=3) == evaluate_hellaswag(model, load_items(data_path), tok)
    assert load_items(None, limit=2) == from_hf[:2]


# ------------------------------------------------------------------------------------------- CLI

def run(argv, capsys):
    """The CLI in-process through run_cli -> (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        run_cli(lambda: hellaswag.main([str(a) for a in argv]))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def run_script(argv):
    return warm_runs.run(["-m", "eval.hellaswag", *argv], cwd=ROOT, env=ENV)


def test_cli_prints_acc_and_acc_norm_of_the_reference_choices(hf_dir, data_path, reference, capsys):
    ref_sum, ref_mean = reference
    labels = torch.tensor([it["label"] for it in ITEMS])
    code, out, err = run(["--checkpoint", hf_dir, "--data", data_path, "--batch-size", "4", "--device", "cpu"], capsys)
    assert code == 0, err
    acc = (ref_sum.argmax(1) == labels).float().mean().item()
    acc_norm = (ref_mean.argmax(1) == labels).float().mean().item()
    assert out.strip().splitlines() == [  # ours beside chance and GPT-2 124M's published figures
        f"this model (6 items)    acc {acc:.4f}  acc_norm {acc_norm:.4f}",
        "chance                  acc 0.2500  acc_norm 0.2500",
        "GPT-2 124M (published)  acc 0.2859  acc_norm 0.2955"]
    code, out, _ = run(["--checkpoint", hf_dir, "--data", data_path, "--limit", "2"], capsys)
    assert code == 0 and out.startswith("this model (2 items) ")
    code, out, _ = run(["--checkpoint", hf_dir, "--data", data_path, "--json"], capsys)
    result = json.loads(out)
    assert code == 0 and result["items"] == 6 and result["acc"] == pytest.approx(acc)
    assert result["acc_norm"] == pytest.approx(acc_norm) and result["model"]
    assert result["references"] == {"chance": {"acc": 0.25, "acc_norm": 0.25},
                                    "GPT-2 124M (published)": {"acc": 0.2859, "acc_norm": 0.2955}}


def test_missing_data_path_in_a_subprocess_is_one_error_line(hf_dir, tmp_path):
    r = run_script(["--checkpoint", hf_dir, "--data", tmp_path / "nope.jsonl"])
    one_error_line(r.returncode, r.stderr, "nope.jsonl", "does not exist", "--data")


@pytest.mark.parametrize("change, words", [
    (lambda it: it.update(endings=it["endings"][:3]), ["line 2", "expected 4 endings, got 3"]),
    (lambda it: it.update(label=4), ["line 2", "label must be 0..3, got 4"]),
    (lambda it: it.update(label="x"), ["line 2", "label must be 0..3"]),
    (lambda it: it.update(label=True), ["line 2", "label"]),
    (lambda it: it.update(ctx=None), ["line 2", "ctx"]),
    (lambda it: it.update(endings=["a", "b", 3, "d"]), ["line 2", "not a string"]),
    (lambda it: it.update(endings=["", "", "", ""]), ["line 2", "ending 0 is empty"]),  # scored acc 1.0 before
    (lambda it: it.update(endings=["a", "b", "  ", "d"]), ["line 2", "ending 2 is empty"]),
])
def test_malformed_item_is_one_error_line_naming_its_line(hf_dir, tmp_path, capsys, change, words):
    records = json.loads(json.dumps(ITEMS[:3]))
    change(records[1])
    path = write_jsonl(tmp_path / "bad.jsonl", records)
    code, _, err = run(["--checkpoint", hf_dir, "--data", path], capsys)
    one_error_line(code, err, *words)


def test_a_line_that_is_not_json_is_one_error_line(hf_dir, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ITEMS[0]) + "\n{not json\n", encoding="utf-8")
    code, _, err = run(["--checkpoint", hf_dir, "--data", path], capsys)
    one_error_line(code, err, "line 2", "not valid JSON")


def test_malformed_hf_row_names_its_row(monkeypatch):
    import datasets

    columns = {"ctx": ["a", "b"], "endings": [["1", "2", "3", "4"], ["1", "2", "3", "4"]], "label": ["0", ""]}
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict(columns))
    with pytest.raises(hellaswag.UserError, match="Rowan/hellaswag validation row 1: label"):
        load_items(None)


def test_unreachable_hub_for_the_data_is_one_error_line(hf_dir, monkeypatch, capsys):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'Rowan/hellaswag' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    code, _, err = run(["--checkpoint", hf_dir], capsys)
    one_error_line(code, err, "Rowan/hellaswag", "--data")


def test_char_level_checkpoint_is_refused_in_one_line(tmp_path, data_path):
    config = GPTConfig(vocab_size=40, block_size=32, n_layer=1, n_head=2, n_embd=16)
    chars = "".join(sorted(set(" .abcdefghijklmnopqrstuvwxyz")))
    save_checkpoint(tmp_path / "ckpt.pt", {
        "model": GPT(config).state_dict(), "model_config": dataclasses.asdict(config), "config": {},
        "tokenizer": {"tokenizer": "char", "chars": chars}, "iter": 0,
    })
    r = run_script(["--checkpoint", tmp_path, "--data", data_path])
    one_error_line(r.returncode, r.stderr, "character-level", "gpt2 tokenizer")


def test_missing_checkpoint_is_one_error_line(tmp_path, data_path, capsys):
    code, _, err = run(["--checkpoint", tmp_path / "nope.pt", "--data", data_path], capsys)
    one_error_line(code, err, "nope.pt", "does not exist")


@pytest.mark.parametrize("argv, words", [
    (["--limit", "0"], ["--limit"]),
    (["--batch-size", "0"], ["--batch-size"]),
    (["--device", "tpu"], ["--device"]),
    (["--dtype", "int8"], ["--dtype"]),
    (["--batch-size", "x"], ["--batch-size"]),
])
def test_bad_options_are_one_error_line(hf_dir, data_path, capsys, argv, words):
    code, _, err = run(["--checkpoint", hf_dir, "--data", data_path, *argv], capsys)
    one_error_line(code, err, *words)


def test_no_checkpoint_option_is_one_error_line(capsys):
    code, _, err = run([], capsys)
    one_error_line(code, err, "--checkpoint")


def test_bfloat16_autocast_on_cpu_gives_close_scores(ours, data_path, reference):
    model, tok = ours
    scores = score_items(model, load_items(data_path), tok, batch_size=6,
                         autocast_ctx=lambda: autocast(torch.device("cpu"), torch.bfloat16))
    torch.testing.assert_close(scores.mean_logprob, reference[1], atol=0.15, rtol=0.05)


def test_data_from_dev_zero_is_refused_after_a_bounded_read_in_one_line(hf_dir, capsys):
    code, out, err = run(["--checkpoint", hf_dir, "--data", "/dev/zero"], capsys)
    one_error_line(code, err, "/dev/zero", "larger than 256 MiB")
    assert "batch size" not in err and out == ""


from hypothesis import given, strategies as st  # noqa: E402
from hellaswag_items import ITEMS, write_jsonl
from cli_lines import one_error_line

LABELS = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats() | st.text(max_size=6)
    | st.integers(1, 6000).map(lambda n: "1" * n) | st.sampled_from(["²", "٢", "+1", "-0", " 2 ", "1.0", "01", "2\n"])
    | st.builds(lambda s, n, w: w + s + "1" * n + w, st.sampled_from(["", "+", "-"]), st.integers(1, 5000),
                st.sampled_from(["", " ", "\t"])),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner, max_size=2), max_leaves=3)


def every_reader(record: dict, tmp_path_factory, monkeypatch) -> tuple:
    """load_items of `record` as each source gives it: a --data .jsonl line, and the HF copy (datasets faked)."""
    path = tmp_path_factory.mktemp("item") / "item.jsonl"
    path.write_text(json.dumps(record) + "\n")
    datasets = type(sys)("datasets")
    datasets.load_dataset = lambda *a, **k: [record]
    monkeypatch.setitem(sys.modules, "datasets", datasets)
    monkeypatch.setattr(hellaswag, "hub_offline_unless_reachable", lambda: None)
    return lambda: load_items(path), lambda: load_items(None)


@given(label=LABELS)
def test_any_label_is_its_index_or_one_short_error_line_from_every_reader(label, tmp_path_factory, monkeypatch):
    """Before: a label string of 4301 digits went to int() and was a ValueError traceback."""
    record = {"ctx": "a", "endings": ["b", "c", "d", "e"], "label": label}
    ok = (not isinstance(label, bool) and isinstance(label, int) and 0 <= label <= 3) or (
        isinstance(label, str) and label.strip() in ("0", "1", "2", "3"))
    for read in every_reader(record, tmp_path_factory, monkeypatch):
        if ok:
            assert read()[0].label == int(str(label).strip())
            continue
        with pytest.raises(hellaswag.UserError) as e:
            read()
        message = str(e.value)
        assert "\n" not in message and "label must be 0..3, got " in message and len(message) < 300, message


TEXTS = st.text(max_size=5) | st.sampled_from(["\ud800", "a\udfffb", "ok \ud83d", "\U0001f600"])  # (lone surrogates)
ENDINGS = LABELS | st.lists(TEXTS, min_size=4, max_size=4) | st.dictionaries(TEXTS, TEXTS, max_size=4) | TEXTS


@given(ctx=LABELS | TEXTS, endings=ENDINGS)
def test_any_ctx_and_endings_are_an_item_or_one_short_error_line_from_every_reader(ctx, endings, tmp_path_factory,
                                                                                    monkeypatch):
    """Before: endings as an object said "expected 4 endings, got no list of", and a lone surrogate (JSON's
    "\\ud800", valid JSON and no text) in ctx or an ending was scored, where a chat row's is refused."""
    record = {"ctx": ctx, "endings": endings, "label": 0}
    texts = [ctx, *endings] if isinstance(endings, list) else [ctx]
    ok = (isinstance(ctx, str) and isinstance(endings, list) and len(endings) == 4
          and all(isinstance(e, str) and e.strip() for e in endings)
          and all(not any(0xD800 <= ord(c) <= 0xDFFF for c in t) for t in texts if isinstance(t, str)))
    for read in every_reader(record, tmp_path_factory, monkeypatch):
        if ok:
            item = read()[0]
            assert (item.ctx, list(item.endings)) == (ctx, endings)
            continue
        with pytest.raises(hellaswag.UserError) as e:
            read()
        message = str(e.value)
        assert "\n" not in message and len(message) < 400 and "no list of" not in message, message
        assert any(w in message for w in ("ctx", "endings", "ending")), message
