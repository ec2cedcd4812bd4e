"""train.py end to end on tiny models: loss falls, exact resume, SIGTERM, NaN guard, mixed precision,
DDP (gloo) vs one rank, init_from, no host syncs per micro-step, bad-input refusals (wandb: test_train_wandb.py)."""
from __future__ import annotations

import math
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from training import cli as train_cli
from data import BatchLoader, DataConfig, load_meta, prepare_data
from errors import UserError, run_cli
from faults import inject
from model import GPT, GPTConfig
from checkpoint.export import export_hf
from checkpoint import load_checkpoint
from training.config.sections import load_config

from multirank_runs import two_ranks
from tiny_runs import ROOT, _one_thread, as_version_2, run, sub_env, tiny_argv  # noqa: F401 (_one_thread: an autouse fixture)


# ------------------------------------------------------------------------------------------ training

def test_thirty_steps_lower_the_loss_and_write_checkpoints(tmp_path, data_root):
    res = run(tmp_path / "out", data_root)
    losses = res["losses"]
    assert sorted(losses) == list(range(1, 31))
    first, last = sum(losses[i] for i in range(1, 6)) / 5, sum(losses[i] for i in range(26, 31)) / 5
    assert losses[1] > 4.0  # ~ln(65) at init
    assert last < first - 0.5
    assert res["eval"]["iter"] == 30 and res["eval"]["val/loss"] < 3.6  # from ~4.2
    # bpb: loss in nats / ln 2 / bytes per token (char on ASCII text: one byte per token)
    assert res["eval"]["val/bpb"] == pytest.approx(res["eval"]["val/loss"] / math.log(2), rel=1e-3)
    ck = load_checkpoint(tmp_path / "out")
    assert ck["train"]["iter"] == 30 and ck["train"]["tokens_seen"] == 30 * 4 * 32
    meta = load_meta(prepare_data(DataConfig(tokenizer="char", root=str(data_root)), progress=False))
    assert ck["tokenizer"] == {"tokenizer": "char", "chars": meta["chars"]}
    assert ck["model_config"]["vocab_size"] == meta["vocab_size"] and ck["config"]["train"]["max_iters"] == 30
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ck["model"])
    best = load_checkpoint(tmp_path / "out" / "best.pt")
    assert best["train"]["best_val_loss"] == pytest.approx(res["best_val_loss"])
    # the model rebuilds from the checkpoint alone, as sample.py does it
    model = GPT(GPTConfig(**ck["model_config"]))
    model.load_state_dict(ck["model"])


def test_eval_full_gives_the_whole_val_splits_cross_entropy_at_the_last_eval(tmp_path, data_root):
    import json

    import numpy as np
    import torch.nn.functional as F
    from prepared_files import read_split

    res = run(tmp_path / "out", data_root, "--train.max_iters=20", "--train.eval_full=true")
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records if "val/loss_full" in r] == [20]  # the last eval only, not the one at 10
    # reference: the checkpoint's model on every val token once (windows of 32 read from the split's file), through
    # the full logits and F.cross_entropy
    ck = load_checkpoint(tmp_path / "out")
    model = GPT(GPTConfig(**ck["model_config"])).eval()
    model.load_state_dict(ck["model"])
    val = np.array(read_split(prepare_data(DataConfig(tokenizer="char", root=str(data_root)), progress=False), "val"))
    n = (len(val) - 1) // 32
    x, y = torch.from_numpy(val[: n * 32].reshape(n, 32)), torch.from_numpy(val[1 : n * 32 + 1].reshape(n, 32))
    with torch.no_grad():
        expected = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum").item() / (n * 32)
    assert res["eval"]["val/loss_full"] == pytest.approx(expected, rel=1e-5)
    assert records[-1]["val/loss_full"] == res["eval"]["val/loss_full"]
    assert records[-1]["val/bpb_full"] == pytest.approx(expected / math.log(2), rel=1e-3)  # ASCII: a byte a token
    assert res["eval"]["val/loss_full"] != res["eval"]["val/loss"]  # the 4-batch estimate is another number


