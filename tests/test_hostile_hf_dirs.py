"""HF GPT-2 directories (config.json + model.safetensors or pytorch_model.bin) as hostile inputs, through every
entry point that takes one: sample.py, chat.py, serve.py, eval.hellaswag, eval.inspect, checkpoint.export (all
--checkpoint) and train.py (--model.init_from). Each bad directory is one `error:` line naming what is wrong in it, exit
status 2, no traceback, no library warning on stderr; the directory is left as it was and nothing is written
(no export, no checkpoint).

The classes: a file of the directory (config.json, model.safetensors, pytorch_model.bin) that is not a
regular file (a FIFO, a device, a directory, a socket, a broken link); a pytorch_model.bin that is damaged or
not a dict of named dense tensors, or holds code; a damaged model.safetensors (any header, any declared header
length, cut anywhere); weights of a dtype that is not floating point; NaN or inf in any weight; a config.json
too large to be one; a config.json of another model type (Llama, Qwen3, this project's remote-code export).

One tiny HF directory (transformers' own GPT2LMHeadModel.save_pretrained) is made per module and copied.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

transformers = pytest.importorskip("transformers")

from inference import chat_cli  # noqa: E402
import eval.hellaswag as hellaswag  # noqa: E402
import eval.inspect as inspect_  # noqa: E402
from inference import sample_cli  # noqa: E402
import server.cli as serve_cli  # noqa: E402
from training import cli as train_cli  # noqa: E402
from checkpoint.export import main as export_main  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from hostile_world import SAMPLE_FAST, run_entry  # noqa: E402
from multirank_runs import argv as tiny_train_argv  # noqa: E402
from cli_lines import an_error_line

N_POSITIONS = 32  # tiny_train_argv's model.block_size: train.py gets as far as loading the weights


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf-base")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8,
                                                                 n_positions=N_POSITIONS, vocab_size=50257))
    model.save_pretrained(path)
    item = {"ctx": "A man sits down.", "endings": ["He eats.", "He runs.", "It rains.", "She sings."], "label": 0}
    (path.parent / "hs.jsonl").write_text(json.dumps(item) + "\n")
    return path


@pytest.fixture
def no_serving(monkeypatch):
    """serve.py loads the model before it listens: a directory that loads would serve for ever."""
    def listen(host, port):
        raise AssertionError("the directory loaded, and serve.py went on to listen")
    monkeypatch.setattr(serve_cli, "listen", listen)


def entries(data_root: Path):
    """name -> (main, argv for the HF directory `d` with scratch folder `t`, the outputs it may write)."""
    hs = lambda d: Path(d).parent / "hs.jsonl"  # noqa: E731 (beside every directory made here)
    return {
        "sample.py": (sample_cli.main, lambda d, t: ["--checkpoint", d, *SAMPLE_FAST, "--prompt", "hi"]),
        "chat.py": (chat_cli.main, lambda d, t: ["--checkpoint", d, "--max-new-tokens", "2"]),
        "serve.py": (serve_cli.main, lambda d, t: ["--checkpoint", d, "--port", "0"]),
        "eval.hellaswag": (hellaswag.main, lambda d, t: ["--checkpoint", d, "--data", hs(d), "--device", "cpu"]),
        "eval.inspect": (inspect_.main, lambda d, t: ["--checkpoint", d, "--text", "To be", "--out", t / "pictures"]),
        "checkpoint.export": (export_main, lambda d, t: ["--checkpoint", d, "--out", t / "export"]),
        "train.py init_from": (train_cli.main, lambda d, t: tiny_train_argv(t / "run", data_root, "--data.tokenizer=gpt2",
                                                                        f"--model.init_from={d}")),
    }


ENTRIES = list(entries(Path()))


def snapshot(folder: Path) -> dict[str, object]:
    """Each name in `folder`: its kind, and a regular file's bytes (a sparse one's size only)."""
    seen = {}
    for p in sorted(folder.iterdir()):
        st_ = os.lstat(p)
        if p.is_symlink() or not p.is_file():
            seen[p.name] = (st_.st_mode, os.readlink(p) if p.is_symlink() else None)
        else:
            seen[p.name] = p.read_bytes() if st_.st_size < 2**24 else (st_.st_size, st_.st_mtime_ns)
    return seen


def refused(entry: str, hf_dir: Path, scratch: Path, data_root: Path, capsys, *words: str) -> str:
    """Run `entry` on `hf_dir`: one line with `words`, no warning or traceback, nothing changed or written."""
    main, argv = entries(data_root)[entry]
    before = snapshot(hf_dir)
    with warnings.catch_warnings(record=True) as warned:  # (pytest takes them off stderr: recorded here)
        warnings.simplefilter("always")
        code, out, err = run_entry(main, argv(hf_dir, scratch), capsys)
    line = an_error_line(code, err, str(hf_dir), *words)
    assert not warned, [str(w.message) for w in warned]  # on stderr, each more lines than the one
    assert snapshot(hf_dir) == before
    assert not (scratch / "export").exists()
    for made in ("run", "pictures"):  # made before the model is loaded, and removed again (no_empty_dirs_left)
        assert not (scratch / made).exists(), list((scratch / made).iterdir())
    return line


def copy_of(base: Path, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    shutil.copy(base.parent / "hs.jsonl", where / "hs.jsonl")
    return Path(shutil.copytree(base, where / "hf"))


# each example runs a whole command: a fifth of the profile's examples per entry (4 in CI, 60 with dev)
FEW = settings(max_examples=max(3, settings().max_examples // 5))


# --------------------------------------------------------------------- a weight file that is not a file

def make_not_a_file(kind: str, path: Path) -> None:
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":  # a read would wait for a writer for ever
        os.mkfifo(path)
    elif kind in ("zero_device", "null_device"):  # through a link: the real device is never at stake
        path.symlink_to("/dev/zero" if kind == "zero_device" else "/dev/null")
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
    elif kind == "symlink_loop":
        path.symlink_to(path.name)
    else:
        assert kind == "dangling_symlink"
        path.symlink_to("nothing-here")


NOT_A_FILE = ("directory", "fifo", "zero_device", "null_device", "socket", "symlink_loop", "dangling_symlink")


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin", "config.json", "tokenizer_config.json"])
def test_a_file_of_the_directory_that_is_not_a_regular_file_is_named_with_its_kind(hf_base, data_root, tmp_path,
                                                                                   capsys, no_serving, entry, name):
    """Before: "holds neither model.safetensors nor pytorch_model.bin", of a directory that holds one, and
    for config.json "no ckpt.pt or ckpt.dcp in directory": not taken for an HF directory at all; a
    tokenizer_config.json that is no file was taken for none, and the folder read as GPT-2's."""
    for kind in NOT_A_FILE:
        hf = copy_of(hf_base, tmp_path / kind)
        if name in ("model.safetensors", "pytorch_model.bin"):  # (a good model.safetensors would be read first)
            (hf / "model.safetensors").unlink()
        if (hf / name).exists():
            (hf / name).unlink()
        make_not_a_file(kind, hf / name)
        refused(entry, hf, tmp_path / kind, data_root, capsys, name, "not a file")


