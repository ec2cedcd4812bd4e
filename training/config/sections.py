"""The training config: typed dataclass sections with defaults, a YAML that overrides only what it
changes, and `--section.key=value` CLI overrides on top. Every key is one `setting(...)` (settings.py)
that carries its help line, whether a resume may change it, and its check; every bad value is a
one-line UserError. Reading YAML and argv is training/config/reading.py.

    cfg = load_config(["--config", "small", "--train.lr=3e-4", "--wandb.mode", "disabled"])
    cfg.to_dict()  ->  nested dict of plain values;  Config.from_dict(d)  ->  the same Config
"""
from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from data.config import DataConfig
from errors import UserError
from checkpoint.model_config import model_config_problem
from model.gpt import GPTConfig
from runtime.precision import DTYPE_NAMES
from settings import (EVAL_ITERS, EVERY, EVERY_OR_OFF, ITERS, MAX_TOKENS_PER_STEP, WARMUP_ITERS, Freezable, all_of,
                      at_least, at_most, check_fields, help_of, in_range, may_change_on_resume, not_blank, one_of,
                      setting, value_before)

from . import reading
from ..float8 import RECIPES as FLOAT8_RECIPES
from ..optim import OPTIMIZERS

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


MAX_DURATION_S = 1e9
_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


# each duration key's accepted range, said whole in each of its messages: a key where 0 is refused must
# not be told "0 = off" (train.collective_timeout was, by the shared message)
DURATION_RANGES = {
    "train.time_budget": f"a duration like 90s, 8m or 1h (0 = off), at most {MAX_DURATION_S:.0e} s (about 30 years)",
    "train.collective_timeout": f"a positive duration like 90s, 10m or 1h, at most {MAX_DURATION_S:.0e} s (about 30 years)",
}
ZERO_IS_OFF = {"train.time_budget"}  # the duration keys 0 turns off; for the others 0 is refused