def test_lr_actually_used_follows_the_hand_computed_schedule(tmp_path, data_root):
    import json

    run(tmp_path / "out", data_root, "--train.max_iters=12", "--train.warmup_iters=4", "--train.lr=1e-3",
        "--train.min_lr=1e-4")
    lrs = {r["iter"]: r["lr"] for r in map(json.loads, (tmp_path / "out" / "metrics.jsonl").read_text().splitlines())
           if "lr" in r}
    # iter i is logged after step i-1 ran: warmup 1e-3 * (s+1)/4, then cosine over steps 4..12
    assert lrs[1] == pytest.approx(2.5e-4) and lrs[4] == pytest.approx(1e-3) and lrs[5] == pytest.approx(1e-3)
    assert lrs[9] == pytest.approx(5.5e-4)  # step 8: halfway through the cosine
    assert lrs[12] == pytest.approx(1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi * 7 / 8)))


def test_interrupted_and_resumed_run_is_bitwise_identical_to_uninterrupted(tmp_path, data_root):
    common = ("--train.max_iters=12", "--train.grad_accum_steps=2", "--model.dropout=0.1", "--train.eval_interval=4")
    full = run(tmp_path / "full", data_root, *common)
    with inject(interrupt_after=5):
        part1 = run(tmp_path / "resumed", data_root, *common)
    assert part1["stopped"] == "SIGINT" and part1["iter"] == 5
    assert load_checkpoint(tmp_path / "resumed")["train"]["iter"] == 5
    part2 = run(tmp_path / "resumed", data_root, *common)  # resume=auto picks ckpt.pt up
    assert sorted(part2["losses"]) == list(range(6, 13))
    # same losses, bit for bit (== on floats), before and after the interruption
    assert {**part1["losses"], **part2["losses"]} == full["losses"]
    a = load_checkpoint(tmp_path / "full")
    b = load_checkpoint(tmp_path / "resumed")
    assert a["train"]["iter"] == b["train"]["iter"] == 12
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["optimizer"]["optimizers"][0]["state"], b["optimizer"]["optimizers"][0]["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    assert torch.equal(a["rng"]["ranks"][0]["torch"], b["rng"]["ranks"][0]["torch"])
    assert a["train"]["best_val_loss"] == b["train"]["best_val_loss"]


def test_a_resumed_bpe_run_keeps_its_weight_gradient_product_and_ends_bitwise_equal(tmp_path, data_root, monkeypatch,
                                                                                    capsys):
    """The weight gradient's product (torch.mm or oneDNN, runtime/loss_path.py) is timed when a run starts
    and saved; a resume keeps it whatever the machine's timing says then, and ends bit for bit equal to the
    uninterrupted run. A checkpoint from before the choice existed resumes with torch.mm, what it ran."""
    import runtime.loss_path
    import training.builders
    from checkpoint import save_checkpoint

    # oneDNN's product, here made with an fp64 sum so that it differs from torch.mm's in the last bits on any
    # CPU (MKL's and oneDNN's own agree bitwise at some shapes)
    monkeypatch.setitem(runtime.loss_path.WEIGHT_GRAD_PRODUCTS, "oneDNN", lambda a, b: (a.double() @ b.double()).float())
    monkeypatch.setattr(training.builders, "choose_weight_grad_product", lambda device, **kw: ("oneDNN", "timed"))
    common = ("--data.tokenizer=gpt2", "--train.max_iters=8", "--train.eval_interval=4", "--model.dropout=0.1")
    full = run(tmp_path / "full", data_root, *common)
    assert load_checkpoint(tmp_path / "full")["plan"]["loss_product"] == "oneDNN"
    for out in ("resumed", "old"):
        with inject(interrupt_after=4):
            run(tmp_path / out, data_root, *common)
    monkeypatch.setattr(training.builders, "choose_weight_grad_product",
                        lambda device, **kw: pytest.fail("a resumed run must not choose again"))
    capsys.readouterr()
    resumed = run(tmp_path / "resumed", data_root, *common)
    assert "LM head's weight gradient by oneDNN (decided when this run started)" in capsys.readouterr().out
    assert {k: v for k, v in full["losses"].items() if k > 4} == resumed["losses"]
    a, b = load_checkpoint(tmp_path / "full")["model"], load_checkpoint(tmp_path / "resumed")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    torch.save(as_version_2(load_checkpoint(tmp_path / "old"), without=("loss_product",)),  # before the choice
               tmp_path / "old" / "ckpt.pt")
    old = run(tmp_path / "old", data_root, *common)
    assert "LM head's weight gradient by torch.mm (decided when this run started)" in capsys.readouterr().out
    ckpt = load_checkpoint(tmp_path / "old")
    assert ckpt["plan"]["loss_product"] == "torch.mm" and old["iter"] == 8
    # the other product: the same run only to the last bits of the weights (AdamW's steps hide it from the losses)
    assert not torch.equal(ckpt["model"]["transformer.wte.weight"], b["transformer.wte.weight"])
    ckpt["plan"]["loss_product"] = [1]  # damaged: one line, not a traceback
    save_checkpoint(tmp_path / "old" / "ckpt.pt", ckpt)
    with pytest.raises(UserError, match=r"its 'plan' entry is malformed \(TypeError: loss_product should be str, got "
                                        r"\[1\]\); use another checkpoint") as e:
        run(tmp_path / "old", data_root, *common, "--train.max_iters=10")
    assert "\n" not in str(e.value)


def test_a_muon_run_saved_before_muon_split_qkv_existed_resumes_as_it_ran(tmp_path, data_root, capsys):
    """A checkpoint whose config lacks a key added since (here train.muon_split_qkv, whose default is now
    true) resumes with the value that reproduces that run (false), says so, and ends bit for bit equal to
    the uninterrupted run; with the new default it would diverge."""
    from checkpoint import save_checkpoint

    common = ("--train.max_iters=8", "--train.eval_interval=4", "--train.optimizer=muon")
    full = run(tmp_path / "full", data_root, *common, "--train.muon_split_qkv=false")
    with inject(interrupt_after=4):
        run(tmp_path / "old", data_root, *common, "--train.muon_split_qkv=false")
    ckpt = load_checkpoint(tmp_path / "old")
    del ckpt["config"]["train"]["muon_split_qkv"]  # as written before the key existed
    save_checkpoint(tmp_path / "old" / "ckpt.pt", ckpt)
    capsys.readouterr()
    resumed = run(tmp_path / "old", data_root, *common)  # today's default: true
    assert "train.muon_split_qkv = False" in capsys.readouterr().out
    assert {k: v for k, v in full["losses"].items() if k > 4} == resumed["losses"]
    assert load_checkpoint(tmp_path / "old")["config"]["train"]["muon_split_qkv"] is False
    a, b = load_checkpoint(tmp_path / "full")["model"], load_checkpoint(tmp_path / "old")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_changed_architecture_and_keeps_the_checkpoint(tmp_path, data_root):
    out = tmp_path / "out"
    run(out, data_root, "--train.max_iters=3")
    before = (out / "ckpt.pt").read_bytes()
    with pytest.raises(UserError, match=r"cannot resume .*model.n_layer: 2 -> 3; .*new --train.out_dir"):
        run(out, data_root, "--train.max_iters=6", "--model.n_layer=3")
    with pytest.raises(UserError, match=r"holds an earlier run's ckpt.pt, best.pt, metrics.jsonl and train.resume=never "
                                        r"refuses to overwrite them"):
        run(out, data_root, "--train.max_iters=6", "--train.resume=never")
    assert (out / "ckpt.pt").read_bytes() == before
    res = run(out, data_root, "--train.max_iters=5", "--train.log_interval=2")  # allowed changes: continues
    assert res["iter"] == 5 and sorted(res["losses"]) == [4, 5]


def test_nan_loss_before_any_checkpoint_says_how_to_rerun_and_the_advice_works(tmp_path, data_root, capsys):
    argv = tiny_argv(tmp_path / "out", data_root, "--train.max_iters=4", "--train.eval_interval=100")
    with inject(nan_at=1), pytest.raises(SystemExit) as ei:
        run_cli(lambda: train_cli.main(argv))
    errors = [l for l in re.split(r"[\r\n]", capsys.readouterr().err) if l.startswith("error:")]
    assert ei.value.code == 2 and len(errors) == 1
    assert "no checkpoint was written, so there is nothing to resume" in errors[0]
    assert f"move {tmp_path / 'out' / 'metrics.jsonl'} away first" in errors[0]
    (tmp_path / "out" / "metrics.jsonl").rename(tmp_path / "diverged.jsonl")  # as the line says; then the rerun runs
    assert run(tmp_path / "out", data_root, "--train.max_iters=4", "--train.eval_interval=100")["iter"] == 4


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, data_root, capsys):
    common = ("--train.max_iters=12", "--train.checkpoint_interval=3", "--train.log_interval=100",
              "--train.eval_interval=100")
    # reference: the same run, stopped cleanly after step 6
    with inject(interrupt_after=6):
        run(tmp_path / "ref", data_root, *common)
    argv = tiny_argv(tmp_path / "out", data_root, *common)
    with inject(nan_at=7), pytest.raises(SystemExit) as ei:
        run_cli(lambda: train_cli.main(argv))
    assert ei.value.code == 2
    stderr = capsys.readouterr().err
    errors = [l for l in re.split(r"[\r\n]", stderr) if l.startswith("error:")]  # tqdm shares stderr
    assert len(errors) == 1 and "Traceback" not in stderr
    assert errors[0].startswith("error: loss or grad norm became non-finite at iter 7; stopped, ")
    assert "ckpt.pt still holds iter 6" in errors[0]
    ck, ref = load_checkpoint(tmp_path / "out"), load_checkpoint(tmp_path / "ref")
    assert ck["train"]["iter"] == 6 and ref["train"]["iter"] == 6
    for k, v in ck["model"].items():
        assert torch.isfinite(v).all(), k
        assert torch.equal(v, ref["model"][k]), k


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_trains_on_cpu(tmp_path, data_root, dtype):
    res = run(tmp_path / "out", data_root, f"--train.dtype={dtype}", "--train.max_iters=25")
    assert res["dtype"] == dtype
    losses = res["losses"]
    assert sum(losses[i] for i in range(21, 26)) / 5 < sum(losses[i] for i in range(1, 6)) / 5 - 0.5
    ck = load_checkpoint(tmp_path / "out")
    if dtype == "float16":
        assert ck["scaler"]["scale"] > 0 and "_growth_tracker" in ck["scaler"]
        # and the fp16 run resumes with its scaler
        res2 = run(tmp_path / "out", data_root, f"--train.dtype={dtype}", "--train.max_iters=27")
        assert res2["iter"] == 27
    else:
        assert ck["scaler"] == {}
    assert all(v.dtype == torch.float32 for v in ck["model"].values())  # autocast: weights stay fp32


