"""training/config/sections.py: YAML + CLI overrides resolve with types coerced; every bad case is a one-line
UserError naming the problem and the fix; the resolved config round-trips through a checkpoint."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from errors import UserError
from checkpoint import load_checkpoint, save_checkpoint
from training.config.sections import Config, load_config, resume_conflicts, section_keys
import warm_runs

ROOT = Path(__file__).resolve().parents[1]


def _yaml(tmp_path: Path, text: str) -> str:
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return str(p)


def test_yaml_then_cli_overrides_resolve_with_types(tmp_path):
    path = _yaml(tmp_path, "model:\n  n_layer: 3\n  bias: false\ntrain:\n  lr: 1e-3\n  max_iters: 50\n  out_dir: out/x\n")
    cfg = load_config(["--config", path, "--train.max_iters=70", "--train.compile", "true", "--train.min_lr=2.5e-5",
                       "--model.dropout", "0.2", "--data.tokenizer=char", "--wandb.run_name=42"])
    # from the YAML (PyYAML reads "1e-3" as a string: it must still become the float 0.001)
    assert cfg.model.n_layer == 3 and cfg.model.bias is False
    assert cfg.train.lr == 0.001 and isinstance(cfg.train.lr, float)
    assert cfg.train.out_dir == "out/x"
    # the CLI wins over the YAML, in both --k=v and --k v forms
    assert cfg.train.max_iters == 70 and cfg.train.compile is True and cfg.train.min_lr == 2.5e-5
    assert cfg.model.dropout == 0.2 and cfg.data.tokenizer == "char" and cfg.wandb.run_name == "42"
    # untouched keys keep their documented defaults
    assert cfg.model.n_head == 4 and cfg.train.batch_size == 12 and cfg.train.resume == "auto"
    assert cfg.data.dataset == "shakespeare" and cfg.wandb.mode == "online"


@pytest.mark.parametrize("name", ["small", "small.yaml", "configs/small.yaml", str(ROOT / "configs" / "small.yaml")])
def test_config_found_by_name_or_path(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_config(["--config", name])
    assert cfg.train.out_dir == "out/small" and cfg.data.tokenizer == "gpt2"


def test_shipped_configs_load_and_validate():
    names = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    assert {"small", "small_modern", "shakespeare_char", "shakespeare_char_modern", "gpt2_124m"} <= set(names)
    for name in names:
        load_config(["--config", name])
    for name in ("small_modern", "shakespeare_char_modern"):  # the modern recipe is really on
        m, t = (lambda c: (c.model, c.train))(load_config(["--config", name]))
        assert (m.pos_embedding, m.qk_norm, m.mlp_act, t.optimizer) == ("rope", True, "relu2", "muon")
    assert load_config(["--config", "shakespeare_char"]).data.tokenizer == "char"
    big = load_config(["--config", "gpt2_124m"])
    assert (big.model.n_layer, big.model.n_embd, big.train.dtype, big.train.compile) == (12, 768, "bfloat16", True)


@pytest.mark.parametrize("raw,expected", [("true", True), ("False", False), ("1", True), ("0", False), ("yes", True)])
def test_bool_coercion(raw, expected):
    assert load_config([f"--train.compile={raw}"]).train.compile is expected


def test_int_accepts_integral_scientific_notation():
    assert load_config(["--train.max_iters=5e3"]).train.max_iters == 5000


@pytest.mark.parametrize("argv,pattern", [
    (["--trian.lr=1"], r"unknown section 'trian'; valid sections: model, data, train, eval, wandb"),
    (["--train.lrr=1"], r"unknown key train.lrr \(did you mean 'lr'\?\); valid keys: batch_size, grad_accum_steps"),
    (["--train.max_iters=ten"], r"train.max_iters expects an int, got 'ten'"),
    (["--train.max_iters=2.5"], r"train.max_iters expects an int"),
    (["--train.lr=fast"], r"train.lr expects a float \(e.g. 3e-4\), got 'fast'"),
    (["--train.lr=nan"], r"train.lr expects a finite float"),
    (["--train.compile=maybe"], r"train.compile expects a bool \(true/false\), got 'maybe'"),
    (["--train.max_iters=0"], r"train.max_iters must be >= 1, got 0"),
    (["--train.seed=18446744073709551616"], r"train.seed must be in \[0, 2\*\*63\), got 18446744073709551616"),
    (["--train.eval_seed=-1"], r"train.eval_seed must be in \[0, 2\*\*63\)"),
    (["--train.lr=-1e-3"], r"train.lr must be >= 0, got -0.001"),
    (["--train.min_lr=1e-2", "--train.lr=1e-3"], r"train.min_lr must be between 0 and train.lr"),
    (["--train.batch_size=0"], r"train.batch_size must be >= 1"),
    (["--train.grad_accum_steps=0"], r"train.grad_accum_steps must be >= 1"),
    (["--train.dtype=fp8"], r"train.dtype must be one of auto, float32, bfloat16, float16, got 'fp8'"),
    (["--train.resume=always"], r"train.resume must be one of auto, never"),
    (["--train.device=tpu"], r"train.device must be auto, cpu, cuda, cuda:N or mps"),
    (["--train.beta2=1.0"], r"train.beta2 must be in \[0, 1\)"),
    (["--train.muon_ns_steps=0"], r"train.muon_ns_steps must be in \[1, 20\], got 0"),
    (["--train.muon_ns_steps=1000000"], r"train.muon_ns_steps must be in \[1, 20\]"),
    (["--model.n_embd=100", "--model.n_head=3"], r"model.n_embd \(100\) must be divisible by model.n_head \(3\)"),
    (["--model.dropout=1"], r"model.dropout must be in \[0, 1\)"),
    (["--model.attn_backend=flash"], r"model.attn_backend must be one of sdpa, manual"),
    (["--wandb.mode=cloud"], r"wandb.mode must be one of online, offline, disabled"),
    (["--data.tokenizer=nope"], r"unknown tokenizer 'nope'"),
    (["--data.val_fraction=1.5"], r"data.val_fraction must be a number strictly between 0 and 1"),
    (["--lr=1"], r"unknown option --lr; did you mean --train.lr=\.\.\.\?"),
    (["small.yaml"], r"unexpected argument 'small.yaml'; options look like --config small"),
    (["--train.lr"], r"option --train.lr has no value; write --train.lr=VALUE"),
    (["--print_config"], r"unknown option --print_config; did you mean --print-config\?$"),  # was: "has no value"
    (["--Config"], r"unknown option --Config; did you mean --config\?$"),
    (["--lr"], r"unknown option --lr; did you mean --train.lr=\.\.\.\?"),
    (["--n_layer", "4"], r"unknown option --n_layer; did you mean --model.n_layer=\.\.\.\?"),
    (["--config", "no_such_config"], r"config 'no_such_config' not found .*one of: .*small"),
    # vocab_size 0 (the tokenizer's) was named as "vocab_size (1)", the placeholder the size check counts
    (["--model.n_layer=1024", "--model.n_embd=65536", "--model.n_head=1"],
     r"parameters before its vocabulary, .* lower n_layer \(1024\) or n_embd \(65536\)$"),
    (["--model.n_layer=1024", "--model.n_embd=65536", "--model.n_head=1", "--model.vocab_size=50304"],
     r"lower n_layer \(1024\), n_embd \(65536\) or vocab_size \(50304\)$"),
])
def test_bad_config_raises_one_line_user_error(argv, pattern):
    with pytest.raises(UserError, match=pattern) as ei:
        load_config(argv)
    assert "\n" not in str(ei.value)


@pytest.mark.parametrize("text,pattern", [
    ("train:\n  lr: [1, 2\n", r"is not valid YAML at line \d+"),
    ("- just\n- a list\n", r"must be a mapping of sections"),
    ("train: 3\n", r"section 'train' must be a mapping"),
    ("train:\n  max_iters: many\n", r"run.yaml: train.max_iters expects an int, got 'many'"),
    ("optim:\n  lr: 1\n", r"unknown section 'optim'"),
    ("train:\n  lr: 1e-3\n  max_iters: 5\n  lr: 3e-3\n", r"'lr' appears twice \(line 4\)"),  # PyYAML keeps the last
    ("train:\n  lr: 1\ntrain:\n  max_iters: 5\n", r"'train' appears twice \(line 3\)"),
])
def test_bad_yaml_raises_user_error_naming_the_file(tmp_path, text, pattern):
    with pytest.raises(UserError, match=pattern):
        load_config(["--config", _yaml(tmp_path, text)])


def test_empty_yaml_means_all_defaults(tmp_path):
    assert load_config(["--config", _yaml(tmp_path, "# nothing\n")]) == Config()


def test_resolved_config_round_trips_through_a_checkpoint(tmp_path):
    cfg = load_config(["--config", "small", "--train.lr=3e-4", "--model.bias=false", "--data.tokenizer=char",
                       "--wandb.mode=disabled"])
    save_checkpoint(tmp_path / "ckpt.pt", {"config": cfg.to_dict()})
    back = Config.from_dict(load_checkpoint(tmp_path / "ckpt.pt")["config"])
    assert back == cfg
    assert back.train.lr == 3e-4 and back.model.bias is False and back.data.tokenizer == "char"


def test_resume_conflicts_name_the_keys_that_matter():
    old = load_config(["--model.n_layer=2", "--data.tokenizer=char"]).to_dict()
    ok = load_config(["--model.n_layer=2", "--data.tokenizer=char", "--train.max_iters=9000",
                      "--train.eval_interval=7", "--wandb.mode=disabled", "--train.log_interval=3"])
    assert resume_conflicts(old, ok) == []
    bad = load_config(["--model.n_layer=3", "--data.tokenizer=gpt2", "--train.batch_size=5"])
    assert resume_conflicts(old, bad) == ["model.n_layer: 2 -> 3", "data.tokenizer: 'char' -> 'gpt2'",
                                          "train.batch_size: 12 -> 5"]


def test_help_lists_every_key_with_its_default(capsys):
    with pytest.raises(SystemExit) as ei:
        load_config(["--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    assert "--train.max_iters=2000  (int)" in out and "--data.tokenizer='gpt2'  (str)" in out


def test_help_describes_every_key_from_the_config_dataclasses(capsys):
    """The descriptions are the fields' comments in the source: a key added without one fails here."""
    with pytest.raises(SystemExit):
        load_config(["--help"])
    out = capsys.readouterr().out
    described = dict(re.findall(r"^  --(\w+\.\w+)=\S+  \([\w |]+\)  (.*)$", out, flags=re.M))
    for section, keys in section_keys().items():
        for key in keys:
            assert described.get(f"{section}.{key}", "").strip(), f"{section}.{key} has no description"
    assert described["train.lr"] == "peak learning rate"  # the comment at the end of the field's line
    assert described["data.dataset"].startswith('"shakespeare" | a local path')  # the comment above it
    assert described["model.norm"].startswith('"layernorm" (GPT-2)')  # inherited from GPTConfig
    assert described["model.vocab_size"].startswith("0: the tokenizer's vocabulary")  # ModelSection's own


