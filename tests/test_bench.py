"""bench.py end to end in smoke mode: every row of the table and every JSON key, no timing asserts; and
that it times the project's real code paths, not copies of them."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from cli_lines import an_error_line
from errors import UserError, run_cli
import benchmarks.cli
import benchmarks.decode
import benchmarks.suite
import benchmarks.train
import model.generate
from inference import sample_cli
import training.builders
import training.step
from runtime.loss_path import LMLoss, choose_loss_chunk_rows
from runtime.precision import cpu_native_bf16

QUICK = ["--quick", "--warmup", "0", "--iters", "1", "--rounds", "1"]


def test_bench_quick_smoke(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    # the smallest run that still builds every row: 1 timed step per training row, no warm-up,
    # the tiny decode model, no HF (--quick), prepare once, no loss check
    assert benchmarks.cli.main([*QUICK, "--device", "cpu", "--skip", "loss", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out

    for line in ("machine:", "peaks (MFU is against these)", "dtype auto ->", "peak RSS", "other processes kept"):
        assert line in out
    table = [ln for ln in out.splitlines()
             if ln.startswith(("BPE train", "char train", "Muon vs AdamW", "decode", "prepare")) and ": dtype auto" not in ln]
    rows = {tuple(re.split(r"\s{2,}", ln.strip())[:2]) for ln in table}  # (section, row name)
    native = cpu_native_bf16()  # bf16 rows only where bf16 is native: an emulated dtype is never timed
    for section in ("BPE train", "char train"):
        assert ((section, "ours float32 (auto)") in rows) + ((section, "ours bfloat16 (auto)") in rows) == 1, rows
        assert sum(1 for s, _ in rows if s == section) == 1 + native  # auto precision + the other one (CPU)
        assert f"{section}: dtype auto -> " in out
        assert (" ms in float32, " in out) == native  # both probe times shown where both were timed
    assert any(s == "decode" and "sample.py default" in n for s, n in rows)
    assert any(s == "Muon vs AdamW" for s, _ in rows) and "Muon step / AdamW step (shakespeare_char_modern" in out
    assert "BPE fp32 step: " in out and "of the fp32 matmul probe's peak" in out
    assert ("prepare", "ours prepare_data") in rows and ("prepare", "ours tokenize only") in rows
    assert all(ln.rstrip().endswith("x") for ln in table)  # every row has its baseline ratio

    report = json.loads(out_json.read_text())
    for key in ("settings", "machine", "dtype_auto", "peak_flops", "rows", "decode", "prepare", "busy",
                "peak_rss_mb", "wall_s", "muon", "targets"):
        assert key in report, key
    for key in ("cpu", "cores", "torch", "threads", "amx", "avx512_bf16"):
        assert key in report["machine"], key
    assert set(report["peak_flops"]) == {"float32", "bfloat16"} if native else {"float32"}
    assert len(report["rows"]) == len(table)
    for row in report["rows"]:
        for key in ("section", "name", "precision", "unit", "ours", "base", "ours_tok_s", "base_tok_s", "speedup"):
            assert key in row, (row["name"], key)
        assert row["ours"] > 0 and row["base"] > 0
    for row in report["rows"][:2 + 2 * native]:  # training rows carry FLOP/s
        for key in ("ours_flops", "base_flops"):
            assert row[key] > 0, (row["name"], key)


def test_bench_loss_check_runs_and_its_rerun_of_the_baseline_is_bitwise_equal_on_a_cpu(tmp_path, capsys):
    """The check's report; and --loss-noise-runs runs the baseline again from the same init on the same
    batches: on a CPU every op is deterministic, so the re-run's per-step losses equal the baseline's bit for
    bit (no first differing step) and its val loss to the last bit; --loss-deterministic is on for the check only."""
    out_json = tmp_path / "bench.json"
    assert benchmarks.cli.main([*QUICK, "--device", "cpu", "--only", "loss", "--loss-steps", "2", "--loss-noise-runs", "1",
                       "--loss-deterministic", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "same loss after 2 steps" in out and "the baseline run again: +0.0000" in out
    lc = json.loads(out_json.read_text())["loss_check"]
    for key in ("base_val_loss", "ours_val_loss", "diff_val_loss", "agree", "data"):
        assert key in lc
    assert lc["noise_val_diffs"] == [0.0] and lc["noise"] == 0.0 and lc["deterministic"] is True
    assert lc["first_differing_step"]["again0"] is None
    assert lc["again_train_losses"] == [lc["base_train_losses"]]
    assert not torch.are_deterministic_algorithms_enabled()  # the process is left as it was


def test_loss_deterministic_is_strict_and_an_op_without_a_deterministic_algorithm_is_one_line(monkeypatch, capsys):
    """--loss-deterministic runs the check under deterministic algorithms with warn_only off: under warn_only, SDPA's
    cuDNN and flash backwards keep their atomic adds (on an H100 the baseline's own re-run parted at step 1 with
    torch's warning printed). An op that has no deterministic algorithm then raises: one line naming the option,
    and the process's setting is given back."""
    seen = []

    def strict_check(*a, **k):
        seen.append((torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()))
        raise RuntimeError("index_reduce_cuda does not have a deterministic implementation, but you set "  # torch's words
                           "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this "
                           "operation, or you can use the 'warn_only=True' option, if that's acceptable for your "
                           "application. You can also file an issue at https://github.com/pytorch/pytorch/issues to "
                           "help us prioritize adding deterministic support for this operation.")
    monkeypatch.setattr(benchmarks.suite, "loss_check", strict_check)
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: benchmarks.cli.main([*QUICK, "--device", "cpu", "--only", "loss", "--loss-steps", "3",
                                             "--loss-deterministic"]))
    err = capsys.readouterr().err
    assert seen == [(True, False)]
    line = an_error_line(e.value.code, err, "run the check without --loss-deterministic")
    assert line.startswith("error: --loss-deterministic: RuntimeError: index_reduce_cuda does not have a deterministic "
                           "implementation") and "warn_only" not in line and len(line) < 250, line
    assert not torch.are_deterministic_algorithms_enabled()