def test_dtype_auto_times_the_real_step_in_each_dtype_and_says_what_it_measured(tmp_path, data_root, capsys,
                                                                                 monkeypatch):
    import runtime.precision

    monkeypatch.setattr(runtime.precision, "cpu_native_bf16", lambda: True)  # as on AMX / AVX512-BF16 CPUs
    res = run(tmp_path / "out", data_root, "--train.dtype=auto", "--train.max_iters=2")
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("dtype auto -> "))
    assert re.match(rf"dtype auto -> {res['dtype']}: the model's forward \+ backward took [\d.]+ ms in float32, "
                    r"[\d.]+ ms in bfloat16", line), line
    assert load_checkpoint(tmp_path / "out")["plan"]["dtype"] == res["dtype"]


def test_dtype_auto_is_kept_on_resume_unless_train_dtype_overrides_it(tmp_path, data_root, monkeypatch):
    """A resume under another load must not flip the dtype (bitwise resume needs the same one)."""
    import runtime.precision

    def always(dtype):
        return lambda candidates, run, device, **kw: (dtype, {"float32": 1.0, "bfloat16": 1.0})

    out = tmp_path / "out"
    monkeypatch.setattr(runtime.precision, "cpu_native_bf16", lambda: True)
    monkeypatch.setattr(runtime.precision, "fastest", always(torch.bfloat16))
    with inject(interrupt_after=2):
        assert run(out, data_root, "--train.dtype=auto", "--train.max_iters=6")["dtype"] == "bfloat16"
    monkeypatch.setattr(runtime.precision, "fastest", always(torch.float32))  # the machine now says fp32
    with inject(interrupt_after=2):
        assert run(out, data_root, "--train.dtype=auto", "--train.max_iters=6")["dtype"] == "bfloat16"
    res = run(out, data_root, "--train.dtype=float32", "--train.max_iters=6")  # an explicit choice wins
    assert res["dtype"] == "float32" and load_checkpoint(out)["plan"]["dtype"] == "float32"


