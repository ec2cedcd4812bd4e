"""The training config: typed dataclass sections with defaults, a YAML that overrides only what it
changes, and `--section.key=value` CLI overrides on top. Every bad value is a one-line UserError.

    cfg = load_config(["--config", "small", "--train.lr=3e-4", "--wandb.mode", "disabled"])
    cfg.to_dict()  ->  nested dict of plain values;  Config.from_dict(d)  ->  the same Config
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import io
import math
import tokenize
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from data.config import DataConfig
from errors import UserError
from model.gpt import GPTConfig
from runtime.precision import DTYPE_NAMES
from .budget import parse_duration
from .optim import OPTIMIZERS

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"

RESUME_MODES = ("auto", "never")
WANDB_MODES = ("online", "offline", "disabled")


@dataclass
class ModelSection(GPTConfig):
    """The `model:` section: every GPTConfig field, with the same names and the same checks
    (GPTConfig.validate), smaller defaults, and where the weights start from."""
    block_size: int = 128  # the longest context, in tokens
    # 0: the tokenizer's vocabulary; a larger value pads the embedding (e.g. 50304 = 786 x 64 for GPT-2,
    # which suits GPU matmul tiles); padded ids are never targets and are never sampled
    vocab_size: int = 0
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads per block; n_embd must divide into them
    n_embd: int = 128  # width of the residual stream
    # "scratch" | an HF GPT-2 name or directory ("gpt2", "gpt2-medium", ...) | a checkpoint (file or out_dir)
    init_from: str = "scratch"

    def __post_init__(self) -> None:
        pass  # checked by validate() once the YAML and the CLI have been applied

    def validate(self) -> None:
        if isinstance(self.vocab_size, int) and self.vocab_size < 0:
            raise ValueError(f"GPTConfig.vocab_size must be 0 (the tokenizer's) or a positive integer, got {self.vocab_size}")
        self.gpt_config(self.vocab_size or 1)  # GPTConfig.__post_init__ checks every field

    def gpt_config(self, vocab_size: int) -> GPTConfig:
        """The model's config: these fields, with the vocabulary size decided from the data."""
        return GPTConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(GPTConfig)} | {"vocab_size": vocab_size})


@dataclass
class TrainSection:
    batch_size: int = 12  # sequences per micro-step per rank
    grad_accum_steps: int = 1  # GLOBAL micro-steps per optimizer step, split over the ranks
    max_iters: int = 2000  # optimizer steps
    lr: float = 1e-3  # peak learning rate
    min_lr: float = 1e-4  # cosine floor
    warmup_iters: int = 100  # linear warmup steps
    weight_decay: float = 0.1  # on matrices and embeddings only
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.99  # AdamW's second-moment decay (0.95 for large models and batches)
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping (the norm is still logged)
    optimizer: str = "adamw"  # "adamw", or "muon": Muon for the blocks' matrices, AdamW (at lr) for the rest
    muon_lr: float = 0.02  # Muon's peak learning rate (the schedule scales it like lr)
    muon_momentum: float = 0.95  # Muon's (Nesterov) momentum
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    compile: bool = False  # torch.compile the training forward/backward
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | cuda:N | mps
    seed: int = 1337  # model init, dropout, training batches
    eval_seed: int = 4242  # the fixed eval batches
    eval_interval: int = 250  # evaluate every N steps, and at the last step
    eval_iters: int = 20  # batches per split per eval
    log_interval: int = 10  # read the loss back from the device every N steps
    checkpoint_interval: int = 0  # write ckpt.pt every N steps; 0 = at each eval (and always at the end)
    out_dir: str = "out"  # checkpoints (ckpt.pt, best.pt), metrics.jsonl and wandb's files go here
    resume: str = "auto"  # auto: continue from out_dir/ckpt.pt if there; never: refuse an existing one
    peak_flops: float = 0.0  # device peak FLOP/s for MFU; 0 = GPU table / CPU matmul probe (cached per machine)
    # wall time the run may take, e.g. 8m, 90s, 1h: the step is timed first, then max_iters (at most the
    # value above) and warmup_iters are fixed to fit, evals and set-up included; 0 = off
    time_budget: str = "0"


@dataclass
class EvalSection:
    hellaswag_interval: int = 0  # run HellaSwag every N steps (and at the last one); 0 = never
    hellaswag_data: str = ""  # a local jsonl in HellaSwag's original format; empty = Rowan/hellaswag from the HF hub
    hellaswag_limit: int = 0  # score the first N items only; 0 = all 10042
    hellaswag_batch_size: int = 8  # items per forward (x 4 endings)