def test_bench_times_the_step_train_py_runs_and_the_sampler_sample_py_runs(monkeypatch, capsys):
    """The 'ours' rows go through training.step.train_step, called by the run's chain (build_trainer), and
    through sample.py's decoding set-up (runtime.decoding.setup_decoding) and model.generate.generate:
    counting wrappers around those functions must see every timed call."""
    calls = {"step": 0, "setup": 0, "generate": 0}

    def counting(name, real):
        def wrapped(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        return wrapped

    assert training.builders.train_step is training.step.train_step  # the chain's step (build_trainer)
    assert benchmarks.decode.setup_decoding is sample_cli.setup_decoding
    assert benchmarks.decode.generate is model.generate.generate
    monkeypatch.setattr(training.builders, "train_step", counting("step", training.step.train_step))
    monkeypatch.setattr(benchmarks.decode, "setup_decoding", counting("setup", sample_cli.setup_decoding))
    monkeypatch.setattr(benchmarks.decode, "generate", counting("generate", model.generate.generate))
    assert benchmarks.cli.main([*QUICK, "--device", "cpu", "--only", "train", "--only", "decode", "--iters", "2"]) == 0
    dtypes = 1 + cpu_native_bf16()  # fp32, and bf16 where native
    # 2 shapes x the precisions x (2 timed steps), no warm-up
    assert calls["step"] == 2 * dtypes * 2
    # decode: sample.py's set-up once; its row (and the other dtype's row, where bf16 is native) each
    # generate once to warm up, once timed and once for the agreement check
    assert calls["setup"] == 1 and calls["generate"] == dtypes * 3


def test_bench_isa_avx2_reruns_the_sections_in_a_child_under_the_avx2_variables(tmp_path, capsys, monkeypatch):
    """One command gives both reports: the child gets the same options (without --isa-avx2, with its
    own --json) and the variables that cap oneDNN and ATen at AVX2; its JSON lands in ours."""
    seen = {}

    def fake_run(cmd, env):
        seen.update(cmd=cmd, env=env)
        json_path = cmd[cmd.index("--json") + 1]
        with open(json_path, "w") as f:
            json.dump({"machine": {"cpu_capability": "AVX2"}}, f)
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(benchmarks.suite.subprocess, "run", fake_run)
    out_json = tmp_path / "b.json"
    argv = [*QUICK, "--device", "cpu", "--only", "muon", "--isa-avx2", "--json", str(out_json)]
    assert benchmarks.cli.main(argv) == 0
    assert seen["env"]["ONEDNN_MAX_CPU_ISA"] == "AVX2" and seen["env"]["ATEN_CPU_CAPABILITY"] == "avx2"
    assert "--isa-avx2" not in seen["cmd"] and str(out_json) not in seen["cmd"] and "muon" in seen["cmd"]
    # the child runs the script (benchmarks/ has no __main__)
    assert seen["cmd"][1] == str(Path(benchmarks.cli.__file__).resolve().parents[1] / "bench.py")
    assert "under ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2" in capsys.readouterr().out
    assert json.loads(out_json.read_text())["isa_avx2"] == {"machine": {"cpu_capability": "AVX2"}}


def test_bench_bad_option_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: benchmarks.cli.main(["--iters", "0"]))
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == "error: --iters must be >= 1, got 0"
    with pytest.raises(SystemExit):
        run_cli(lambda: benchmarks.cli.main(["--loss-chunks", "64,lots"]))
    assert capsys.readouterr().err.strip() == ("error: --loss-chunks must be positive row counts separated by commas, "
                                               "e.g. 64,256; got '64,lots'")
    for recipes, words in (("fp8", "--float8 takes recipes from tensorwise, rowwise"),
                           ("tensorwise", "leave out --float8")):  # this CPU has no float8 tensor cores
        with pytest.raises(SystemExit):
            run_cli(lambda: benchmarks.cli.main(["--device", "cpu", "--float8", recipes]))
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and words in err, err


