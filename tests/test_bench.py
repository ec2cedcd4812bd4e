"""bench.py end to end in smoke mode: every row of the table and every JSON key, no timing asserts."""
from __future__ import annotations

import json

import bench


def test_bench_quick_smoke(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    # the smallest run that still builds every row: 1 timed step per training row, no warm-up,
    # the tiny decode model, no HF (--quick), prepare once, no loss check
    assert bench.main(["--quick", "--no-loss-check", "--warmup", "0", "--iters", "1", "--rounds", "1",
                       "--json", str(out_json)]) == 0
    out = capsys.readouterr().out

    for line in ("machine:", "peak (matmul probe, this run)", "dtype auto ->", "peak RSS", "other processes kept"):
        assert line in out
    table = [ln for ln in out.splitlines() if ln.startswith(("BPE train", "char train", "decode", "prepare"))]
    rows = {(ln[:11].strip(), ln[11:].split("  ")[0].strip()) for ln in table}
    for section in ("BPE train", "char train"):
        assert (section, "ours fp32 (auto)") in rows or (section, "ours bf16 (auto)") in rows
        assert sum(1 for s, _ in rows if s == section) == 2  # auto precision + the other one (CPU)
    assert any(s == "decode" and "sample.py default" in n for s, n in rows)
    assert ("prepare", "ours prepare_data") in rows and ("prepare", "ours tokenize only") in rows
    assert all(ln.rstrip().endswith("x") for ln in table)  # every row has its baseline ratio

    report = json.loads(out_json.read_text())
    for key in ("settings", "machine", "dtype_auto", "peak_flops", "rows", "train_shapes", "decode", "prepare",
                "busy", "peak_rss_mb", "wall_s"):
        assert key in report, key
    for key in ("cpu", "cores", "torch", "threads", "amx", "avx512_bf16"):
        assert key in report["machine"], key
    assert set(report["peak_flops"]) == {"fp32", "bf16"}
    assert len(report["rows"]) == len(table) == 7
    for row in report["rows"]:
        for key in ("section", "name", "precision", "unit", "ours", "base", "ours_tok_s", "base_tok_s", "speedup"):
            assert key in row, (row["name"], key)
        assert row["ours"] > 0 and row["base"] > 0
    for row in report["rows"][:4]:  # training rows carry FLOP/s and MFU
        for key in ("ours_flops", "base_flops", "ours_mfu", "base_mfu"):
            assert row[key] > 0, (row["name"], key)


def test_bench_loss_check_runs(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    assert bench.main(["--quick", "--skip", "bpe", "--skip", "char", "--skip", "decode", "--skip", "prepare",
                       "--loss-steps", "2", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "same loss after 2 steps" in out
    lc = json.loads(out_json.read_text())["loss_check"]
    for key in ("base_val_loss", "ours_val_loss", "diff_val_loss", "agree", "data"):
        assert key in lc