@dataclass
class WandbSection:
    mode: str = "online"  # online (falls back to offline without an API key) | offline | disabled
    project: str = "smallgpt"  # the wandb project the run goes to
    run_name: str = ""  # empty: wandb picks one


@dataclass
class Config:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    wandb: WandbSection = field(default_factory=WandbSection)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {s.name: dataclasses.asdict(getattr(self, s.name)) for s in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "config") -> "Config":
        cfg = cls()
        apply_overrides(cfg, d, source=source)
        return cfg

    def validate(self) -> None:
        validate(self)


# ----------------------------------------------------------------------------------------- CLI / YAML

HELP = """usage: python train.py [--config NAME_OR_PATH] [--section.key=value ...] [--print-config]

--config takes a YAML path, or a name in configs/ (.yaml optional). The YAML and the overrides set
only what they change; everything else keeps the defaults below. --print-config prints the resolved
config as YAML and exits: save it, edit it, and pass it back with --config.
"""


def load_config(argv: list[str] | None) -> Config:
    """Defaults <- YAML (--config) <- CLI overrides, then validated. Raises UserError on bad input.
    --help and --print-config print and exit (SystemExit(0))."""
    argv = list(argv or [])
    if any(a in ("-h", "--help") for a in argv):
        print(HELP + "\n" + describe_defaults())
        raise SystemExit(0)
    print_config = "--print-config" in argv
    config_name, overrides = _parse_argv([a for a in argv if a != "--print-config"])
    cfg = Config()
    if config_name is not None:
        path = find_config_file(config_name)
        apply_overrides(cfg, _read_yaml(path), source=str(path))
    for key, value in overrides:
        apply_overrides(cfg, _nest(key, value), source="command line")
    validate(cfg)
    if print_config:
        print(to_yaml(cfg))
        raise SystemExit(0)
    return cfg


def _parse_argv(argv: list[str]) -> tuple[str | None, list[tuple[str, str]]]:
    config_name = None
    overrides: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            raise UserError(f"unexpected argument {arg!r}; options look like --config small or --train.lr=3e-4")
        key, eq, value = arg[2:].partition("=")
        if not eq:  # "--key value"
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise UserError(f"option --{key} has no value; write --{key}=VALUE")
            value = argv[i + 1]
            i += 1
        i += 1
        if key == "config":
            config_name = value
        elif "." in key:
            overrides.append((key, value))
        else:
            raise UserError(f"unknown option --{key}; {_suggest_option(key)}")
    return config_name, overrides


def _suggest_option(key: str) -> str:
    owners = [s for s, keys in section_keys().items() if key in keys]
    if owners:
        return f"did you mean --{owners[0]}.{key}=...? overrides are written --section.key=value"
    return f"overrides are written --section.key=value with sections {', '.join(section_keys())}; see --help"


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    section, _, key = dotted.partition(".")
    if not section or not key or "." in key:
        raise UserError(f"bad option --{dotted}; overrides are written --section.key=value, e.g. --train.lr=3e-4")
    return {section: {key: value}}


def find_config_file(name: str) -> Path:
    """A path to a YAML file, or a name in configs/ with or without .yaml."""
    candidates = [Path(name).expanduser()]
    if not name.endswith((".yaml", ".yml")):
        candidates.append(Path(name + ".yaml").expanduser())
    candidates += [CONFIG_DIR / c.name for c in list(candidates) if c.parent == Path(".")]
    for c in candidates:
        if c.is_file():
            return c
    shipped = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))) or "none"
    raise UserError(f"config {name!r} not found as a file or in configs/; pass a YAML path or one of: {shipped}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key written twice in one mapping is an error (PyYAML keeps the
    last one silently, so a config could say two things and mean one)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise UserError(f"{self.name}: {key!r} appears twice (line {key_node.start_mark.line + 1}); "
                                "keep one of them")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loader = _UniqueKeyLoader(path.read_text(encoding="utf-8"))
        loader.name = str(path)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise UserError(f"config {path} is not valid YAML{at}; fix the syntax (sections of key: value)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config {path} ({e.__class__.__name__}); check the file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config {path} must be a mapping of sections (model:, data:, train:, wandb:); got {type(data).__name__}")
    return data


# ------------------------------------------------------------------------------------ typed overrides