def parse_duration(text: str, name: str = "train.time_budget") -> float:
    """'90s', '8m', '1.5h', '600' (seconds) -> seconds; '0' or '' -> 0 (off, where `name` allows it).
    Anything else: a UserError stating `name`'s whole range (DURATION_RANGES) and the value as written."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(s|sec|m|min|h)?\s*", str(text).strip().lower() or "0")
    seconds = float(m.group(1)) * _UNITS[m.group(2) or ""] if m else math.nan
    # (a 400-digit number reads as inf) a timer or timedelta can't hold more than the maximum
    if not (0 <= seconds <= MAX_DURATION_S and (seconds > 0 or name in ZERO_IS_OFF)):
        raise UserError(f"{name} must be {DURATION_RANGES[name]}, got {str(text)!r:.80}")
    return seconds



def _device(name: str) -> str | None:
    ok = name in ("auto", "cpu", "cuda", "mps") or (name.startswith("cuda:") and name[5:].isdigit())
    return None if ok else f"must be auto, cpu, cuda, cuda:N or mps, got {name!r}"


PARALLEL = ("ddp", "fsdp")
AUTO_BATCH = "auto"


def _batch_size(v: int | str) -> str | None:
    if v == AUTO_BATCH or (isinstance(v, int) and v >= 1):
        return None
    return f"must be >= 1, got {v}" if isinstance(v, int) else f"must be a positive integer or auto, got {v!r}"


# far past any rate that trains (a diverging run stops at the non-finite guard), and low enough that the
# schedule's lr * (step + 1) stays a finite float for every step < 2**63
MAX_LR = 1e30
LR_HINT = "; a typical value is 1e-3 for small models, 6e-4 for GPT-2"
SEED = in_range(0, 2**63, "[0, 2**63)", "; e.g. 1337")
# a sampling round during training: at most this many prompts x tokens (16 x 1024 tokens, a few seconds)
MAX_SAMPLE_PROMPTS, MAX_SAMPLE_TOKENS, MAX_PROMPT_CHARS = 16, 1024, 1000


def _sample_prompts(prompts: list) -> str | None:
    if not isinstance(prompts, list):
        return f"must be a list of strings, got {prompts!r:.80}"
    if len(prompts) > MAX_SAMPLE_PROMPTS:
        return f"holds {len(prompts)} prompts, over the {MAX_SAMPLE_PROMPTS} a sampling round may take; keep fewer"
    for i, p in enumerate(prompts, 1):
        if not isinstance(p, str):
            return f"prompt {i} must be a string, got {p!r:.80}; quote it"
        if not p:
            return f"prompt {i} is empty: a sample starts from its prompt; remove it ([] = the data's default prompts)"
        if not reading.utf8(p):  # a command line's bytes that are not UTF-8 (or a \ud800 escape): untokenizable
            return f"prompt {i} is not valid UTF-8 text, got {p!r:.80}; write it in UTF-8"
        if len(p) > MAX_PROMPT_CHARS:
            return f"prompt {i} is {len(p):,} characters, over {MAX_PROMPT_CHARS}; shorten it"
    return None


def _softcap(cap: float) -> str | None:
    # past float32's range (5e-324 is 0 there, 1e308 inf) the logits are nan from the first step
    ok = cap == 0 or 1e-6 <= cap <= 1e6
    return None if ok else f"must be 0 (off) or from 1e-6 to 1e6, got {cap}; e.g. 30 (Gemma 2's final-logit cap)"


# what model.init_from (another run, HF GPT-2) brings from its source: every field of the architecture (not
# block_size, which may be cut; not dropout or attn_backend, which are how it runs; not zero_init_proj, which is
# only how fresh weights start). The saved config says what was trained; a resume compares none of them.
ARCH_KEYS = ("n_layer", "n_head", "n_embd", "bias", "gelu_approximate", "layer_norm_eps", "pos_embedding", "rope_base",
             "norm", "qk_norm", "mlp_act", "tie_embeddings", "logit_softcap")


@dataclass
class ModelSection(Freezable):
    """The `model:` section: GPTConfig's fields under the same names (checkpoint/model_config.py checks them),
    with smaller defaults, plus where the weights start from. `gpt_config` converts it."""
    block_size: int = setting(128, "the longest context, in tokens")
    vocab_size: int = setting(0, "0: the tokenizer's vocabulary; a larger value pads the embedding (e.g. 50304 = 786 x "
                                 "64 for GPT-2, which suits GPU matmul tiles); padded ids are never targets and are "
                                 "never sampled")
    n_layer: int = setting(4, "transformer blocks")
    n_head: int = setting(4, "attention heads per block; n_embd must divide into them")
    n_embd: int = setting(128, "width of the residual stream")
    dropout: float = setting(0.0, "on attention weights, residual branches and embeddings, while training", resume=True)
    bias: bool = setting(True, "biases in Linear and LayerNorm, as in GPT-2; False is a little faster and no worse")
    attn_backend: str = setting("sdpa", '"sdpa": F.scaled_dot_product_attention, "manual": the textbook math',
                                resume=True)
    gelu_approximate: str = setting("tanh", 'GPT-2 was trained with the tanh approximation ("gelu_new" in HF)')
    layer_norm_eps: float = setting(1e-5, "the epsilon of every norm")
    pos_embedding: str = setting("learned", '"learned": a wpe table (GPT-2); "rope": rotary embeddings of q and k')
    rope_base: float = setting(10000.0, "rotary: the angle of pair i at position p is p * rope_base ** (-2i / head_dim)")
    norm: str = setting("layernorm", '"layernorm" (GPT-2) or "rmsnorm" (no mean subtraction, no bias)')
    qk_norm: bool = setting(False, "RMS-normalise each head's q and k before attention: bounded logits, stabler at "
                                   "high lr")
    mlp_act: str = setting("gelu", '"gelu" (GPT-2, see gelu_approximate), "relu2": relu(x) ** 2, or "swiglu": '
                                   "silu(gate) * up with a 2/3-width hidden layer (Llama)")
    tie_embeddings: bool = setting(True, "the LM head shares wte's weight (GPT-2); False gives it its own")
    zero_init_proj: bool = setting(False, "zero-init the residual projections (and an untied head): each block starts "
                                          "as identity")
    logit_softcap: float = setting(0.0, "> 0: logits = cap * tanh(logits / cap), which keeps them in (-cap, cap)",
                                   check=_softcap)
    init_from: str = setting("scratch", '"scratch" | an HF GPT-2 name or directory ("gpt2", "gpt2-medium", ...) | a '
                                        "checkpoint (file or out_dir)", resume=True, path=True,
                             check=not_blank("use 'scratch', an HF GPT-2 name/dir, or a checkpoint path"))

    def gpt_config(self, vocab_size: int) -> GPTConfig:
        """The model's config: these fields, with the vocabulary size decided from the data."""
        names = {f.name for f in dataclasses.fields(GPTConfig)}
        return GPTConfig(**{k: v for k, v in dataclasses.asdict(self).items() if k in names} | {"vocab_size": vocab_size})

    def validate(self) -> None:
        check_fields(self, "model")
        if isinstance(self.vocab_size, int) and self.vocab_size < 0:
            raise UserError(f"model.vocab_size must be 0 (the tokenizer's) or a positive integer, got {self.vocab_size}")
        problem = model_config_problem(self.gpt_config(self.vocab_size or 1), prefix="model.",  # the one check
                                       vocab_known=bool(self.vocab_size))
        if problem:
            raise UserError(problem)


