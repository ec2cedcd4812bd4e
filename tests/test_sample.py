"""sample.py: loading (ours, HF), prompts, output format, seeds, and every bad input as one error line.

Most runs call `run_cli(sample_cli.main)` in-process (same exit code and stderr as the CLI, without the
~2 s start-up); a few run the real script in a subprocess to prove there is no traceback.
"""
from __future__ import annotations

import dataclasses
import pickle
import re
import sys
from pathlib import Path

import pytest
import torch

import model.generate
import runtime.precision
from inference import sample_cli
from runtime.precision import inference_dtype
from runtime.text import StreamPrinter
from data import get_tokenizer
from model import GPT, GPTConfig
from model.generate import generate
from checkpoint import load_for_inference, save_checkpoint
from sample_runs import CHARS, ENV, make_char_checkpoint, run
from cli_lines import one_error_line
import warm_runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def char_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "ckpt.pt"
    model = make_char_checkpoint(path)
    return path, model


def run_script(argv, cwd=ROOT, **kw):
    return warm_runs.run([ROOT / "sample.py", *argv], cwd=cwd, env=ENV, **kw)


# ---------------------------------------------------------------------------------- HF parity

@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=50257))
    path = tmp_path_factory.mktemp("hf")
    hf.save_pretrained(path)
    return path, hf.eval()


def hf_greedy(hf, ids, n, eot=50256):
    out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      do_sample=False, max_new_tokens=n, pad_token_id=eot)[0, len(ids):].tolist()
    return out[: out.index(eot)] if eot in out else out  # we stop at EOT and do not print it


def test_hf_directory_loads_and_greedy_equals_transformers_generate(hf_dir):
    path, hf = hf_dir
    loaded = load_for_inference(str(path))  # the --checkpoint code path
    model, tok = loaded.model, loaded.tok
    ids = tok.encode("The quick brown fox")
    n = 64 - len(ids)  # up to the block size
    expected = hf_greedy(hf.double(), ids, n)
    hf.float()
    ours = generate(model.double(), [ids], n, temperature=0, eot=tok.eot)[0]
    assert ours == expected and len(ours) > 20


def test_hf_directory_through_the_cli_matches_transformers_text(hf_dir):
    path, hf = hf_dir
    prompt = "Hello, my name is"
    tok = get_tokenizer("gpt2")
    expected = prompt + tok.decode(hf_greedy(hf, tok.encode(prompt), 30)) + "\n"
    r = run_script(["--checkpoint", path, "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "30",
                    "--dtype", "float32", "--device", "cpu"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected


# ---------------------------------------------------------------------------------- bad inputs

class WritesMarker:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):  # unpickling this calls open(marker, "w"): code execution from a file
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("writer", ["torch.save", "pickle"])
def test_malicious_checkpoint_is_refused_and_its_code_never_runs(tmp_path, capsys, writer):
    # the payload is real: a non-weights_only load of the same construction does create its marker
    probe, probe_marker = tmp_path / "probe.pt", tmp_path / "probe-ran"
    torch.save({"format": "smallgpt-checkpoint", "x": WritesMarker(probe_marker)}, probe)
    torch.load(probe, weights_only=False)
    assert probe_marker.exists()

    evil, marker = tmp_path / "evil.pt", tmp_path / "evil-ran"
    payload = {"format": "smallgpt-checkpoint", "version": 1, "model": WritesMarker(marker)}
    if writer == "torch.save":
        torch.save(payload, evil)
        r = run_script(["--checkpoint", evil, "--max-new-tokens", "5"])  # the real CLI, once
        code, err = r.returncode, r.stderr
    else:
        evil.write_bytes(pickle.dumps(payload))
        code, _, err = run(["--checkpoint", evil, "--max-new-tokens", "5"], capsys)
    one_error_line(code, err, str(evil), "refused")
    assert not marker.exists()


def test_bad_option_in_a_subprocess_is_one_error_line_without_traceback():
    r = run_script(["--top-p", "1.5"])
    one_error_line(r.returncode, r.stderr, "--top-p", "(0, 1]")
    assert r.stdout == ""


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--top-p", "0"], ["--top-p", "(0, 1]"]),
        (["--top-p", "1.01"], ["--top-p"]),
        (["--top-p", "nan"], ["--top-p"]),
        (["--top-k", "0"], ["--top-k", ">= 1"]),
        (["--temperature", "-0.5"], ["--temperature", ">= 0"]),
        (["--max-new-tokens", "0"], ["--max-new-tokens", "[1, 1000000]"]),
        (["--max-new-tokens", "1000000000"], ["--max-new-tokens", "[1, 1000000]", "Ctrl-C"]),
        (["--min-p", "1"], ["--min-p", "[0, 1)"]),
        (["--min-p", "nan"], ["--min-p"]),
        (["--repetition-penalty", "0"], ["--repetition-penalty", "> 0"]),
        (["--repetition-penalty", "inf"], ["--repetition-penalty"]),
        (["--out", "/"], ["--out", "names a folder"]),  # by its spelling (fileio.file_arg), before it is looked at
        (["--out", "/tmp"], ["--out", "is a directory"]),  # a folder by what is there
        (["--out", "/nonexistent/dir/s.txt"], ["--out", "does not exist"]),
        (["--prompt-file", "/dev/zero"], ["prompt file /dev/zero", "larger than 16 MiB"]),
        (["--num-samples", "0"], ["--num-samples", ">= 1"]),
        (["--top-k", "ten"], ["--top-k", "invalid int"]),
        (["--dtype", "float64"], ["--dtype", "invalid choice"]),
        (["--device", "cuda:0" if not torch.cuda.is_available() else "tpu"], ["--device"]),
        (["--no-such-option"], ["unrecognized"]),
        (["--prompt-file", "/nonexistent/prompt.txt"], ["prompt file", "does not exist"]),
        (["-", "--prompt", "x"], ["stdin", "only one"]),
    ],
)
def test_bad_options_are_one_line_errors(char_ckpt, capsys, argv, words):
    code, out, err = run(["--checkpoint", char_ckpt[0], *argv], capsys)
    one_error_line(code, err, *words)