def test_print_config_prints_yaml_that_loads_back_to_the_same_config(tmp_path, capsys):
    argv = ["--config", "small", "--train.lr=3e-4", "--model.n_layer=3", "--wandb.mode=disabled"]
    expected = load_config(argv).to_dict()
    with pytest.raises(SystemExit) as ei:
        load_config([*argv, "--print-config"])
    assert ei.value.code == 0
    saved = tmp_path / "resolved.yaml"
    saved.write_text(capsys.readouterr().out)
    assert load_config(["--config", str(saved)]).to_dict() == expected


@pytest.mark.slow
def test_cli_bad_config_prints_one_line_error_without_traceback(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = warm_runs.run([ROOT / "train.py", "--config", "small", "--train.max_iters=0",
                       f"--train.out_dir={tmp_path / 'out'}"], env=env)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: train.max_iters must be >= 1, got 0"
    assert not (tmp_path / "out").exists()


def test_model_fields_are_checked_by_gpt_config_and_named_as_config_keys():
    from model.gpt import ATTN_BACKENDS

    with pytest.raises(UserError, match=r"model.attn_backend must be one of") as e:
        load_config(["--model.attn_backend=flash9"])
    assert all(b in str(e.value) for b in ATTN_BACKENDS)
    with pytest.raises(UserError, match=r"model.gelu_approximate"):
        load_config(["--model.gelu_approximate=erf"])


def billion_laughs(levels: int = 9) -> str:
    lines = ["wandb:", "  run_name: [&a [lol, lol, lol, lol, lol, lol, lol, lol, lol],"]
    for prev, name in zip("abcdefghi", "bcdefghij"[:levels - 1]):
        lines.append(f"    &{name} [{', '.join([f'*{prev}'] * 9)}],")
    lines[-1] = lines[-1].rstrip(",") + "]"
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text,words", [
    (billion_laughs(), "uses a YAML alias (*a)"),  # 9**9 strings if expanded: refused before any expansion
    ("model: &m\n  n_layer: 2\ntrain:\n  <<: *m\n", "YAML alias"),  # a merge key is an alias too
    ("train:\n  seed: " + "9" * 5000 + "\n", "line 2 has 5000 characters, too many for an integer"),
    ("train:\n  seed: " + "[" * 100000 + "]" * 100000 + "\n", "nested more than 32 deep"),
])
def test_hostile_yaml_is_refused_in_one_line_before_it_expands(tmp_path, text, words):
    with pytest.raises(UserError, match=re.escape(words)):
        load_config(["--config", _yaml(tmp_path, text)])