def _fake_nanogpt(root: Path, times_ms: list[float], exit_code: int = 0, prepared: bool = True) -> Path:
    """A folder shaped like a nanoGPT checkout whose train.py prints nanoGPT's iteration lines with the given
    times (and records its arguments), and whose prepare.py needs tiny shakespeare's input.txt beside it."""
    d = root / "nanoGPT"
    data = d / "data" / "shakespeare"
    data.mkdir(parents=True)
    (d / "model.py").write_text("")
    if prepared:
        (data / "train.bin").write_bytes(b"")
    (data / "prepare.py").write_text("import pathlib; pathlib.Path('input.txt').read_text(); "
                                     "pathlib.Path('train.bin').write_bytes(b'')\n")
    (d / "train.py").write_text(
        "import json, os, sys\n"
        "open('argv.json', 'w').write(json.dumps(sys.argv[1:]))\n"
        "open('threads.txt', 'w').write(os.environ.get('OMP_NUM_THREADS', ''))\n"
        f"for i, t in enumerate({times_ms!r}):\n"
        "    print(f'iter {i}: loss 10.5012, time {t:.2f}ms, mfu 0.02%')\n"
        "print('no such thing', file=sys.stderr)\n"
        f"sys.exit({exit_code})\n")
    return d


def test_nanogpts_own_train_py_is_run_with_its_cpu_recipe_and_timed_from_iteration_20(tmp_path, monkeypatch):
    from benchmarks import nanogpt_own

    times = [5000.0] + [900.0] * 19 + [400.0 + i for i in range(81)]  # iterations 0-100; 20-100 are 400..480
    d = _fake_nanogpt(tmp_path, times)
    got = nanogpt_own.step_ms(d, tmp_path / "out", say=lambda m: None, threads=1)
    assert got["median_ms"] == 440.0 and got["iters"] == 81 and got["first_iter"] == 20
    assert (d / "threads.txt").read_text() == "1"  # bench.py --threads reaches it too
    argv = json.loads((d / "argv.json").read_text())
    assert argv[:3] == ["--dataset=shakespeare", "--device=cpu", "--compile=False"] and f"--out_dir={tmp_path / 'out'}" in argv
    assert {"--block_size=64", "--batch_size=12", "--n_layer=4", "--n_embd=128", "--max_iters=100"} <= set(argv)
    # data not prepared yet: nanoGPT's own prepare.py makes it, from SMALLGPT_SHAKESPEARE's copy
    source = tmp_path / "input.txt"
    source.write_text("First Citizen:\n")
    monkeypatch.setenv("SMALLGPT_SHAKESPEARE", str(source))
    fresh = _fake_nanogpt(tmp_path / "fresh", times, prepared=False)
    assert nanogpt_own.step_ms(fresh, tmp_path / "out2", say=lambda m: None)["median_ms"] == 440.0
    assert (fresh / "data" / "shakespeare" / "input.txt").read_text() == "First Citizen:\n"