@pytest.fixture(scope="module")
def bpe_export(tmp_path_factory) -> Path:
    """An export of a checkpoint trained with our BPE (bpe:600): its vocabulary is its tokenizer.json alone."""
    from checkpoint import save_checkpoint
    from data.tokenizer import train_bpe
    from model import GPT, GPTConfig

    root = tmp_path_factory.mktemp("bpe-export")
    bpe = train_bpe(["To be, or not to be, that is the question: whether 'tis nobler in the mind"] * 30, 600)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=N_POSITIONS, vocab_size=600))
    save_checkpoint(root / "run" / "ckpt.pt", {"model": model.state_dict(), "model_config": model.config.__dict__,
                                               "tokenizer": {"tokenizer": "bpe:600", "chars": None, "bpe": bpe}})
    export_main(["--checkpoint", str(root / "run"), "--out", str(root / "hf")])
    assert (root / "hf" / "tokenizer.json").is_file() and not (root / "hf" / "vocab.json").exists()
    item = {"ctx": "To be", "endings": [" or", " not", " to", " be"], "label": 0}
    (root / "hs.jsonl").write_text(json.dumps(item) + "\n")
    return root / "hf"


@pytest.mark.parametrize("entry", ENTRIES)
def test_an_exports_tokenizer_json_missing_or_not_a_file_is_named(bpe_export, data_root, tmp_path, capsys, no_serving,
                                                                  entry):
    """An export of a trained BPE reads its vocabulary from tokenizer.json: without it the folder was read as
    GPT-2's, and the line blamed the vocabulary ("the tokenizer has 50257 ids but the model only 600")."""
    for kind in ("missing", *NOT_A_FILE):
        hf = copy_of(bpe_export, tmp_path / kind)
        (hf / "tokenizer.json").unlink()
        if kind != "missing":
            make_not_a_file(kind, hf / "tokenizer.json")
        refused(entry, hf, tmp_path / kind, data_root, capsys, "tokenizer.json", "missing" if kind == "missing" else
                "not a file")