def test_a_config_file_larger_than_a_config_is_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"# " + b"x" * (2**20 + 10) + b"\n")
    with pytest.raises(UserError, match="larger than 1 MiB"):
        load_config(["--config", str(path)])


@pytest.mark.parametrize("override,words", [
    ("--model.n_layer=1000000000000", "model.n_layer must be at most 1024"),
    ("--model.n_embd=1000000000000000", "about 4.8e+31 parameters"),  # 12 * n_embd**2 * 4 layers
    ("--model.n_embd=1e15", "about 4.8e+31 parameters"),
    ("--model.vocab_size=10000000000000", "parameters, more than the 1e+12"),
    ("--model.block_size=100000000000", "model.block_size must be at most"),
])
def test_absurd_model_sizes_are_refused_by_arithmetic_in_one_line(override, words):
    import time

    start = time.perf_counter()
    with pytest.raises(UserError, match=re.escape(words)):
        load_config(["--config", "shakespeare_char", "--model.n_head=1", override])
    assert time.perf_counter() - start < 5  # no model is built, not even on the meta device


@pytest.mark.parametrize("overrides,words", [
    # 12 x 64 x 99,999,999,999 tokens: the loop would build batches for ever (before: a hang)
    (["--train.grad_accum_steps=99999999999"], "train.batch_size (12) x train.grad_accum_steps (99,999,999,999) x "
                                               "model.block_size (64) = 76,799,999,999,232 tokens"),
    (["--train.batch_size=auto", "--train.global_batch_size=99999999999"], "lower train.global_batch_size"),
    (["--train.batch_size=20000000"], "over the 1,073,741,824 any run could use"),
])
def test_absurd_batches_are_refused_by_arithmetic_in_one_line(overrides, words):
    with pytest.raises(UserError, match=re.escape(words)) as e:
        load_config(["--config", "shakespeare_char", *overrides])
    assert "\n" not in str(e.value)
    # at the bound itself a config still loads: 2**30 tokens = 64-token blocks x 2**24 sequences
    load_config(["--config", "shakespeare_char", "--train.batch_size=16", f"--train.grad_accum_steps={2**20}"])


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({
    "n_layer": st.integers(1, 3), "n_head": st.integers(1, 3), "head_dim": st.sampled_from([2, 4, 6]),
    "vocab_size": st.integers(1, 97), "block_size": st.integers(1, 40), "bias": st.booleans(),
    "tie_embeddings": st.booleans(), "pos_embedding": st.sampled_from(["learned", "rope"]),
    "norm": st.sampled_from(["layernorm", "rmsnorm"]), "qk_norm": st.booleans(),
    "mlp_act": st.sampled_from(["gelu", "relu2", "swiglu"])}))