def test_nanogpts_own_train_py_failing_or_missing_is_one_line(tmp_path, capsys):
    from benchmarks import nanogpt_own

    broken = _fake_nanogpt(tmp_path, [400.0] * 30, exit_code=1)
    with pytest.raises(UserError, match=r"^nanoGPT's train.py in .* failed \(exit 1: no such thing\)$"):
        nanogpt_own.step_ms(broken, tmp_path / "out", say=lambda m: None)
    silent = _fake_nanogpt(tmp_path / "silent", [400.0] * 10)  # exits 0, never reaches iteration 20
    with pytest.raises(UserError, match=r"printed no iteration lines from 20 on \(expected 'iter N: loss \.\.\., "
                                        r"time \.\.\.ms'\): is it karpathy/nanoGPT's train.py\?$"):
        nanogpt_own.step_ms(silent, tmp_path / "out", say=lambda m: None)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "train.py").write_text("")
    (bare / "model.py").write_text("")
    with pytest.raises(UserError, match=r"has neither train.bin nor the prepare.py that makes it; pass a whole nanoGPT"):
        nanogpt_own.check_dir(bare)
    with pytest.raises(SystemExit):  # nothing to compare it with
        run_cli(lambda: benchmarks.cli.main(["--device", "cpu", "--only", "muon", "--nanogpt-dir", str(broken)]))
    assert capsys.readouterr().err.strip() == ("error: --nanogpt-dir compares nanoGPT's own train.py with the train "
                                               "section's BPE rows; add --only train")
    with pytest.raises(SystemExit) as e:  # refused before any measuring
        run_cli(lambda: benchmarks.cli.main(["--device", "cpu", "--nanogpt-dir", str(tmp_path / "nowhere")]))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err
    assert err == (f"error: --nanogpt-dir {tmp_path / 'nowhere'}: no nanoGPT checkout there (train.py and model.py); "
                   "clone https://github.com/karpathy/nanoGPT and pass its folder")


def test_the_bpe_rows_are_compared_with_nanogpts_own_step_by_hand():
    rows = [{"section": "BPE train", "precision": "float32", "compiled": False, "ours": 250.0, "speedup": 1.3,
             "ours_mfu": 0.7, "auto": False},
            {"section": "BPE train", "precision": "bfloat16", "compiled": False, "ours": 200.0, "speedup": 1.6,
             "ours_mfu": 0.4, "auto": True}]
    later = [{**rows[1], "ours": 400.0, "name": "loss chunks of 64"}, {**rows[1], "ours": 150.0, "compiled": True}]
    tg = benchmarks.suite.targets({"rows": rows + later, "nanogpt_own": {"median_ms": 450.0}})
    # auto's row is the first eager one in its dtype (train.py's loss path), not a later variant's
    assert tg["bpe_fp32"]["speedup_own"] == 1.8 and tg["bpe_auto"] == {"precision": "bfloat16", "speedup_own": 2.25}
    assert "speedup_own" not in benchmarks.suite.targets({"rows": rows})["bpe_fp32"]