# --------------------------------------------------------------------- NaN or inf in a weight

def with_tensor(base: Path, where: Path, change) -> Path:
    """A copy of `base` whose model.safetensors holds change(state) instead."""
    hf = copy_of(base, where)
    state = load_file(str(hf / "model.safetensors"))
    save_file(change(state), str(hf / "model.safetensors"), metadata={"format": "pt"})
    return hf


@pytest.mark.parametrize("entry", ENTRIES)
@FEW
@given(which=st.integers(0, 10**6), at=st.floats(0, 1), value=st.sampled_from([float("nan"), float("inf"), -float("inf")]))
def test_nan_or_inf_in_any_weight_is_one_line_naming_the_tensor(hf_base, data_root, capsys, entry, which, at, value):
    """Before: sample.py a traceback (torch.multinomial), serve.py served it, the export wrote it, eval.hellaswag
    scored it and train.py stopped at its first step blaming the learning rate."""
    names = sorted(load_file(str(hf_base / "model.safetensors")))
    name = names[which % len(names)]

    def poison(state):
        flat = state[name].flatten().clone()
        flat[min(int(at * flat.numel()), flat.numel() - 1)] = value
        return {**state, name: flat.view_as(state[name])}
    with tempfile.TemporaryDirectory() as tmp:
        hf = with_tensor(hf_base, Path(tmp), poison)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(serve_cli, "listen", lambda host, port: pytest.fail("the directory loaded; serve.py listened"))
            refused(entry, hf, Path(tmp), data_root, capsys, "non-finite", name)


# --------------------------------------------------------------------- weights that are not floating point

NOT_FLOATS = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.complex64]