def test_the_parameter_count_from_the_config_is_the_built_models(kw):
    """GPTConfig.num_params (arithmetic: memory estimates and the size refusal use it) against the model built,
    over every architecture option: all of it, and what lies outside the blocks (FSDP's root unit)."""
    from model import GPT, GPTConfig

    kw = dict(kw)
    head_dim = kw.pop("head_dim")
    config = GPTConfig(n_embd=kw["n_head"] * head_dim, **kw)
    model = GPT(config)
    built = sum(p.numel() for p in model.parameters())  # tied parameters appear once
    assert config.num_params() == built, (kw, built)
    assert config.num_params(blocks=False) == built - sum(p.numel() for p in model.transformer.h.parameters())


def test_the_model_section_holds_every_model_field_and_converts_to_gpt_config():
    """ModelSection converts to GPTConfig (it does not inherit from it): a field added to the model but
    not to the config section, or the other way round, fails here."""
    import dataclasses

    from model.gpt import GPTConfig
    from training.config.sections import ModelSection

    model_fields = {f.name for f in dataclasses.fields(GPTConfig)}
    section_fields = {f.name for f in dataclasses.fields(ModelSection)}
    assert section_fields - model_fields == {"init_from"} and model_fields <= section_fields
    cfg = load_config(["--model.n_layer=3", "--model.mlp_act=relu2"]).model.gpt_config(65)
    assert isinstance(cfg, GPTConfig) and (cfg.n_layer, cfg.mlp_act, cfg.vocab_size, cfg.n_embd) == (3, "relu2", 65, 128)