def test_the_floor_under_the_bpe_step_leaves_half_nanogpts_step_minus_the_head_products_by_hand():
    rows = [{"section": "BPE train", "precision": "float32", "compiled": False, "ours": 250.0, "speedup": 1.3,
             "ours_mfu": 0.7, "auto": True}]
    tg = benchmarks.suite.targets({"rows": rows, "nanogpt_own": {"median_ms": 450.0, "head_floor": {"total_ms": 170.0}}})
    # 2.0x of 450 ms is 225 ms; the head's products take 170 of it, 55 are left; ours spends 80 on the rest
    assert tg["bpe_fp32"]["head_floor"] == {"needed_ms": 225.0, "head_ms": 170.0, "left_ms": 55.0, "rest_ms": 80.0}
    assert "head_floor" not in benchmarks.suite.targets({"rows": rows, "nanogpt_own": {"median_ms": 450.0}})["bpe_fp32"]


def test_bench_prints_nanogpts_own_step_the_floor_under_ours_and_other_loss_chunk_sizes(tmp_path, capsys):
    """One run of the training rows (they take seconds each) for both: nanoGPT's own step and the floor under
    ours; and --loss-chunks' rows, on the BPE shape only."""
    d = _fake_nanogpt(tmp_path, [400.0] * 101)
    assert benchmarks.cli.main([*QUICK, "--device", "cpu", "--only", "train", "--nanogpt-dir", str(d),
                                "--loss-chunks", "64"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"nanoGPT's own train.py \(.*, the median of iterations 20-100\): 400.0 ms a step; ours fp32 "
                     r"\d+\.\d\dx \(target >= 2.0x\)", out), out
    floor = re.search(r"the floor under the fp32 step: its LM head's three products alone \(each by the fastest of "
                      r"torch.mm(, oneDNN)?, best of 2\): logits ([\d.]+) ms \(\d+ GFLOP/s\), input gradient ([\d.]+) ms "
                      r"\(\d+ GFLOP/s\), weight gradient ([\d.]+) ms \(\d+ GFLOP/s\) = ([\d.]+) ms. 2.0x needs <= 200.0 ms "
                      r"a step, which leaves (-?[\d.]+) ms for all the rest", out)
    assert floor, out
    parts, total, left = [float(floor.group(i)) for i in (2, 3, 4)], float(floor.group(5)), float(floor.group(6))
    assert total == pytest.approx(sum(parts), abs=0.15) and left == pytest.approx(200.0 - total, abs=0.15)
    check_loss_chunk_rows(out)


def test_the_head_floor_times_each_product_by_a_library_that_computes_it_right():
    from benchmarks import nanogpt_own

    calls = []

    def right(a, b):
        calls.append(("right", tuple(a.shape), tuple(b.shape)))
        return a @ b

    def wrong_but_instant(a, b):  # the fastest, and wrong: never the floor
        return torch.zeros(a.shape[0], b.shape[1])

    got = nanogpt_own.head_products_floor(6, 4, 10, calls=3, libraries={"fast": wrong_but_instant, "right": right})
    assert {k: p["by"] for k, p in got["products"].items()} == {"logits": "right", "input gradient": "right",
                                                                "weight gradient": "right"}
    # the step's shapes, with the logits laid out (V, n): one check + 3 timed calls each
    assert [c[1:] for c in calls[::4]] == [((10, 4), (4, 6)), ((6, 10), (10, 4)), ((10, 6), (6, 4))]
    assert len(calls) == 12
    assert got["total_ms"] == pytest.approx(sum(p["ms"] for p in got["products"].values()))
    p = got["products"]["logits"]
    assert p["gflops"] == pytest.approx(2 * 6 * 4 * 10 / p["ms"] / 1e6)
    with pytest.raises(UserError, match=r"^no library computed the LM head's logits product right on this machine$"):
        nanogpt_own.head_products_floor(6, 4, 10, libraries={"fast": wrong_but_instant})
    # the real libraries on a small shape: each picked one is among them
    real = nanogpt_own.head_products_floor(16, 8, 100, calls=1)
    assert {p["by"] for p in real["products"].values()} <= set(real["libraries"]) and "torch.mm" in real["libraries"]


def check_loss_chunk_rows(out: str) -> None:
    """--loss-chunks 64: its rows are on the BPE shape only, beside the chunks train.py takes."""
    rows = choose_loss_chunk_rows(torch.device("cpu"), compiled=False, vocab_size=50257)  # what train.py takes
    assert re.search(r"BPE train\s+ours float32, loss chunks of 64 ", out) and f"chunks of {rows} (auto)" in out
    # which dtype `auto` marks for the char shape depends on the CPU (on a near-tie, on the moment): one, either
    assert len(re.findall(r"char train\s+ours (?:float32|bfloat16) \(auto\)", out)) == 1
    assert not any(ln.startswith("char train") and "chunks of" in ln for ln in out.splitlines())
    # the fp32 target line speaks of the loss chunks train.py takes, not of the last variant timed; that fp32
    # row is the auto row only where auto picks fp32 (a CPU with native bf16 may pick bf16)
    chosen = next(ln for ln in out.splitlines() if re.search(rf"ours float32, loss chunks of {rows}( \(auto\))?\s", ln))
    summary = next(ln for ln in out.splitlines() if ln.startswith("BPE fp32 step:"))
    assert re.search(r"([\d.]+x) nanoGPT's loop", summary).group(1) in chosen.split()[-1:], (summary, chosen)


def test_budget_reports_each_configs_val_loss_within_the_time_nanogpts_recipe_takes(tmp_path, monkeypatch):
    import benchmarks.budget as budget

    monkeypatch.setitem(budget.RECIPE, "max_iters", 4)  # a tiny nanoGPT recipe: the mechanics, not the figures
    monkeypatch.setitem(budget.RECIPE, "eval_interval", 2)
    monkeypatch.setitem(budget.RECIPE, "eval_iters", 2)
    # and a tiny model in large batches: the pass over the whole val split after W took 4.9 of the test's 14 s
    monkeypatch.setitem(budget.RECIPE, "n_layer", 1)
    monkeypatch.setitem(budget.RECIPE, "n_embd", 32)
    monkeypatch.setitem(budget.RECIPE, "batch_size", 64)
    config = tmp_path / "tiny.yaml"
    config.write_text("model: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 32}\ndata: {tokenizer: char}\n"
                      "train: {max_iters: 6, eval_interval: 2, eval_iters: 2, batch_size: 4, device: cpu, dtype: float32}\n")
    out = budget.bench_budget([str(config)], tmp_path, torch.device("cpu"), None, lambda msg: None)
    nano = out["nanogpt"]
    assert [e["iter"] for e in nano["evals"]] == [0, 2, 4] and out["budget_s"] == nano["wall_s"] > 0
    (row,) = out["rows"]
    evals = [json.loads(line) for line in (tmp_path / "out-tiny" / "metrics.jsonl").read_text().splitlines()
             if "val/loss" in line]
    assert [e["iter"] for e in evals] == [2, 4, 6] and all(e["elapsed_s"] > 0 for e in evals)
    within = [e for e in evals if e["elapsed_s"] <= out["budget_s"]]
    assert row["iter"] == (within[-1]["iter"] if within else None)  # the last eval within W
    assert row["final_val"] == evals[-1]["val/loss"]
    assert budget.at_budget(evals, evals[1]["elapsed_s"])["iter"] == 4 and budget.at_budget(evals, 0.0) is None


def test_profile_puts_the_head_the_blocks_and_the_optimizer_in_their_buckets_and_accounts_for_the_wall_time():
    from benchmarks.profile import format_profile, profile_step
    from model import GPT, GPTConfig
    from training.optim import make_optimizers

    torch.manual_seed(0)
    vocab = 997  # a size no other dimension has, so the head's matmuls are recognisable
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=vocab))
    opts = make_optimizers(m, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), device_type="cpu")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    x = torch.randint(0, vocab, (2, 16))

    def step(i):
        return training.step.train_step(m, LMLoss(), opts, scaler, [(x, x)],
                                        amp=lambda: torch.autocast("cpu", enabled=False), grad_clip=1.0)

    r = profile_step(step, vocab, steps=3, warmup=1)
    for bucket in ("LM head matmuls", "block matmuls", "optimizer", "grad clipping", "loss and softmax"):
        assert r["ms"][bucket] > 0, (bucket, r)
    assert sum(r["ms"].values()) == pytest.approx(r["wall_ms"], rel=0.01)  # every millisecond in one bucket
    assert "LM head matmuls" in format_profile("tiny", "float32", r)