@pytest.mark.parametrize("entry", ENTRIES)
@FEW
@given(which=st.integers(0, 10**6), dtype=st.sampled_from(NOT_FLOATS), every=st.booleans())
def test_weights_of_a_dtype_that_is_not_floating_point_are_one_line_naming_the_tensor(hf_base, data_root, capsys,
                                                                                      entry, which, dtype, every):
    """One tensor, or all of them, of the right shape and a dtype GPT-2's weights never have. Before: cast
    silently (a complex one with a ComplexWarning), and the model sampled, served, exported or trained."""
    names = sorted(load_file(str(hf_base / "model.safetensors")))
    name = names[which % len(names)]
    changed = lambda state: {k: v.to(dtype) if every or k == name else v for k, v in state.items()}  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        hf = with_tensor(hf_base, Path(tmp), changed)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(serve_cli, "listen", lambda host, port: pytest.fail("the directory loaded; serve.py listened"))
            refused(entry, hf, Path(tmp), data_root, capsys, str(dtype).removeprefix("torch."), "not floating point",
                    *([] if every else [name]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_weights_in_another_floating_dtype_still_load(hf_base, tmp_path, capsys, dtype):
    hf = with_tensor(hf_base, tmp_path, lambda state: {k: v.to(dtype) for k, v in state.items()})
    code, out, err = run_entry(sample_cli.main, ["--checkpoint", hf, *SAMPLE_FAST, "--prompt", "hi"], capsys)
    assert code == 0 and "Traceback" not in err, err


# --------------------------------------------------------------------- a pytorch_model.bin that is no state dict

class RunsCode:
    """Unpickling calls open(marker, "w"): refused by weights_only, never run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def bin_payloads(marker: Path) -> dict[str, tuple[object, str]]:
    """name -> (what pytorch_model.bin holds, a word its line has). Small: the class is the kind of object."""
    state = {"transformer.wte.weight": torch.zeros(4, 8), "transformer.ln_f.bias": torch.zeros(8)}
    return {
        "a list of the tensors": (list(state.values()), "holds a list"),
        "one tensor": (torch.zeros(3), "holds a Tensor"),
        "a number": (5, "holds a int"),
        "None": (None, "holds a NoneType"),
        "integer keys": ({i: v for i, v in enumerate(state.values())}, "a dict of named tensors"),
        "a string among the tensors": ({**state, "transformer.ln_f.bias": "hello"}, "a dict of named tensors"),
        "None among the tensors": ({**state, "transformer.ln_f.bias": None}, "a dict of named tensors"),
        "lists for tensors": ({k: v.tolist() for k, v in state.items()}, "a dict of named tensors"),
        "sparse tensors": ({k: v.to_sparse() for k, v in state.items()}, "torch.sparse_coo tensor"),
        "code (torch.save)": ({"x": RunsCode(marker)}, "run code"),
        "code (a plain pickle)": ({"x": RunsCode(marker)}, "run code"),
        "no bytes": (b"", "damaged or not a PyTorch file"),
        "a zip that is not torch's": (zipped({"hello.txt": b"hi"}), "damaged or not a PyTorch file"),
        "torch's zip cut in half": (None, "damaged or not a PyTorch file"),
    }


def zipped(files: dict[str, bytes]) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


@pytest.fixture(scope="module")
def bad_bins(hf_base, tmp_path_factory) -> tuple[list[Path], Path]:
    """An HF directory per payload (pytorch_model.bin, no model.safetensors), and the marker none may create."""
    import pickle

    root = tmp_path_factory.mktemp("bins")
    marker = root / "MARKER"
    made = []
    for i, (case, (payload, words)) in enumerate(bin_payloads(marker).items()):
        hf = copy_of(hf_base, root / str(i))
        (hf / "model.safetensors").unlink()
        if case == "code (a plain pickle)":
            (hf / "pytorch_model.bin").write_bytes(pickle.dumps(payload, protocol=4))
        elif isinstance(payload, bytes):  # the file's bytes as they are
            (hf / "pytorch_model.bin").write_bytes(payload)
        elif payload is None and "cut" in case:
            torch.save(load_file(str(hf_base / "model.safetensors")), hf / "pytorch_model.bin")
            whole = (hf / "pytorch_model.bin").read_bytes()
            (hf / "pytorch_model.bin").write_bytes(whole[:len(whole) // 2])
        else:
            torch.save(payload, hf / "pytorch_model.bin")
        made.append((hf, words))
    return made, marker


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_pytorch_model_bin_that_is_not_a_dict_of_named_tensors_is_one_line(bad_bins, data_root, tmp_path, capsys,
                                                                            no_serving, entry):
    """Before: "cannot read the HF GPT-2 weights (AttributeError)" (or RuntimeError, EOFError), and the
    code-holding pickle's line came after torch's three-line "Detected pickle protocol 4" warning."""
    made, marker = bad_bins
    for i, (hf, words) in enumerate(made):
        line = refused(entry, hf, tmp_path / str(i), data_root, capsys, "pytorch_model.bin", words)
        assert not marker.exists(), line


# --------------------------------------------------------------------- a config.json too large to be one

@pytest.mark.parametrize("entry", ENTRIES)
def test_a_config_json_larger_than_any_is_refused_by_its_size_unread(hf_base, data_root, tmp_path, capsys, no_serving,
                                                                     entry):
    """A valid config.json padded past 1 MiB, and a sparse 64 GiB one. Before: read whole (read_text: the
    sparse one was 64 GiB of memory, or a MemoryError), and the padded one loaded."""
    doc = (hf_base / "config.json").read_bytes()
    for i, size in enumerate((2**20 + 1, 64 * 2**30)):
        hf = copy_of(hf_base, tmp_path / str(i))
        if size <= 2**24:
            (hf / "config.json").write_bytes(doc + b" " * (size - len(doc)))
        else:
            with open(hf / "config.json", "r+b") as f:
                f.truncate(size)
        refused(entry, hf, tmp_path / str(i), data_root, capsys, "config.json", "larger than 1 MiB", str(size))


# --------------------------------------------------------------------- a config.json of another model type

def other_model_types(tmp: Path, base: Path) -> dict[str, tuple[Path, str]]:
    """name -> (an HF directory of another model type, its model_type): this project's own Llama, Qwen3 and
    remote-code exports (checkpoint.export writes them), and GPT-2's weights under a config naming another type."""
    from checkpoint.hf import write_hf_model
    from model import GPT, GPTConfig

    modern = dict(pos_embedding="rope", norm="rmsnorm", mlp_act="swiglu", bias=False)
    made = {}
    for fmt, extra in (("llama", {}), ("qwen3", dict(qk_norm=True)), ("smallgpt", dict(logit_softcap=30.0))):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=50257, block_size=N_POSITIONS, n_layer=1, n_head=2, n_embd=8, **modern, **extra))
        hf = tmp / fmt / "hf"
        hf.mkdir(parents=True)
        assert write_hf_model(model, hf, 50257, 50256) == fmt
        made[f"our {fmt} export"] = (hf, fmt)
    for kind in ("mistral", "gpt_neox", ""):
        hf = copy_of(base, tmp / f"named-{kind}")
        (hf / "config.json").write_text(json.dumps({**json.loads((base / "config.json").read_text()), "model_type": kind}))
        made[f"GPT-2 weights, model_type {kind!r}"] = (hf, kind)
    for hf, _ in made.values():
        shutil.copy(base.parent / "hs.jsonl", hf.parent / "hs.jsonl")
    return made


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_config_json_of_another_model_type_is_one_line_naming_it(hf_base, data_root, tmp_path, capsys, no_serving,
                                                                   entry):
    """Before: a Llama or Qwen3 directory was refused for lacking n_positions, this project's remote-code export
    for lacking GPT-2's biases (each with "re-export it": no re-export helps), and GPT-2 weights under another
    model_type loaded as GPT-2."""
    for case, (hf, model_type) in other_model_types(tmp_path, hf_base).items():
        refused(entry, hf, hf.parent, data_root, capsys, f"model_type is {model_type!r}", "only GPT-2")