def test_each_key_carries_its_help_and_resume_rule_on_its_field():
    """One place per key: the help line and whether a resume may change it are the field's metadata
    (settings.setting); resume_conflicts reads them, so no separate table can fall out of step."""
    import dataclasses

    from training.config.sections import Config

    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(getattr(Config(), section.name)):
            assert f.metadata.get("help"), f"{section.name}.{f.name}"
            assert isinstance(f.metadata.get("resume"), bool), f"{section.name}.{f.name}"
    old = load_config([]).to_dict()
    assert resume_conflicts(old, load_config(["--train.lr=5e-4", "--model.dropout=0.2"])) == []  # resume=True
    assert resume_conflicts(old, load_config(["--model.bias=false"])) == ["model.bias: True -> False"]


def _string_keys() -> list[str]:
    """Every config key whose type is a string (or a list of strings: its items)."""
    import dataclasses
    import typing

    out = []
    for section in dataclasses.fields(Config):
        hints = typing.get_type_hints(section.default_factory)
        out += [f"{section.name}.{k}" for k, t in hints.items()
                if t is str or t == (str | None) or t == list[str]]
    return out


BOOL_WORDS = st.sampled_from(["yes", "no", "on", "off", "true", "false", "y", "n"]).flatmap(
    lambda w: st.tuples(*[st.sampled_from([c.lower(), c.upper()]) for c in w]).map("".join))


@given(key=st.sampled_from(_string_keys()), word=BOOL_WORDS)
def test_a_yaml_boolean_word_for_a_string_key_says_to_quote_it(tmp_path_factory, key, word):
    """Before: `wandb.mode: off` or `train.resume: false` in a YAML config gave 'expects a string, got
    False' and nothing on why (YAML 1.1 reads the word as a boolean). Whatever a string key's word, an
    error about its type now says so and how to quote it; a word YAML keeps as a string is not refused
    for its type."""
    import yaml

    section, leaf = key.split(".")
    path = tmp_path_factory.mktemp("bool") / "c.yaml"
    path.write_text(f"{section}:\n  {leaf}: {word}\n")
    try:
        load_config(["--config", str(path)])
    except UserError as e:
        msg = str(e)
        if isinstance(yaml.safe_load(word), bool):
            assert "\n" not in msg and "expects a string" in msg and "as a boolean" in msg and f'{leaf}: "' in msg, msg
            return
        assert "expects a string" not in msg, msg
    else:
        assert not isinstance(yaml.safe_load(word), bool), word


BOUNDED = {"train.eval_iters": 100_000, "train.eval_interval": 10**9, "train.log_interval": 10**9,
           "train.checkpoint_interval": 10**9, "eval.hellaswag_interval": 10**9, "eval.sample_interval": 10**9,
           "eval.inspect_interval": 10**9, "eval.hellaswag_batch_size": 10_042}


@settings(max_examples=40, deadline=None)
@given(key=st.sampled_from(sorted(BOUNDED)), over=st.integers(1, 10**30))
def test_every_count_of_steps_or_batches_has_an_upper_bound(key, over):
    """train.eval_iters=1e18 was accepted and the first eval never ended (eval_interval, log_interval and
    hellaswag_batch_size were as open): each is refused past its bound in one line naming it, and the bound
    itself is accepted (the bounds written here by hand, not read from the code)."""
    load_config([f"--{key}={BOUNDED[key]}"])
    with pytest.raises(UserError) as e:
        load_config([f"--{key}={BOUNDED[key] + over}"])
    assert str(e.value).startswith(key) and "must be at most" in str(e.value) and "\n" not in str(e.value), str(e.value)