def test_checkpoint_problems_are_one_line_errors(tmp_path, capsys):
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"PK\x03\x04 this is not a zip archive at all" * 10)
    truncated = tmp_path / "truncated.pt"
    save_checkpoint(truncated, {"model": {"w": torch.zeros(1000)}})
    truncated.write_bytes(truncated.read_bytes()[:600])
    not_ours = tmp_path / "other.pt"
    torch.save({"state_dict": {"w": torch.zeros(3)}}, not_ours)
    empty_dir = tmp_path / "empty_run"
    empty_dir.mkdir()
    bad_hf = tmp_path / "bad_hf"
    bad_hf.mkdir()
    (bad_hf / "config.json").write_text("{not json")
    cases = [
        (tmp_path / "missing.pt", "does not exist"),
        (corrupt, "corrupt"),
        (truncated, "corrupt"),
        (not_ours, "not a smallgpt checkpoint"),
        (empty_dir, "no ckpt.pt"),
        (bad_hf, "not a usable HF GPT-2 directory"),
    ]
    for path, words in cases:
        code, out, err = run(["--checkpoint", path, "--max-new-tokens", "3"], capsys)
        one_error_line(code, err, str(path), words)
        assert out == ""


def test_checkpoint_with_weights_that_do_not_fit_its_config_is_an_error(tmp_path, capsys):
    model = GPT(GPTConfig(vocab_size=len(CHARS) + 1, block_size=16, n_layer=1, n_head=2, n_embd=16))
    cfg = dataclasses.asdict(model.config) | {"n_embd": 32}
    path = tmp_path / "mismatch.pt"
    save_checkpoint(path, {"model": model.state_dict(), "model_config": cfg,
                           "tokenizer": {"tokenizer": "char", "chars": CHARS}, "config": {}})
    code, _, err = run(["--checkpoint", path], capsys)
    one_error_line(code, err, "weights do not match")


def test_missing_default_checkpoint_says_how_to_train_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run([], capsys)
    one_error_line(code, err, "python train.py", "--checkpoint")


def test_prompt_with_characters_missing_from_the_char_vocab_is_an_error(char_ckpt, capsys):
    code, out, err = run(["--checkpoint", char_ckpt[0], "--prompt", "Zebra{"], capsys)
    one_error_line(code, err, "'Z'", "'{'")
    assert out == ""