@pytest.mark.parametrize("argv,words", [
    (["--threads", "-5"], "--threads must be 0 (torch's default) or 1.."),
    (["--threads", "100000"], "--threads must be 0 (torch's default) or 1.."),  # a segfault before
    (["--json", "/tmp"], "--json /tmp is a directory"),  # found after 39 s of measuring before
    (["--json", "/proc/x/bench.json"], "--json's folder"),
    # a traceback (train.py --config nosuch failed) after W was measured, before
    (["--only", "budget", "--budget-configs", "nosuch"], "config 'nosuch' not found as a file or in configs/; pass a "
                                                         "YAML path or one of: gpt2_124m"),
    (["--budget-configs", ","], "--budget-configs names no config"),
    (["--only", "loss", "--loss-tol", "nan"], "--loss-tol must be a positive, finite number, got nan"),  # a verdict before
    (["--loss-tol", "inf"], "--loss-tol must be a positive, finite number"),
    (["--loss-tol", "0"], "--loss-tol must be a positive, finite number"),
    (["--budget-s", "nan"], "--budget-s must be a positive, finite number"),
    (["--budget-s", "-5"], "--budget-s must be a positive, finite number"),
    (["--prepare-rss-mb", "-1"], "--prepare-rss-mb must be >= 0"),
    (["--batch-sizes", "16,abc"], "--batch-sizes takes positive integers or 'max'"),  # a ValueError on CUDA before
    (["--batch-sizes", "max"], "'max' needs a numeric batch size before it"),
    (["--vocabs", "0"], "--vocabs takes positive integers"),
])
def test_bench_options_are_checked_before_anything_is_measured(argv, words, capsys, monkeypatch):
    monkeypatch.setattr(benchmarks.suite, "resolve_device",
                        lambda *a, **k: pytest.fail("measured before checking the options"))
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: benchmarks.cli.main(argv))
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_an_interrupted_or_killed_bench_leaves_no_temp_folder(tmp_path, monkeypatch):
    import signal as sig
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # SIGTERM inside the block: turned into KeyboardInterrupt, the folder is removed
    with pytest.raises(KeyboardInterrupt):
        with benchmarks.suite.bench_temp_dir() as tmp:
            (Path(tmp) / "x.bin").write_bytes(b"x")
            os.kill(os.getpid(), sig.SIGTERM)
    assert not list(tmp_path.glob("smallgpt-bench-*"))
    # a folder of a bench killed with -9 (its pid is gone) is removed by the next run; a live one's is not
    dead = tmp_path / "smallgpt-bench-999999999-5-abcd"
    (dead / "data").mkdir(parents=True)
    live = tmp_path / f"smallgpt-bench-{os.getppid()}-0-efgh"
    live.mkdir()
    with benchmarks.suite.bench_temp_dir():
        pass
    assert not dead.exists() and live.exists()


def test_corpus_row_prepares_with_ours_and_the_pool_baseline_and_resumes_byte_equal(tmp_path):
    import json

    from benchmarks.prepare import bench_corpus

    rows, info = bench_corpus(tmp_path, 2, 1, 20_000, lambda msg: None)  # 2 MB, one process, small shards
    assert [r["name"].split(" ")[0] for r in rows] == ["jsonl", "resume"]
    assert info["resumed_equals_uninterrupted"] and info["ours_peak_rss_mb"] > 0 and info["base_peak_rss_mb"] > 0
    # killed by progress: once its record says half the tokens are done, and before the end
    assert info["was_killed"] and 0.5 <= info["killed_at_fraction"] < 1
    # the baseline puts eot before every document; ours between the documents of each of its two splits
    base_tokens = sum(p.stat().st_size // 2 for p in (tmp_path / "base").iterdir())
    meta = json.loads(next((tmp_path / "ours").iterdir()).joinpath("meta.json").read_text())
    assert base_tokens == info["tokens"] + 2 and meta["documents"] == sum(
        1 for p in (tmp_path / "corpus").iterdir() for line in p.open() if line.strip())