@dataclass
class TrainSection(Freezable):
    batch_size: int | str = setting(12, "sequences per micro-step per rank; auto: the largest that fits this device "
                                        "(measured), with the micro-steps that keep train.global_batch_size",
                                    check=_batch_size)
    grad_accum_steps: int = setting(1, "GLOBAL micro-steps per optimizer step, split over the ranks (batch_size auto "
                                       "decides them instead)", check=at_least(1))
    global_batch_size: int = setting(0, "sequences per optimizer step over all ranks; read with batch_size auto (e.g. "
                                        "512 = 16 x 32 for GPT-2 124M); 0 = batch_size x grad_accum_steps",
                                     check=at_least(0))
    max_iters: int = setting(2000, "optimizer steps", resume=True, check=ITERS)
    lr: float = setting(1e-3, "peak learning rate", resume=True,
                        check=all_of(at_least(0, LR_HINT), at_most(MAX_LR, LR_HINT)))
    min_lr: float = setting(1e-4, "cosine floor", resume=True)
    warmup_iters: int = setting(100, "linear warmup steps", resume=True, check=WARMUP_ITERS)
    weight_decay: float = setting(0.1, "on matrices and embeddings only", resume=True, check=at_least(0))
    beta1: float = setting(0.9, "AdamW's first-moment decay", resume=True, check=in_range(0, 1))
    beta2: float = setting(0.99, "AdamW's second-moment decay (0.95 for large models and batches)", resume=True,
                           check=in_range(0, 1))
    grad_clip: float = setting(1.0, "max global grad norm; 0 disables clipping (the norm is still logged)", resume=True,
                               check=at_least(0))
    optimizer: str = setting("adamw", '"adamw", or "muon": Muon for the blocks\' matrices, AdamW (at lr) for the rest',
                             check=one_of(*OPTIMIZERS))
    muon_lr: float = setting(0.02, "Muon's peak learning rate (the schedule scales it like lr)", resume=True,
                             check=all_of(at_least(0, "; e.g. 0.02"), at_most(MAX_LR, "; e.g. 0.02")))
    muon_momentum: float = setting(0.95, "Muon's (Nesterov) momentum", resume=True, check=in_range(0, 1))
    muon_ns_steps: int = setting(5, "Muon's Newton-Schulz iterations per step (fewer: cheaper, a rougher "
                                    "orthogonalisation)", resume=True, check=in_range(1, 21, "[1, 20]"))
    muon_split_qkv: bool = setting(True, "Muon orthogonalises attention's q, k and v weights as three (C, C) matrices, "
                                         "not c_attn's fused (3C, C) one (as modded-nanogpt does)", resume=True,
                                   before=False)
    dtype: str = setting("auto", "auto | float32 | bfloat16 | float16", resume=True, check=one_of(*DTYPE_NAMES))
    compile: bool = setting(False, "torch.compile the training forward/backward", resume=True)
    cuda_graph: bool = setting(True, "on one CUDA device, replay the training step as one CUDA graph: a small model's "
                                     "step costs its kernels, not their launches (not with compile, several ranks, "
                                     "float16, float8, activation checkpointing, batch_size auto or conversations)",
                               resume=True)
    float8: str = setting("off", "float8 matmuls in the blocks' Linear layers (torchao; CUDA compute capability 8.9+: "
                                 "H100, L4, RTX 4090; pays with compile): off | tensorwise | rowwise", resume=True,
                          check=one_of("off", *FLOAT8_RECIPES))
    parallel: str = setting("ddp", "several ranks: ddp (each holds the whole model) or fsdp (each holds 1/N of the weights, "
                                   "gradients and optimizer state; sharded checkpoints, ckpt.dcp/); 1 rank: neither",
                            check=one_of(*PARALLEL))
    activation_checkpointing: bool = setting(False, "recompute each block's forward in the backward instead of keeping "
                                                    "its activations: ~1/3 more compute, far less memory", resume=True)
    device: str = setting("auto", "auto (cuda > mps > cpu) | cpu | cuda | cuda:N | mps", resume=True, check=_device)
    seed: int = setting(1337, "model init, dropout, training batches", check=SEED)
    eval_seed: int = setting(4242, "the fixed eval batches", resume=True, check=SEED)
    eval_interval: int = setting(250, "evaluate every N steps, and at the last step", resume=True, check=EVERY)
    eval_iters: int = setting(20, "batches per split per eval", resume=True, check=EVAL_ITERS)
    eval_full: bool = setting(False, "the last eval also reads the whole val split in order, every token once: its "
                                     "exact loss (val/loss_full), where eval_iters' random batches give an estimate; "
                                     "costs one forward pass over the split", resume=True)
    log_interval: int = setting(10, "read the loss back from the device every N steps", resume=True, check=EVERY)
    checkpoint_interval: int = setting(0, "write ckpt.pt every N steps; 0 = at each eval (and always at the end)",
                                       resume=True, check=EVERY_OR_OFF)
    out_dir: str = setting("out", "checkpoints (ckpt.pt, best.pt), metrics.jsonl and wandb's files go here",
                           resume=True, path=True, check=not_blank("set it to a directory, e.g. out/small"))
    resume: str = setting("auto", "auto: continue from out_dir/ckpt.pt if there; never: refuse an existing one",
                          resume=True, check=one_of("auto", "never"))
    peak_flops: float = setting(0.0, "device peak FLOP/s for MFU; 0 = GPU table / CPU matmul probe (cached per "
                                     "machine)", resume=True, check=at_least(0))
    collective_timeout: str = setting("10m", "several ranks: the longest any collective waits for the other ranks "
                                             "(a rank that died or hangs), e.g. 90s, 10m; then each rank stops with "
                                             "one line; rank 0's long work (data preparation, its eval, a checkpoint "
                                             "write) is waited for apart", resume=True)
    time_budget: str = setting("0", "wall time the run may take, e.g. 8m, 90s, 1h: the step is timed first, then "
                                    "max_iters (at most the value above) and warmup_iters are fixed to fit, evals and "
                                    "set-up included; 0 = off")

    def validate(self) -> None:
        check_fields(self, "train")
        parse_duration(self.time_budget)  # a UserError naming train.time_budget when it is not a duration
        parse_duration(self.collective_timeout, "train.collective_timeout")
        if self.batch_size == AUTO_BATCH and not self.global_batch_size:
            raise UserError("train.batch_size auto needs train.global_batch_size, the sequences per optimizer step "
                            "over all ranks: e.g. --train.global_batch_size=512 (gpt2_124m's 16 x 32)")
        if self.batch_size != AUTO_BATCH and self.global_batch_size not in (0, self.batch_size * self.grad_accum_steps):
            raise UserError(f"train.global_batch_size={self.global_batch_size} disagrees with train.batch_size x "
                            f"train.grad_accum_steps = {self.batch_size} x {self.grad_accum_steps}; set one of them "
                            "(global_batch_size with batch_size auto, or 0)")
        if not 0 <= self.min_lr <= self.lr:
            raise UserError(f"train.min_lr must be between 0 and train.lr ({self.lr}), got {self.min_lr}; e.g. lr/10")