def test_compiled_model_saves_plain_state_dict(tmp_path, data_root, monkeypatch):
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **k: real(m, backend="eager"))  # no C++ build in tests
    run(tmp_path / "out", data_root, "--train.compile=true", "--train.max_iters=2")
    keys = load_checkpoint(tmp_path / "out")["model"].keys()
    assert "transformer.wte.weight" in keys and not any("_orig_mod" in k for k in keys)


def test_no_host_sync_per_micro_step(tmp_path, data_root, monkeypatch):
    """The number of .item()/.cpu()/.tolist() calls must not grow with grad_accum_steps."""
    counts = []
    for accum in (1, 4):
        n = {"sync": 0}
        for name in ("item", "cpu", "tolist"):
            real = getattr(torch.Tensor, name)

            def counted(self, *a, _real=real, **k):
                n["sync"] += 1
                return _real(self, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, counted)
        run(tmp_path / f"a{accum}", data_root, f"--train.grad_accum_steps={accum}", "--train.max_iters=6",
            "--train.log_interval=3", "--train.eval_interval=6")
        monkeypatch.undo()
        counts.append(n["sync"])
    assert counts[0] == counts[1], counts


def test_init_from_checkpoint_starts_from_its_weights(tmp_path, data_root):
    first = run(tmp_path / "a", data_root, "--train.max_iters=20")
    res = run(tmp_path / "b", data_root, f"--model.init_from={tmp_path / 'a'}", "--model.n_layer=4",
              "--train.max_iters=2")
    assert res["losses"][1] < first["losses"][1] - 0.5  # far below a fresh init's ~4.2
    ck = load_checkpoint(tmp_path / "b")
    assert ck["model_config"]["n_layer"] == 2 and ck["config"]["model"]["n_layer"] == 2  # taken from the source
    assert ck["train"]["iter"] == 2  # a new run, not a resume