def section_keys() -> dict[str, list[str]]:
    cfg = Config()
    return {s.name: [f.name for f in dataclasses.fields(getattr(cfg, s.name))] for s in dataclasses.fields(cfg)}


def apply_overrides(cfg: Config, d: dict[str, Any], *, source: str) -> None:
    """Set cfg.<section>.<key> = value for each entry of a nested dict, coercing to the field's type."""
    if not isinstance(d, dict):
        raise UserError(f"{source}: expected a mapping of sections, got {type(d).__name__}")
    sections = section_keys()
    for section, values in d.items():
        if section not in sections:
            raise UserError(f"{source}: unknown section {section!r}; valid sections: {', '.join(sections)}")
        if values is None:
            continue
        if not isinstance(values, dict):
            raise UserError(f"{source}: section {section!r} must be a mapping of key: value, got {values!r}")
        obj = getattr(cfg, section)
        hints = typing.get_type_hints(type(obj))
        for key, value in values.items():
            if key not in sections[section]:
                close = difflib.get_close_matches(str(key), sections[section], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise UserError(f"{source}: unknown key {section}.{key}{hint}; valid keys: {', '.join(sections[section])}")
            setattr(obj, key, coerce(value, hints[key], f"{section}.{key}", source))


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def coerce(value: Any, typ: Any, name: str, source: str = "config") -> Any:
    """Convert a YAML value or a CLI string to `typ` (bool, int, float, str, or X | None)."""
    args = typing.get_args(typ)
    if typing.get_origin(typ) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "~")):
            return None
        typ = next(a for a in args if a is not type(None))
    where = f"{source}: {name}"
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise UserError(f"{where} expects a bool (true/false), got {value!r}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                try:
                    f = float(value)
                except ValueError:
                    f = math.nan
                if math.isfinite(f) and f.is_integer():
                    return int(f)  # e.g. 5e3
        raise UserError(f"{where} expects an int, got {value!r}")
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            f = float(value)
        elif isinstance(value, str):
            try:
                f = float(value.strip())
            except ValueError:
                raise UserError(f"{where} expects a float (e.g. 3e-4), got {value!r}") from None
        else:
            raise UserError(f"{where} expects a float (e.g. 3e-4), got {value!r}")
        if not math.isfinite(f):
            raise UserError(f"{where} expects a finite float, got {value!r}")
        return f
    if typ is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # a YAML `run_name: 42`
        raise UserError(f"{where} expects a string, got {value!r}")
    raise TypeError(f"config field {name} has unsupported type {typ!r}")  # a bug in this file, not user input


def field_docs(cls: type) -> dict[str, str]:
    """Each field's description: the comment at the end of its line in the source, else the comment
    lines just above it. A subclass's comment replaces its base's (ModelSection over GPTConfig)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        lines, _ = inspect.getsourcelines(klass)
        comments = {tok.start[0] - 1: tok.string.lstrip("#").strip()  # by 0-based line of `lines`
                    for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline)
                    if tok.type == tokenize.COMMENT}
        fields = {f.name for f in dataclasses.fields(klass)}
        for i, line in enumerate(lines):
            name = line.strip().split(":", 1)[0]
            if name not in fields or line[:1] != " " or ":" not in line:
                continue
            above, j = [], i - 1
            while j >= 0 and lines[j].strip().startswith("#"):
                above.insert(0, comments[j])
                j -= 1
            docs[name] = comments.get(i) or " ".join(above) or docs.get(name, "")
    return docs


def describe_defaults() -> str:
    """Every key, per section: --section.key=default (type)  description."""
    lines = []
    cfg = Config()
    for section, keys in section_keys().items():
        obj = getattr(cfg, section)
        hints = typing.get_type_hints(type(obj))
        docs = field_docs(type(obj))
        lines.append(f"{section}:")
        for k in keys:
            tname = getattr(hints[k], "__name__", str(hints[k]))
            lines.append(f"  --{section}.{k}={getattr(obj, k)!r}  ({tname})  {docs[k]}")
    return "\n".join(lines)


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=False).rstrip()


# --------------------------------------------------------------------------------------- validation

def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise UserError(msg)


def validate(cfg: Config) -> None:
    """Semantic checks across fields. The messages name the key and a valid value."""
    t, w = cfg.train, cfg.wandb
    try:
        cfg.model.validate()
    except ValueError as e:  # GPTConfig names the field; the user wrote it as model.<field>
        raise UserError(str(e).replace("GPTConfig.", "model.")) from None
    _check(bool(cfg.model.init_from.strip()), "model.init_from is empty; use 'scratch', an HF GPT-2 name/dir, or a checkpoint path")

    cfg.data.validate()

    for k in ("batch_size", "grad_accum_steps", "max_iters", "eval_interval", "eval_iters", "log_interval"):
        _check(getattr(t, k) >= 1, f"train.{k} must be >= 1, got {getattr(t, k)}")
    for k in ("warmup_iters", "checkpoint_interval", "weight_decay", "grad_clip", "peak_flops"):
        _check(getattr(t, k) >= 0, f"train.{k} must be >= 0, got {getattr(t, k)}")
    _check(t.lr >= 0, f"train.lr must be >= 0, got {t.lr}; a typical value is 1e-3 for small models, 6e-4 for GPT-2")
    _check(0 <= t.min_lr <= t.lr, f"train.min_lr must be between 0 and train.lr ({t.lr}), got {t.min_lr}; e.g. lr/10")
    for k in ("beta1", "beta2", "muon_momentum"):
        _check(0 <= getattr(t, k) < 1, f"train.{k} must be in [0, 1), got {getattr(t, k)}")
    _check(t.optimizer in OPTIMIZERS, f"train.optimizer must be one of {', '.join(OPTIMIZERS)}, got {t.optimizer!r}")
    _check(t.muon_lr >= 0, f"train.muon_lr must be >= 0, got {t.muon_lr}; e.g. 0.02")
    _check(t.dtype in DTYPE_NAMES, f"train.dtype must be one of {', '.join(DTYPE_NAMES)}, got {t.dtype!r}")
    _check(t.resume in RESUME_MODES, f"train.resume must be one of {', '.join(RESUME_MODES)}, got {t.resume!r}")
    dev = t.device
    ok_dev = dev in ("auto", "cpu", "cuda", "mps") or (dev.startswith("cuda:") and dev[5:].isdigit())
    _check(ok_dev, f"train.device must be auto, cpu, cuda, cuda:N or mps, got {dev!r}")
    _check(bool(t.out_dir.strip()), "train.out_dir is empty; set it to a directory, e.g. out/small")
    parse_duration(t.time_budget)  # a UserError naming train.time_budget when it is not a duration
    for k in ("seed", "eval_seed"):
        _check(0 <= getattr(t, k) < 2**63, f"train.{k} must be in [0, 2**63), got {getattr(t, k)}; e.g. 1337")

    e = cfg.eval
    for k in ("hellaswag_interval", "hellaswag_limit"):
        _check(getattr(e, k) >= 0, f"eval.{k} must be >= 0 (0 turns it off), got {getattr(e, k)}")
    _check(e.hellaswag_batch_size >= 1, f"eval.hellaswag_batch_size must be >= 1, got {e.hellaswag_batch_size}")

    _check(w.mode in WANDB_MODES, f"wandb.mode must be one of {', '.join(WANDB_MODES)}, got {w.mode!r}")
    _check(bool(w.project.strip()), "wandb.project is empty; set it to a project name, e.g. smallgpt")


# ------------------------------------------------------------------------------ resume compatibility

# Changing these between a run and its resume is fine: they do not change what the weights mean.
RESUME_MAY_CHANGE = {
    "model": {"dropout", "attn_backend", "init_from"},
    "data": {"root", "local_path", "streaming", "num_proc"},
    "train": {"max_iters", "eval_interval", "eval_iters", "log_interval", "checkpoint_interval", "compile",
              "device", "dtype", "out_dir", "resume", "peak_flops",
              "lr", "min_lr", "warmup_iters", "weight_decay", "beta1", "beta2", "grad_clip", "eval_seed",
              "muon_lr", "muon_momentum"},
    "eval": {"hellaswag_interval", "hellaswag_data", "hellaswag_limit", "hellaswag_batch_size"},
    "wandb": {"mode", "project", "run_name"},
}


def resume_conflicts(saved: dict[str, Any], new: Config) -> list[str]:
    """Keys whose saved value differs from the new config and that may not change on resume."""
    new_d = new.to_dict()
    out = []
    for section, values in new_d.items():
        old_values = saved.get(section, {}) if isinstance(saved, dict) else {}
        for key, value in values.items():
            if key in RESUME_MAY_CHANGE.get(section, set()):
                continue
            if key in old_values and old_values[key] != value:
                out.append(f"{section}.{key}: {old_values[key]!r} -> {value!r}")
    return out
