"""Choices measured once and kept (runtime/choices.py): `auto` picks the same dtype on every run of one
command however the timings come out, MFU is against one cached CPU peak, overrides still win, greedy
sampling prints the same text every run, and a damaged cache is measured around."""
from __future__ import annotations

import json

import torch
from hypothesis import given
from hypothesis import strategies as st

import runtime.choices
import runtime.precision
import training.report.mfu
from runtime.choices import cache_path
from training.report.mfu import peak_flops


def flipping_fastest(monkeypatch):
    """A probe whose verdict flips on every call, as a busy machine's can: bf16, fp32, bf16, ..."""
    picks = [torch.bfloat16, torch.float32] * 4
    calls = []

    def fake(candidates, run, device, **kw):
        calls.append(1)
        pick = picks[len(calls) - 1]
        return pick, {"float32": 1.0, "bfloat16": 0.5 if pick == torch.bfloat16 else 2.0}
    monkeypatch.setattr(runtime.precision, "cpu_native_bf16", lambda: True)
    monkeypatch.setattr(runtime.precision, "fastest", fake)
    return calls


def test_train_auto_makes_the_same_choice_twice_for_one_command_whatever_the_timings(tmp_path, monkeypatch, capsys):
    from tiny_runs import run
    from data import DataConfig, prepare_data

    root = tmp_path / "prepared"
    prepare_data(DataConfig(tokenizer="char", root=str(root)), progress=False)
    calls = flipping_fastest(monkeypatch)
    first = run(tmp_path / "a", root, "--train.dtype=auto", "--train.max_iters=2")
    second = run(tmp_path / "b", root, "--train.dtype=auto", "--train.max_iters=2")
    assert first["dtype"] == second["dtype"] == "bfloat16" and len(calls) == 1  # timed once, then reused
    out = capsys.readouterr().out
    assert f"from the cache {cache_path()}" in out and "kept in" in out
    # another shape is another decision (here the probe now says fp32), and an explicit dtype wins
    assert run(tmp_path / "c", root, "--train.dtype=auto", "--train.max_iters=2", "--train.batch_size=3")["dtype"] == "float32"
    assert run(tmp_path / "d", root, "--train.dtype=float32", "--train.max_iters=2")["dtype"] == "float32"
    keys = [json.loads(k) for k in json.loads(cache_path().read_text())]
    assert {k["batch_size"] for k in keys if k["kind"] == "train"} == {4, 3} and all(k["world_size"] == 1 for k in keys
                                                                                    if k["kind"] == "train")


def test_mfu_uses_the_cached_cpu_peak_and_train_peak_flops_still_overrides(monkeypatch):
    probes = iter([100e9, 400e9, 50e9])
    monkeypatch.setattr(training.report.mfu, "matmul_flops", lambda device, dtype: next(probes))
    cpu = torch.device("cpu")
    first, note1 = peak_flops(cpu, torch.float32)
    second, note2 = peak_flops(cpu, torch.float32)
    assert first == second == 100e9 and "measured now" in note1 and "from the cache" in note2
    assert peak_flops(cpu, torch.float32, override=7e11)[0] == 7e11
    assert peak_flops(cpu, torch.float32, cache=False)[0] == 400e9  # the benchmark probes in its own run
    assert peak_flops(cpu, torch.bfloat16)[0] == 50e9  # one entry per dtype


def test_a_damaged_or_unwritable_cache_is_measured_around(tmp_path, monkeypatch):
    monkeypatch.setattr(training.report.mfu, "matmul_flops", lambda device, dtype: 123e9)
    cache_path().parent.mkdir(parents=True, exist_ok=True)
    cache_path().write_text("{not json")
    assert peak_flops(torch.device("cpu"), torch.float32)[0] == 123e9
    assert json.loads(cache_path().read_text())  # rewritten whole
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("SMALLGPT_CACHE_DIR", str(blocked / "sub"))  # under a file: not creatable
    peak, note = peak_flops(torch.device("cpu"), torch.float32)
    assert peak == 123e9 and "not kept" in note