def test_empty_prompt_starts_from_eot_and_says_so(char_ckpt, capsys, tmp_path):
    path, model = char_ckpt
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    eot = len(CHARS)
    expected = generate(model, [[eot]], 12, temperature=0, eot=eot)[0]
    for argv in (["--prompt", ""], ["--prompt-file", empty]):
        code, out, err = run(["--checkpoint", path, *argv, "--temperature", "0", "--max-new-tokens", "12",
                              "--dtype", "float32"], capsys)
        assert code == 0
        assert "end-of-text" in err
        assert out == "".join(CHARS[i] for i in expected) + "\n"


def test_dtype_auto_on_cpu_times_decoding_in_each_dtype_and_explicit_choices_are_kept(char_ckpt, capsys):
    cpu = torch.device("cpu")
    for name in ("float32", "bfloat16", "float16"):
        assert inference_dtype(name, cpu)[0] == getattr(torch, name)
    assert inference_dtype("auto", cpu)[0] == torch.float32  # nothing to time: the safe choice
    code, out, err = run(["--checkpoint", str(char_ckpt[0]), "--max-new-tokens", "3", "--seed", "1", "--device", "cpu"],
                         capsys)
    assert code == 0
    if runtime.precision.cpu_native_bf16():  # native bf16: both candidates are timed and said
        assert re.search(r"dtype auto -> (float32|bfloat16): decoding took [\d.]+ ms in float32, [\d.]+ ms in bfloat16",
                         err), err
    else:  # bf16 would be emulated: never timed, and the note says so
        assert "no native bf16" in err and "ms in bfloat16" not in err, err


def test_float16_and_bfloat16_run_on_cpu(char_ckpt, capsys):
    for dtype in ("float16", "bfloat16"):
        code, out, err = run(["--checkpoint", char_ckpt[0], "--prompt", "hear", "--dtype", dtype,
                              "--max-new-tokens", "10", "--no-stop-at-eot", "--seed", "0"], capsys)
        assert code == 0 and len(out) == len("hear") + 10 + 1 and dtype in err


def test_decode_compiles_only_when_asked_since_the_cuda_graph_beat_the_compiled_step():
    from runtime.decoding import decode_compile

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    # the flags win everywhere, silently
    assert decode_compile(True, cpu, steps=5, n_layer=2) == (True, None)
    assert decode_compile(False, gpu, steps=10**6, n_layer=48) == (False, None)
    # default on a CPU: never (its decode step is bound by the matmuls, not by kernel launches)
    assert decode_compile(None, cpu, steps=10**6, n_layer=48) == (False, None)
    # default on a GPU: the CUDA-graphed step (0.852 ms a token for 12 layers on an H100) was faster than the
    # compiled one (0.945 ms), so compiling saves nothing however long the run: never by default
    assert decode_compile(None, gpu, steps=10**7, n_layer=12) == (False, None)
    assert decode_compile(None, gpu, steps=10**7, n_layer=96) == (False, None)


def test_sample_on_a_cpu_decodes_eagerly_by_default_and_compile_flags_parse(char_ckpt, capsys):
    base = ["--checkpoint", str(char_ckpt[0]), "--max-new-tokens", "3", "--seed", "1", "--device", "cpu"]
    code, _, err = run(base, capsys)
    assert code == 0 and ", compiled" not in err and "compiling the decode step" not in err
    code, _, err = run(base + ["--no-compile"], capsys)
    assert code == 0 and ", compiled" not in err


# ---------------------------------------------------------------------------------- output, seeds, batches

def test_prompt_from_stdin(char_ckpt, capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("All:\n"))
    code, out, _ = run(["--checkpoint", char_ckpt[0], "-", "--max-new-tokens", "5", "--seed", "1", "--no-stop-at-eot"],
                       capsys)
    assert code == 0 and out.startswith("All:\n") and len(out) == len("All:\n") + 5 + 1


def recorder_into(chunks: list):
    """A stdout stand-in class whose instances append every write to `chunks`."""

    class Recorder:
        def write(self, s):
            chunks.append(s)

        def flush(self):
            pass

    return Recorder


def test_single_sample_streams_token_by_token(char_ckpt, monkeypatch):
    chunks = []
    Recorder = recorder_into(chunks)
    monkeypatch.setattr(sys, "stdout", Recorder())
    assert sample_cli.main(["--checkpoint", str(char_ckpt[0]), "--prompt", "All:", "--max-new-tokens", "20",
                        "--no-stop-at-eot", "--seed", "3"]) == 0
    text = "".join(chunks)
    assert text.startswith("All:") and text.endswith("\n") and len(text) == len("All:") + 20 + 1
    assert len(chunks) >= 20  # the prompt, then (at least) one write per generated character


