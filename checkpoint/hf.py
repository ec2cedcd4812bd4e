"""HF transformers directories, read and written: the one place that opens their weight files
(model.safetensors, pytorch_model.bin) and config.json. What the tensors mean (names, transposes, the
Llama and Qwen3 layouts) is model/hf.py and model/hf_modern.py; this file moves the bytes.

    model = from_pretrained("gpt2")                       # a hub name, or a local HF directory
    fmt = write_hf_model(model, directory, 50257, 50256)  # config.json + model.safetensors (+ modeling code)
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import struct
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from errors import clipped, short_error
from fileio import atomic_write, atomic_write_bytes, json_loads, path_kind, read_user_file
from network import hub_offline_unless_reachable
from model.gpt import GPT, GPTConfig
from model.hf import HF_ACTIVATIONS, config_from_hf, cropped_state, gpt2_tensors, hf_config, state_from_hf

from .meta import filled_model
from .model_config import model_config_problem
from model.hf_modern import hf_format, llama_config, llama_tensors, qwen3_config, smallgpt_config

REMOTE_CODE = Path(__file__).with_name("remote_code") / "modeling_smallgpt.py"


def _resolve_dir(name_or_dir: str, patterns: tuple[str, ...] = ("config.json", "*.safetensors")) -> Path:
    path = Path(name_or_dir)
    if path.is_dir():
        return path
    # not a local directory: a hub name such as "gpt2" or "gpt2-medium" (needs the network once)
    from huggingface_hub import snapshot_download

    hub_offline_unless_reachable()  # the hub not answering: the cache or a quick error, not 30 s of retries
    try:
        return Path(snapshot_download(name_or_dir, allow_patterns=list(patterns)))
    except Exception as e:  # offline, unknown repo, ...: the caller turns this into a clear message
        raise FileNotFoundError(
            f"{name_or_dir!r} is neither a local HF directory nor a reachable hub model ({type(e).__name__})"
        ) from e


MAX_CONFIG_BYTES = 2**20  # GPT-2's config.json is under 1 KB; a bigger file is not one (a sparse 20 GB file: refused unread)
INDEX_NAME = "model.safetensors.index.json"  # save_pretrained(..., max_shard_size=...): the shards' weight_map
# the first one there is read, in transformers' order
WEIGHT_FILES = ("model.safetensors", INDEX_NAME, "pytorch_model.bin")
RESAVE = "re-save the model from where it was made (transformers' save_pretrained(dir))"
MAX_INDEX_BYTES = 2**24  # GPT-2 XL's index is 40 KB; a bigger file is not one (read bounded, as config.json)


class Refused(ValueError):
    """A directory refused with a message that names its own fix (load.py adds no generic one: for these,
    "re-export it" would not help)."""


def _must_be_a_file(path: Path) -> None:
    if not path.is_file():  # a FIFO (a read would wait), a device, a directory, a broken link
        raise ValueError(f"its {path.name} is {path_kind(path)}, not a file")


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    name = _weights_name(path)
    if name == "model.safetensors":
        return _read_safetensors(path / name)
    if name == INDEX_NAME:
        return _read_sharded(path)
    return _read_bin(path / name)


def _weights_name(path: Path) -> str:
    """Which of WEIGHT_FILES holds the directory's weights (a file, unread); else why there is none."""
    for name in WEIGHT_FILES:
        if os.path.lexists(path / name):
            _must_be_a_file(path / name)
            return name
    if os.path.lexists(path / "pytorch_model.bin.index.json"):  # transformers' old sharded .bin: not read here
        raise Refused("its weights are sharded pytorch_model-*.bin files, which are not read here; re-save the model "
                      "as safetensors (transformers' save_pretrained(dir)) and pass that directory")
    raise FileNotFoundError(f"{path} holds none of model.safetensors, {INDEX_NAME} (sharded) or pytorch_model.bin")


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    with _safetensors_errors(path):
        return load_file(str(path))


@contextmanager
def _safetensors_errors(path: Path) -> Iterator[None]:
    """safetensors' errors reading `path` as one ValueError naming it."""
    try:
        yield
    except SafetensorError as e:  # a truncated file, a header that is not safetensors' JSON, bad offsets
        raise ValueError(f"its {path.name} is damaged or not a safetensors file ({short_error(e, 80)})") from None