# --------------------------------------------------------------------- model.safetensors that is not one

@pytest.fixture(scope="module")
def safetensors_bytes(hf_base) -> bytes:
    return (hf_base / "model.safetensors").read_bytes()


@pytest.mark.parametrize("entry", ENTRIES)
@FEW
@example(cut=0.0, header=None, declared=None).via("zero bytes")
@example(cut=0.5, header=b"[1, 2, 3]", declared=None).via("JSON, not safetensors' header")
@example(cut=0.5, header=None, declared=2**62).via("a header length past any file")
@given(cut=st.floats(0, 1, exclude_max=True), header=st.one_of(st.none(), st.binary(max_size=64)),
       declared=st.one_of(st.none(), st.integers(0, 2**64 - 1)))
def test_a_damaged_model_safetensors_is_one_line_naming_it(hf_base, safetensors_bytes, data_root, capsys, entry, cut,
                                                          header, declared):
    """Any bytes as its header, any declared header length (its first 8 bytes), cut anywhere. Before: one line
    saying "SafetensorError", naming neither the file nor what is wrong with it."""
    import struct

    data = safetensors_bytes
    if header is not None:
        (n,) = struct.unpack("<Q", data[:8])
        data = struct.pack("<Q", len(header)) + header + data[8 + n:]
    if declared is not None:
        data = struct.pack("<Q", declared) + data[8:]
    data = data[:int(cut * len(data))] if header is None and declared is None else data
    with tempfile.TemporaryDirectory() as tmp:
        hf = copy_of(hf_base, Path(tmp))
        (hf / "model.safetensors").write_bytes(data)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(serve_cli, "listen", lambda host, port: pytest.fail("the directory loaded; serve.py listened"))
            refused(entry, hf, Path(tmp), data_root, capsys, "model.safetensors", "damaged or not a safetensors file")