def test_stream_printer_keeps_multibyte_characters_whole():
    tok = get_tokenizer("gpt2")
    text = "naïve café 🙂🎉 世界 ok"
    ids = tok.encode(text)
    assert any("\ufffd" in tok.decode([i]) for i in ids), "the text should split characters across tokens"
    chunks = []
    Recorder = recorder_into(chunks)
    printer = StreamPrinter(tok, Recorder())
    for i in ids:
        printer.add(i)
    printer.finish()
    assert "".join(chunks) == text + "\n"
    assert not any("\ufffd" in c for c in chunks)
    assert len(chunks) > 5


def test_several_samples_print_whole_with_separator_lines(char_ckpt, capsys):
    code, out, _ = run(["--checkpoint", char_ckpt[0], "--prompt", "hear", "--num-samples", "3",
                        "--max-new-tokens", "15", "--no-stop-at-eot", "--seed", "5"], capsys)
    assert code == 0
    parts = out.split("\n")
    headers = [i for i, line in enumerate(parts) if line.startswith("---------- sample ")]
    assert [parts[i] for i in headers] == [f"---------- sample {k}/3 ----------" for k in (1, 2, 3)]
    for i in headers:
        assert parts[i + 1].startswith("hear")


def test_same_seed_same_text_other_seed_other_text(char_ckpt, capsys):
    argv = ["--checkpoint", char_ckpt[0], "--prompt", "Speak", "--max-new-tokens", "40", "--temperature", "1.0",
            "--num-samples", "2", "--dtype", "float32"]
    a = run(argv + ["--seed", "11"], capsys)[1]
    b = run(argv + ["--seed", "11"], capsys)[1]
    c = run(argv + ["--seed", "12"], capsys)[1]
    assert a == b and a != c


def test_prompts_of_different_lengths_in_one_batch_equal_each_run_alone(char_ckpt, capsys):
    common = ["--checkpoint", char_ckpt[0], "--temperature", "0", "--max-new-tokens", "40", "--no-stop-at-eot",
              "--dtype", "float32"]
    prompts = ["A", "Before we proceed any", "hear me"]
    alone = [run(common + ["--prompt", p], capsys)[1] for p in prompts]
    code, out, _ = run(common + [a for p in prompts for a in ("--prompt", p)], capsys)
    assert code == 0
    samples = [s.strip("\n") for s in out.split("---------- sample ")[1:]]
    assert [s.split("----------\n", 1)[1] for s in samples] == [a.strip("\n") for a in alone]


# ---------------------------------------------------------------------------------- end to end