def test_init_from_hf_gpt2_dir_on_bpe_data(tmp_path, data_root, capsys):
    """The gpt2-tokenizer run: an HF-format GPT-2 directory as init; the first loss equals the
    exported model's own loss on the same batch (the fused head + loss against the full logits, with the
    weight-gradient product this CPU was measured to run fastest, which the run names)."""
    torch.manual_seed(0)
    ref = GPT(GPTConfig(block_size=64, vocab_size=50257, n_layer=2, n_head=2, n_embd=32))
    export_hf(ref, {"tokenizer": "gpt2", "chars": None}, tmp_path / "hf")
    res = run(tmp_path / "out", data_root, "--data.tokenizer=gpt2", f"--model.init_from={tmp_path / 'hf'}",
              "--train.max_iters=2", "--train.eval_interval=2")
    data_dir = prepare_data(DataConfig(tokenizer="gpt2", root=str(data_root)), progress=False)
    x, y = BatchLoader(data_dir, "train", block_size=32, batch_size=4, seed=1337).get_batch(0, 0)
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(ref(x).flatten(0, 1), y.flatten())
    assert res["losses"][1] == pytest.approx(expected.item(), abs=1e-5)
    ck = load_checkpoint(tmp_path / "out")
    assert ck["model_config"]["block_size"] == 64 and ck["tokenizer"] == {"tokenizer": "gpt2", "chars": None}
    assert re.search(r"LM head's weight gradient \(1 chunk of 50257 x 128 x 32 a step\) by (torch\.mm|oneDNN): .* ms by "
                     r"oneDNN \(measured now", capsys.readouterr().out)  # a micro-batch is 128 rows, one chunk