HELLASWAG_ITEMS = 10_042  # HellaSwag's validation split: a larger batch is the same one batch


@dataclass
class EvalSection(Freezable):
    hellaswag_interval: int = setting(0, "run HellaSwag every N steps (and at the last one); 0 = never", resume=True,
                                      check=EVERY_OR_OFF)
    hellaswag_data: str = setting("", "a local jsonl in HellaSwag's original format; empty = Rowan/hellaswag from the "
                                      "HF hub", resume=True, path=True)
    hellaswag_limit: int = setting(0, "score the first N items only; 0 = all 10042", resume=True,
                                   check=at_least(0, " (0 turns it off)"))
    hellaswag_batch_size: int = setting(8, "items per forward (x 4 endings)", resume=True,
                                        check=all_of(at_least(1), at_most(HELLASWAG_ITEMS, " (the items there are)")))
    sample_interval: int = setting(0, "every N steps (and at the last one) rank 0 samples eval.sample_tokens tokens "
                                      "after each prompt, with a fixed seed, to the console, metrics.jsonl and wandb; "
                                      "0 = never", resume=True, check=EVERY_OR_OFF)
    sample_prompts: list[str] = setting(dataclasses.MISSING, 'the prompts to sample from, e.g. ["ROMEO:", "JULIET:"] '
                                        "(on the command line a YAML list, or one prompt); [] = the data's default",
                                        resume=True, default_factory=list, check=_sample_prompts)
    sample_tokens: int = setting(64, "tokens generated after each prompt", resume=True,
                                 check=in_range(1, MAX_SAMPLE_TOKENS + 1, f"[1, {MAX_SAMPLE_TOKENS}]",
                                                "; a sample is read, not trained on: e.g. 64"))
    inspect_interval: int = setting(0, "every N steps (and at the last one) the attention maps and per-token surprisal "
                                       "of the val split's first tokens go to wandb and <out_dir>/inspect/step-<N>/; "
                                       "0 = never", resume=True, check=EVERY_OR_OFF)

    def validate(self) -> None:
        check_fields(self, "eval")