def _read_sharded(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a sharded save (model-0000N-of-0000M.safetensors): each shard the index's weight_map
    names, in this directory, read and checked like model.safetensors; each holds exactly the names the
    index puts in it (a shard and an index that disagree are two different saves)."""
    data = read_user_file(path / INDEX_NAME, INDEX_NAME, limit=MAX_INDEX_BYTES, fix="pass an HF GPT-2 directory")
    try:
        index = json_loads(data)
    except ValueError as e:  # (JSONDecodeError, UnicodeDecodeError) naming neither the file nor a fix
        raise Refused(f"its {INDEX_NAME} is not JSON ({short_error(e, 80)}); {RESAVE}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise Refused(f"its {INDEX_NAME} has no weight_map of tensor names to shard files; {RESAVE}")
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if os.path.basename(shard) != shard or shard in (".", "..") or not shard.endswith(".safetensors"):
            raise Refused(f"its {INDEX_NAME} names {shard!r:.60} as a shard, not a .safetensors file beside it; {RESAVE}")
        if not os.path.lexists(path / shard):
            raise Refused(f"its shard {shard!r:.60} (named in {INDEX_NAME}) is missing; copy the whole directory, or "
                          f"{RESAVE}")
        _must_be_a_file(path / shard)
        tensors = _read_safetensors(path / shard)
        names = {k for k, v in weight_map.items() if v == shard}
        if tensors.keys() != names:
            odd = sorted(names ^ tensors.keys())[0]
            raise Refused(f"its shard {shard!r:.60} and {INDEX_NAME} disagree about {odd!r:.60} (in one, not the "
                          f"other); {RESAVE}")
        state.update(tensors)
    return state


def _read_bin(path: Path, *, mapped: bool = False) -> dict[str, torch.Tensor]:
    """pytorch_model.bin: read without running code from it (weights_only), and a dict of named tensors
    (`mapped`: its tensors mapped from the file, for a check that reads none of them)."""
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the error below says it all
            warnings.simplefilter("ignore")
            zipped = mapped and zipfile.is_zipfile(path)  # (torch.load maps only the zip format, torch >= 1.6's)
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipped)
    except pickle.UnpicklingError:
        raise ValueError(f"its {path.name} holds objects that would run code when loaded (refused), or is not a "
                         "PyTorch file") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, KeyError, IndexError, TypeError, AttributeError,
            struct.error) as e:  # (struct.error: a file of a few bytes, read as an old-format header)
        raise ValueError(f"its {path.name} is damaged or not a PyTorch file ({short_error(e, 80)})") from None
    if not isinstance(state, dict):
        raise ValueError(f"its {path.name} holds a {type(state).__name__}; expected a dict of named tensors")
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor) or value.layout != torch.strided:
            what = (f"the key {key!r:.40}, not a name" if not isinstance(key, str) else
                    f"a {value.layout} tensor" if isinstance(value, torch.Tensor) else f"a {type(value).__name__}")
            what += "" if not isinstance(key, str) else f" under {key!r:.40}"
            raise ValueError(f"its {path.name} holds {what}; expected a dict of named tensors")
    return state


def from_pretrained(name_or_dir: str, **overrides) -> GPT:
    """HF GPT-2 weights from a local HF directory or a hub name ('gpt2', 'gpt2-medium', ...). What the
    directory holds is checked here, before anything is built: ValueError naming what does not fit."""
    path = _resolve_dir(name_or_dir)
    config = _checked_config(path, **overrides)
    weights = _read_state_dict(path)
    if config.tie_embeddings and _own_head(weights):
        # as transformers does ("both are present ... with different values, so we will NOT tie them"): the
        # stored head is the model's, whatever the config says; tied, the logits would be another model's
        config = dataclasses.replace(config, tie_embeddings=False)
    if not config.tie_embeddings and "lm_head.weight" not in weights:
        # transformers would start the head from random numbers: no model to compare with, so refused
        raise Refused("config.json says tie_word_embeddings=false but the weights hold no lm_head.weight; if the "
                      "head is the embedding (wte), set tie_word_embeddings to true in config.json")
    state = state_from_hf(weights, config.tie_embeddings)

    def weights(model: GPT) -> dict[str, torch.Tensor]:
        # the meta model's shapes only: a config.json that disagrees with its weights (or asks for an absurd
        # size) is refused before any memory is spent on it
        expected = model.state_dict()
        problem = tensors_problem(state, expected, config.tie_embeddings)
        if problem:
            raise ValueError(problem)
        # In the model's dtype (fp32) whatever the file keeps (fp16, bf16), and contiguous: the Conv1D matrices
        # come transposed (a view)
        return {k: v.to(expected[k].dtype).contiguous() for k, v in state.items()}

    return filled_model(config, weights, strict=False)  # (not strict: a tied lm_head.weight, pointed at wte's)


def check_pretrained(name_or_dir: str, **overrides) -> None:
    """What from_pretrained checks before reading a weight: config.json (of a hub model, downloaded alone) and,
    in a local directory, which weight file there is, opened (a safetensors header, a .bin's tensors mapped, not
    read; a sharded save's shards are read by the load). The same exceptions, for the same directories."""
    path = _resolve_dir(name_or_dir, patterns=("config.json",))
    _checked_config(path, **overrides)
    if Path(name_or_dir).is_dir():
        name = _weights_name(path)
        if name == "model.safetensors":
            with _safetensors_errors(path / name), safe_open(str(path / name), framework="pt"):
                pass  # its header read and checked
        elif name != INDEX_NAME:
            _read_bin(path / name, mapped=True)


def _checked_config(path: Path, **overrides) -> GPTConfig:
    """The GPTConfig of the directory's config.json (`overrides` replacing fields), checked."""
    if not os.path.lexists(path / "config.json"):
        raise FileNotFoundError(f"{path} has no config.json; expected an HF GPT-2 directory")
    _must_be_a_file(path / "config.json")
    data = read_user_file(path / "config.json", "config.json", limit=MAX_CONFIG_BYTES, fix="pass an HF GPT-2 directory")
    try:
        hf = json_loads(data)
    except ValueError as e:  # (JSONDecodeError, UnicodeDecodeError) naming neither the file nor a fix
        raise ValueError(f"its config.json is not JSON ({short_error(e, 80)})") from None
    problem = model_type_problem(hf)
    if problem:  # another model's directory: its message says what to pass instead
        raise Refused(problem)
    problem = hf_config_problem(hf)
    if problem:
        raise ValueError(problem)
    config = config_from_hf(hf, **overrides)
    problem = model_config_problem(config, prefix="config.json's ")
    if problem:  # checked before anything is built: an absurd size would spin even on the meta device
        raise ValueError(problem)
    return config


def _own_head(weights: dict[str, torch.Tensor]) -> bool:
    """A stored lm_head.weight that is not wte's (transformers compares them so, torch.equal in fp32)."""
    head, wte = weights.get("lm_head.weight"), weights.get("transformer.wte.weight", weights.get("wte.weight"))
    if head is None or wte is None:
        return False
    return head.shape != wte.shape or not torch.equal(head.float(), wte.float())


HF_SIZES = ("n_positions", "vocab_size", "n_layer", "n_head", "n_embd")  # config.json's, under HF's names
HF_FLAGS = ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "scale_attn_weights", "tie_word_embeddings")


def model_type_problem(hf) -> str | None:
    """config.json's model_type when it is not GPT-2's, with what to pass instead; None otherwise (or when
    config.json is no object: hf_config_problem says that). Checked first: a Llama's or Qwen3's config.json
    would otherwise be refused for lacking n_positions."""
    model_type = hf.get("model_type", "gpt2") if isinstance(hf, dict) else "gpt2"  # (absent in old GPT-2 configs)
    if model_type == "gpt2":
        return None
    ours = {"smallgpt": "this is an export of ours: ", "llama": "for an export of ours, ",
            "qwen3": "for an export of ours, "}.get(model_type if isinstance(model_type, str) else "")  # (only a
    # checkpoint of ours loads, not its export; a model_type of another JSON type is no name to look up)
    fix = (f"{ours}pass the checkpoint it was exported from (its training out_dir or ckpt.pt)" if ours else
           "pass an HF GPT-2 directory, or one of our checkpoints")
    return f"config.json's model_type is {model_type!r:.40}: only GPT-2 directories load here; {fix}"


def hf_config_problem(hf) -> str | None:
    """What in HF GPT-2's config.json (parsed) this GPT cannot read or express, named as config.json names
    it; None if nothing. Every field config_from_hf reads is checked here, its type first (model_type is
    model_type_problem's)."""
    if not isinstance(hf, dict):
        return f"config.json holds a {type(hf).__name__}, not a JSON object"
    for name in HF_SIZES:
        value = hf.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            return f"config.json's {name} must be a positive integer, got {value!r:.40}"
    act = hf.get("activation_function", "gelu_new")
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        return f"unsupported activation_function {act!r:.40} in config.json; expected one of {sorted(HF_ACTIVATIONS)}"
    if hf.get("n_inner") not in (None, 4 * hf["n_embd"]):
        return f"unsupported n_inner={hf['n_inner']!r:.40} in config.json: this GPT uses 4 * n_embd"
    for flag in HF_FLAGS:
        if flag in hf and not isinstance(hf[flag], bool):
            return f"config.json's {flag} must be true or false, got {hf[flag]!r:.40}"
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if hf.get(flag):
            return f"unsupported {flag}=true in config.json"
    if hf.get("scale_attn_weights") is False:
        return "unsupported scale_attn_weights=false in config.json"
    eps = hf.get("layer_norm_epsilon", 1e-5)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps < 1:
        return f"config.json's layer_norm_epsilon must be a number in (0, 1), got {eps!r:.40}"
    return None


def tensors_problem(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], tied: bool) -> str | None:
    """What keeps HF weights (under our names) from loading into a model of `expected`'s shapes."""
    unexpected = sorted(state.keys() - expected.keys())
    if unexpected:
        return f"unexpected tensor {clipped(unexpected[0], 80)} in the HF checkpoint"
    missing = sorted({k for k in expected if k != "lm_head.weight" or not tied} - state.keys())
    if missing:
        return f"the HF checkpoint lacks {missing[:4]}"
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            return f"shape mismatch for {key}: HF {tuple(tensor.shape)} vs ours {tuple(expected[key].shape)}"
        if not tensor.is_floating_point():  # load_state_dict would cast ints, bools, complex numbers silently
            return f"{key} holds {str(tensor.dtype).removeprefix('torch.')} values, not floating point ones"
    for key, tensor in state.items():  # after the shapes: no value of a tensor that does not fit is looked at
        if not torch.isfinite(tensor).all():  # sampling would fail on them, training stop at its first step
            return f"non-finite weights (NaN or inf in {key})"
    return None


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Atomically, with the umask's mode like our other outputs (safetensors' save_file alone makes 0600)."""
    with atomic_write(path) as tmp:
        mode = tmp.stat().st_mode  # fileio made it with 0o666 & ~umask
        try:
            save_file(tensors, str(tmp), metadata={"format": "pt"})
        except SafetensorError as e:  # how safetensors reports a full disk: an OSError to the callers
            raise OSError(f"{type(e).__name__}: {e}") from None
        tmp.chmod(mode & 0o777)


def write_json(path: Path, obj: dict) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def write_hf_weights(model: GPT, out_dir, eos_token_id: int | None = None, vocab_size: int | None = None) -> None:
    """GPT-2's config.json and model.safetensors in `out_dir` (which must exist), each written atomically;
    vocab_size crops a padded vocabulary (model.hf.cropped_state)."""
    out = Path(out_dir)
    if eos_token_id is None and model.config.vocab_size > 50256:
        eos_token_id = 50256  # GPT-2's <|endoftext|>
    write_safetensors(gpt2_tensors(model, vocab_size), out / "model.safetensors")
    write_json(out / "config.json", hf_config(model, eos_token_id, vocab_size))


def write_hf_model(model: GPT, out_dir: Path, vocab_size: int, eos_token_id: int | None) -> str:
    """config.json and model.safetensors (and the modeling code for smallgpt) in `out_dir`, in the format
    hf_format picks, the vocabulary cut to `vocab_size`. Returns the format."""
    cfg, out = model.config, Path(out_dir)
    fmt = hf_format(cfg)
    if fmt == "gpt2":
        write_hf_weights(model, out, eos_token_id, vocab_size)
    elif fmt in ("llama", "qwen3"):
        write_safetensors(llama_tensors(model, vocab_size), out / "model.safetensors")
        config = (llama_config if fmt == "llama" else qwen3_config)(cfg, vocab_size, eos_token_id)
        write_json(out / "config.json", config)
    else:
        write_safetensors(cropped_state(model, vocab_size), out / "model.safetensors")
        write_json(out / "config.json", smallgpt_config(cfg, vocab_size, eos_token_id))
        atomic_write_bytes(out / REMOTE_CODE.name, REMOTE_CODE.read_bytes())  # the code, as it is
    return fmt