@pytest.mark.slow
def test_train_a_tiny_model_then_sample_from_its_out_dir(tmp_path, shakespeare_path):
    out_dir = tmp_path / "out"
    train = warm_runs.run(
        [ROOT / "train.py", "--model.n_layer=1", "--model.n_embd=32", "--model.n_head=2",
         "--model.block_size=32", "--train.max_iters=5", "--train.eval_interval=5", "--train.eval_iters=1",
         "--train.batch_size=4", "--train.warmup_iters=1", "--data.tokenizer=char",
         f"--data.root={tmp_path / 'data'}", f"--data.local_path={shakespeare_path}",
         f"--train.out_dir={out_dir}", "--train.device=cpu", "--wandb.mode=disabled"],
        cwd=tmp_path, env=ENV)
    assert train.returncode == 0, train.stderr[-2000:]
    r = run_script(["--checkpoint", out_dir, "--max-new-tokens", "20", "--seed", "0"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stdout.strip()) > 0 and len(r.stdout) >= 20 - 1  # "\n" prompt + up to 20 chars + "\n"


def test_help_groups_the_options_by_input_decoding_and_device(capsys):
    with pytest.raises(SystemExit) as e:
        sample_cli.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    sections = {name: out.index(f"\n{name}:\n") for name in ("input", "decoding", "device")}
    assert sections["input"] < sections["decoding"] < sections["device"]
    assert sections["input"] < out.index("--prompt-file", sections["input"]) < sections["decoding"]
    assert sections["decoding"] < out.index("--top-p", sections["decoding"]) < sections["device"]
    assert sections["device"] < out.index("--dtype", sections["device"])


@pytest.mark.parametrize("argv,words", [
    (["--bogus", "3"], "unrecognized arguments: --bogus"),
    (["3"], "unexpected argument '3'"),
])
def test_unknown_options_and_positionals_are_named_in_one_line(argv, words, capsys):
    code, _, err = run(argv, capsys)
    one_error_line(code, err, words)
    assert "invalid choice" not in err


@pytest.mark.parametrize("field,value,words", [("n_layer", 10**12, "n_layer must be at most 1024"),
                                               ("n_embd", 10**15, "parameters, more than the 1e+12")])
def test_a_checkpoint_whose_config_is_absurdly_large_is_refused_before_building(tmp_path, capsys, field, value, words):
    import time

    model = GPT(GPTConfig(vocab_size=len(CHARS) + 1, block_size=16, n_layer=1, n_head=2, n_embd=16))
    path = tmp_path / "huge.pt"
    save_checkpoint(path, {"model": model.state_dict(), "model_config": dataclasses.asdict(model.config) | {field: value},
                           "tokenizer": {"tokenizer": "char", "chars": CHARS}, "config": {}})
    start = time.perf_counter()
    code, out, err = run(["--checkpoint", path, "--max-new-tokens", "3"], capsys)
    one_error_line(code, err, "invalid model_config", words)
    assert out == "" and time.perf_counter() - start < 10


def test_stdin_of_dev_zero_is_refused_in_one_line_after_a_bounded_read(capsys, monkeypatch):
    import io

    r = run_script(["--checkpoint", "/nonexistent.pt", "-"], stdin="/dev/zero")  # a real process, endless stdin
    one_error_line(r.returncode, r.stderr, "the prompt on stdin is larger than 16 MiB")
    assert "batch size" not in r.stderr
    for argv in (["--prompt-file", "-"], ["--prompt", "-"]):  # the other spellings of stdin, in this process
        with open("/dev/zero", "rb") as zero:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(zero))
            code, _, err = run(["--checkpoint", "/nonexistent.pt", *argv], capsys)
        one_error_line(code, err, "the prompt on stdin is larger than 16 MiB")


def test_no_stream_and_out_give_the_streamed_text(char_ckpt, capsys, tmp_path):
    base = ["--checkpoint", char_ckpt[0], "--prompt", "All:", "--max-new-tokens", "12", "--seed", "5",
            "--no-stop-at-eot", "--min-p", "0.05", "--repetition-penalty", "1.3"]
    code, streamed, _ = run(base, capsys)
    assert code == 0 and streamed.startswith("All:") and streamed.endswith("\n") and len(streamed) > len("All:") + 12
    code, whole, _ = run([*base, "--no-stream"], capsys)
    assert code == 0 and whole == streamed
    target = tmp_path / "s.txt"
    target.write_text("old")
    code, out, err = run([*base, "--out", target], capsys)
    assert code == 0 and out == "" and target.read_text() == streamed and f"wrote 1 sample to {target}" in err
    assert not list(tmp_path.glob(".s.txt.*"))  # written through a temp file, renamed


@pytest.mark.parametrize("extra", [[], ["--num-samples", "2"], ["--num-samples", "2", "--out", "OUT"]])
def test_an_interrupt_keeps_the_text_generated_so_far(char_ckpt, capsys, tmp_path, monkeypatch, extra):
    real = sample_cli.generate_stream

    def interrupted_after_5(*args, **kwargs):
        for i, step in enumerate(real(*args, **kwargs)):
            if i == 5:
                raise KeyboardInterrupt
            yield step
    monkeypatch.setattr(sample_cli, "generate_stream", interrupted_after_5)  # the streamed sample
    monkeypatch.setattr(model.generate, "generate_stream", interrupted_after_5)  # generate(), for batches
    target = tmp_path / "out.txt"
    extra = [str(target) if a == "OUT" else a for a in extra]
    code, out, err = run(["--checkpoint", char_ckpt[0], "--prompt", "All:", "--max-new-tokens", "1000000",
                          "--seed", "5", "--no-stop-at-eot", *extra], capsys)
    assert code == 130 and err.strip().endswith("interrupted")
    text = target.read_text() if "--out" in extra else out
    samples = [text] if "--num-samples" not in extra else text.split("----------\n")[1:]
    assert len(samples) == (2 if "--num-samples" in extra else 1)
    for s in samples:
        s = s.split("\n----------")[0]
        assert s.startswith("All:") and len(s.rstrip("\n")) >= len("All:") + 5 - 1  # 5 characters kept