@dataclass
class WandbSection(Freezable):
    mode: str = setting("online", "online (falls back to offline without an API key) | offline | disabled",
                        resume=True, check=one_of("online", "offline", "disabled"))
    project: str = setting("smallgpt", "the wandb project the run goes to", resume=True,
                           check=not_blank("set it to a project name, e.g. smallgpt"))
    run_name: str = setting("", "empty: wandb picks one", resume=True)

    def validate(self) -> None:
        check_fields(self, "wandb")


@dataclass
class Config(Freezable):
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainSection = dataclasses.field(default_factory=TrainSection)
    eval: EvalSection = dataclasses.field(default_factory=EvalSection)
    wandb: WandbSection = dataclasses.field(default_factory=WandbSection)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {s.name: dataclasses.asdict(getattr(self, s.name)) for s in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "config") -> "Config":
        cfg = cls()
        reading.apply_overrides(cfg, d, source=source)
        return cfg

    def validate(self) -> None:
        """Every section's field checks, then the checks across fields. The messages name the key."""
        for s in dataclasses.fields(self):
            getattr(self, s.name).validate()
        if self.eval.hellaswag_interval and self.data.tokenizer == "char":  # before anything is claimed or built
            raise UserError("eval.hellaswag_interval needs a tokenizer that encodes English prose, and data.tokenizer="
                            "char is a character-level tokenizer (its vocabulary lacks characters HellaSwag uses); use "
                            "data.tokenizer=gpt2 or bpe:<n>, or eval.hellaswag_interval=0")
        t = self.train
        factors = ({"train.global_batch_size": t.global_batch_size} if t.batch_size == AUTO_BATCH else
                   {"train.batch_size": t.batch_size, "train.grad_accum_steps": t.grad_accum_steps})
        factors["model.block_size"] = self.model.block_size
        tokens = math.prod(factors.values())
        if tokens > MAX_TOKENS_PER_STEP:  # arithmetic, before anything is built
            # the fix names the largest factor (found from outside: batch_size 1e9 was told to lower grad_accum_steps 1)
            largest = max(factors, key=factors.get)
            product = " x ".join(f"{k} ({v:,})" for k, v in factors.items())
            raise UserError(f"{product} = {tokens:,} tokens per optimizer step, over the {MAX_TOKENS_PER_STEP:,} any run "
                            f"could use (GPT-3 trained on 3.2M): a step would never end; lower {largest}")