def test_the_cache_lives_in_the_users_cache_dir_unless_told_otherwise(monkeypatch, tmp_path):
    monkeypatch.delenv("SMALLGPT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path() == tmp_path / "xdg" / "smallgpt" / "choices.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_path() == tmp_path / "home" / ".cache" / "smallgpt" / "choices.json"


def test_greedy_sampling_gives_the_same_text_on_every_run_whatever_the_timings(tmp_path, monkeypatch, capsys):
    from sample_runs import make_char_checkpoint, run as sample_run

    ckpt = tmp_path / "ckpt.pt"
    make_char_checkpoint(ckpt)
    calls = flipping_fastest(monkeypatch)
    argv = ["--checkpoint", str(ckpt), "--max-new-tokens", "20", "--temperature", "0", "--seed", "1",
            "--device", "cpu"]
    outs = []
    for _ in range(3):
        code, out, err = sample_run(argv, capsys)
        assert code == 0
        outs.append((out, "bfloat16" in err.split("seed")[0]))
    assert len(calls) == 1 and outs[0] == outs[1] == outs[2] and outs[0][1]  # bf16 all three times


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=6)


def _damage(field: str, value, shape: str) -> None:
    """Every entry of the cache with `field` set to `value` (or the file's whole shape replaced)."""
    data = json.loads(cache_path().read_text())
    if shape == "entries":
        data = {k: {**v, field: value} for k, v in data.items()}
    elif shape == "entry":
        data = dict.fromkeys(data, value)
    else:
        data = value
    cache_path().write_text(json.dumps(data))


@given(field=st.sampled_from(["value", "note", "when"]), value=JSON, shape=st.sampled_from(["entries", "entry", "file"]))
def test_any_json_in_any_field_of_the_cache_is_measured_again_with_a_note(monkeypatch, field, value, shape):
    """Before: a value of [] or {} stopped train.py and sample.py (auto_dtype's DTYPE_BY_NAME.get) and the
    loss path's choice with 'TypeError: unhashable type'; a note or date of another type was printed as
    it was. Each kind of entry (a dtype, the CPU peak, the loss's product) is written, damaged, and read
    back: a value that is still usable is used, anything else measured again with the note."""
    import runtime.loss_path as loss_path

    monkeypatch.setattr(loss_path, "weight_grad_product_available", lambda device: True)
    monkeypatch.setattr(loss_path, "onednn_mm", torch.mm)  # (where this torch lacks oneDNN's op)
    monkeypatch.setattr(loss_path, "fastest", lambda names, *a, **k: (names[0], {"torch.mm": 2.0, "oneDNN": 1.0}))
    monkeypatch.setattr(runtime.precision, "cpu_native_bf16", lambda: True)
    monkeypatch.setattr(runtime.precision, "fastest", lambda *a, **k: (torch.float32, {"float32": 1.0}))
    monkeypatch.setattr(training.report.mfu, "matmul_flops", lambda device, dtype: 123e9)
    cpu = torch.device("cpu")
    cache_path().unlink(missing_ok=True)
    dtype = lambda: runtime.choices.auto_dtype("train", {"n": 1}, lambda: (torch.float32, "timed"), cpu)  # noqa: E731
    product = lambda: loss_path.choose_weight_grad_product(cpu, vocab_size=8, rows=4, n_embd=4)  # noqa: E731
    peak = lambda: peak_flops(cpu, torch.float32)  # noqa: E731
    firsts = [dtype(), product(), peak()]
    whole = cache_path().read_text()
    for read, first in zip((dtype, product, peak), firsts):
        cache_path().write_text(whole)  # each reads the damage (the first to measure again drops it)
        _damage(field, value, shape)
        got, note = read()
        if "from the cache" in note:  # still usable as it is: a string note or date, or a value of the right kind
            used = runtime.precision.dtype_name(got) if isinstance(got, torch.dtype) else got
            assert shape == "entries" and (used == value if field == "value" else isinstance(value, str)), note
            continue
        assert got == first[0], (got, first)
        other_entries = shape == "file" and isinstance(value, dict)  # a file of other keys: nothing of ours damaged
        assert "the cached value was damaged" in note or other_entries, note