def test_init_from_hf_with_char_data_is_refused(tmp_path, data_root):
    with pytest.raises(UserError, match=r"HF GPT-2, which needs data.tokenizer=gpt2"):
        run(tmp_path / "out", data_root, "--model.init_from=gpt2")


def test_a_global_batch_not_divisible_by_ranks_is_refused(tmp_path, data_root, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match=r"train.batch_size x train.grad_accum_steps = 3 x 3 = 9 sequences, is not "
                                        r"divisible by the 2 ranks"):
        run(tmp_path / "out", data_root, "--train.grad_accum_steps=3", "--train.batch_size=3")


@pytest.mark.parametrize("batch,accum,world,split", [
    (12, 1, 2, (6, 2)),  # the shipped char configs on 2 ranks: 6 sequences each, one micro-step each
    (4, 3, 2, (3, 4)),  # 6 sequences a rank in micro-batches of at most 4: 2 x 3
    (4, 4, 2, (4, 4)),  # the ranks divide the micro-steps: the config's batch as it is
    (5, 1, 5, (1, 5)),
])
def test_ranks_that_do_not_divide_the_micro_steps_share_the_global_batch_in_smaller_micro_batches(batch, accum, world,
                                                                                                    split):
    from training.builders import fixed_batch
    from training.parallel.distributed import Parallel

    t = load_config([f"--train.batch_size={batch}", f"--train.grad_accum_steps={accum}"]).train
    d = fixed_batch(t, Parallel(world_size=world))
    (micro, global_steps), note = d.value, d.note
    assert (micro, global_steps) == split and micro * global_steps == batch * accum  # the global batch kept
    assert (note == "") == (accum % world == 0)


# ------------------------------------------------------------------------------------ subprocesses

@pytest.mark.slow
def test_sigterm_mid_run_writes_checkpoint_and_exits_zero(tmp_path, data_root):
    import json

    out = tmp_path / "out"
    argv = tiny_argv(out, data_root, "--train.max_iters=100000", "--train.eval_interval=100000")
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=sub_env())
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 90
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "stopped by SIGTERM after iter" in stdout and "Traceback" not in stderr
    ck = load_checkpoint(out)
    last_logged = json.loads(metrics.read_text().splitlines()[-1])["iter"]
    assert 3 <= ck["train"]["iter"] == last_logged < 100000