def section_keys() -> dict[str, list[str]]:
    return reading.section_keys(Config())


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
    config_name, overrides = reading.parse_argv([a for a in argv if a != "--print-config"], section_keys())
    cfg = Config()
    if config_name is not None:
        path = reading.find_config_file(config_name, CONFIG_DIR)
        reading.apply_overrides(cfg, reading.read_yaml(path), source=str(path))
    for key, value in overrides:
        reading.apply_overrides(cfg, reading.nest(key, value), source="command line")
    cfg.validate()
    cfg.freeze()  # from here on every decision goes into the run plan (training/plan.py), never into cfg
    if print_config:
        print(to_yaml(cfg))
        raise SystemExit(0)
    return cfg


def describe_defaults() -> str:
    """Every key, per section: --section.key=default (type)  its help line."""
    lines = []
    for s in dataclasses.fields(Config):
        obj = getattr(Config(), s.name)
        hints = typing.get_type_hints(type(obj))
        lines.append(f"{s.name}:")
        for f in dataclasses.fields(obj):
            tname = getattr(hints[f.name], "__name__", str(hints[f.name]))
            lines.append(f"  --{s.name}.{f.name}={getattr(obj, f.name)!r}  ({tname})  {help_of(f)}")
    return "\n".join(lines)


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=False).rstrip()


# ------------------------------------------------------------------------------ resume compatibility

def _saved_fields(saved: dict[str, Any], cfg: Config):
    """(section name, section, field, the saved section's values) for every key of `cfg` whose section
    the saved config holds as a dict."""
    for s in dataclasses.fields(cfg):
        old_values = saved.get(s.name) if isinstance(saved, dict) else None
        if isinstance(old_values, dict):
            obj = getattr(cfg, s.name)
            for f in dataclasses.fields(obj):
                yield s.name, obj, f, old_values


def keep_what_older_runs_did(saved: dict[str, Any], cfg: Config) -> tuple[Config, list[str]]:
    """For a resumed run whose saved config lacks a key added since (a setting with `before`): (the config
    with the key set to the value that reproduces that run, a new frozen Config; one line per key set)."""
    notes, changed = [], cfg.to_dict()
    for section, obj, f, old_values in _saved_fields(saved, cfg):
        before = value_before(f)
        if before is not dataclasses.MISSING and f.name not in old_values and getattr(obj, f.name) != before:
            changed[section][f.name] = before
            notes.append(f"{section}.{f.name} = {before!r}: the resumed run was started before this key existed, "
                         "and this value continues it as it was")
    return (Config.from_dict(changed).freeze() if notes else cfg), notes


def resume_conflicts(saved: dict[str, Any], new: Config) -> list[str]:
    """Keys whose saved value differs from the new config and that may not change on resume (a field's
    `resume=False`: it changes what the weights or the data mean)."""
    out = []
    # where the saved run's weights came from decides (a new init_from does not apply on resume): from a source,
    # the architecture and vocabulary are the source's (ARCH_KEYS, vocab_size), as saved
    model = saved.get("model") if isinstance(saved, dict) else None
    from_source = (model.get("init_from") if isinstance(model, dict) else "scratch") not in ("scratch", None)
    for section, obj, f, old_values in _saved_fields(saved, new):
        value = getattr(obj, f.name)
        if from_source and section == "model" and f.name in (*ARCH_KEYS, "vocab_size"):
            continue
        if not may_change_on_resume(f) and f.name in old_values and old_values[f.name] != value:
            out.append(f"{section}.{f.name}: {old_values[f.name]!r} -> {value!r}")
    return out