@pytest.mark.slow
def test_ddp_two_gloo_ranks_match_one_rank_with_twice_the_accumulation(tmp_path, data_root):
    import json

    common = ("--train.max_iters=4", "--train.grad_accum_steps=2", "--train.eval_interval=4")  # global accum
    single = run(tmp_path / "one", data_root, *common)
    argv = tiny_argv(tmp_path / "two", data_root, *common)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(ROOT / "train.py"), *argv], capture_output=True, text=True, env=sub_env(), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + "\n-----\n" + r.stderr[-3000:]
    assert "2 rank(s)" in r.stdout
    two = {rec["iter"]: rec["train/loss"] for rec in map(json.loads, (tmp_path / "two" / "metrics.jsonl").read_text().splitlines())
           if "train/loss" in rec}
    assert sorted(two) == sorted(single["losses"]) == [1, 2, 3, 4]
    for i in two:
        assert abs(two[i] - single["losses"][i]) < 1e-5, (i, two[i], single["losses"][i])
    a, b = load_checkpoint(tmp_path / "one")["model"], load_checkpoint(tmp_path / "two")["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0)
    # the other multi-rank tests fork their ranks from a warm interpreter (tests/warm_runs.py): the same
    # run started so ends bit for bit where torchrun's fresh interpreters ended
    r = two_ranks(tiny_argv(tmp_path / "forked", data_root, *common))
    assert r.returncode == 0, r.stderr[-3000:]
    c = load_checkpoint(tmp_path / "forked")["model"]
    assert all(torch.equal(b[k], c[k]) for k in b)


def test_hellaswag_during_training_with_a_char_tokenizer_is_refused_at_start(tmp_path, data_root):
    with pytest.raises(UserError, match=r"character-level tokenizer"):
        run(tmp_path / "out", data_root, "--eval.hellaswag_interval=5")
    assert not (tmp_path / "out").exists()  # refused with the config: nothing claimed, nothing built


def test_an_init_from_run_says_the_architecture_it_took_and_reruns_as_a_resume(tmp_path, data_root):
    """model.init_from brings every architecture key of its source (a modern one here); the saved config says
    what was trained, and the same command run again resumes (the source's keys are not compared)."""
    modern = ("--model.pos_embedding=rope", "--model.norm=rmsnorm", "--model.qk_norm=true", "--model.mlp_act=swiglu",
              "--model.tie_embeddings=false")
    run(tmp_path / "src", data_root, "--train.max_iters=2", *modern)
    again = ("--model.init_from=" + str(tmp_path / "src"), "--model.n_layer=4")
    with inject(interrupt_after=1):
        run(tmp_path / "b", data_root, "--train.max_iters=3", *again)
    saved = load_checkpoint(tmp_path / "b")
    for key, value in (("pos_embedding", "rope"), ("norm", "rmsnorm"), ("qk_norm", True), ("mlp_act", "swiglu"),
                       ("tie_embeddings", False), ("n_layer", 2)):
        assert saved["config"]["model"][key] == saved["model_config"][key] == value, key
    res = run(tmp_path / "b", data_root, "--train.max_iters=3", *again)  # the same command: a resume, not a refusal
    assert res["iter"] == 3 and load_checkpoint(tmp_path / "b")["config"]["model"]["n_layer"] == 2


def test_logs_are_plain_lines_when_stdout_is_not_a_terminal(tmp_path, data_root, capsys):
    run(tmp_path / "out", data_root, "--train.max_iters=6", "--train.log_interval=2", "--train.eval_interval=6")
    out, err = capsys.readouterr()
    lines = [ln for ln in out.splitlines() if re.match(r"iter \d+: loss", ln)]
    assert [int(ln.split()[1].rstrip(":")) for ln in lines] == [2, 4, 6]
    assert all(re.fullmatch(r"iter \d+: loss [\d.]+, lr [\d.e+-]+, tok/s [\d,]+, mfu [\d.]+%", ln) for ln in lines), lines
    assert "\r" not in out + err  # no bar frames in a log file


def test_a_terminal_gets_the_progress_bar_instead(capsys):
    from training.report.metrics import Progress

    progress = Progress(4, 0, interactive=True)
    for step in range(1, 5):
        progress.update()
        progress.show(step, f"loss {5 - step}.0")
    progress.close()
    out, err = capsys.readouterr()
    assert out == "" and "\r" in err and "4/4" in err and "loss 1.0" in err


