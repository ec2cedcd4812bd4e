"""The modern recipe's options (rotary embeddings, RMSNorm, QK-norm, ReLU², an untied and zero-initialised
head, a logit soft-cap, Muon), each against an independent reference: the formula written out here,
HF's Llama rotary, torch's own cross-entropy."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from errors import UserError
from model import GPT, GPTConfig
from checkpoint import model_from_checkpoint
from checkpoint.model_config import model_config_problem
from model.fused_ce import linear_cross_entropy
from model.gpt import apply_rotary, rotary_cos_sin
from runtime.loss_path import LMLoss
from training.config.sections import load_config
from training.optim import Muon, make_optimizers, split_for_muon
from training.step import train_step

MODERN = dict(pos_embedding="rope", norm="rmsnorm", qk_norm=True, mlp_act="relu2", tie_embeddings=False,
              zero_init_proj=True, logit_softcap=15.0)


def tiny(**kw) -> GPTConfig:
    return GPTConfig(**{**dict(n_layer=2, n_head=2, n_embd=16, block_size=24, vocab_size=29), **kw})


# ------------------------------------------------------------------------------------------ rotary

def textbook_rotary(x: torch.Tensor, pos: list[int], base: float) -> torch.Tensor:
    """Pair i of a head is (x[i], x[i + d/2]); at position p it turns by p * base^(-2i/d). fp64 loops."""
    out = x.clone().double()
    d = x.shape[-1]
    for t, p in enumerate(pos):
        for i in range(d // 2):
            theta = p * base ** (-2 * i / d)
            a, b = x[..., t, i].double(), x[..., t, i + d // 2].double()
            out[..., t, i] = a * math.cos(theta) - b * math.sin(theta)
            out[..., t, i + d // 2] = b * math.cos(theta) + a * math.sin(theta)
    return out


def test_rotary_equals_the_textbook_rotation_and_hf_llamas():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)  # (B, nh, T, hs)
    pos = [0, 1, 7, 30, 511]
    cos, sin = rotary_cos_sin(torch.tensor([pos]), 8, 10000.0)
    ours = apply_rotary(x, cos.double(), sin.double())
    # the angles are computed in fp32, as HF's Llama does (and as MPS needs): ~4e-6 off at position 511
    torch.testing.assert_close(ours, textbook_rotary(x, pos, 10000.0), rtol=0, atol=1e-5)
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    full_cos, full_sin = torch.cat([cos, cos], -1).double(), torch.cat([sin, sin], -1).double()
    q_hf, _ = llama.apply_rotary_pos_emb(x, x, full_cos[:, 0], full_sin[:, 0], unsqueeze_dim=1)
    torch.testing.assert_close(ours, q_hf, rtol=1e-6, atol=1e-6)


def test_with_rotary_q_dot_k_depends_only_on_the_position_difference():
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)

    def score(pq: int, pk: int) -> float:
        cq, sq = rotary_cos_sin(torch.tensor([[pq]]), 16, 10000.0)
        ck, sk = rotary_cos_sin(torch.tensor([[pk]]), 16, 10000.0)
        return (apply_rotary(q, cq.double(), sq.double()) * apply_rotary(k, ck.double(), sk.double())).sum().item()

    assert score(5, 2) == pytest.approx(score(103, 100), rel=1e-5)  # fp32 angles
    assert score(9, 9) == pytest.approx(score(0, 0), rel=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)


def test_a_rope_model_has_no_position_table_and_positions_still_matter():
    """Without position information, causal attention of the last token over a prefix is blind to the
    prefix's order; with rotary embeddings it is not."""
    model = GPT(tiny(pos_embedding="rope")).eval()
    assert "transformer.wpe.weight" not in model.state_dict()
    with torch.no_grad():
        a = model(torch.tensor([[3, 7, 11, 5]]))[0, -1]
        b = model(torch.tensor([[7, 3, 11, 5]]))[0, -1]
    assert (a - b).abs().max() > 1e-4


# ------------------------------------------------------------------------------------------ norms, activation

def test_rmsnorm_blocks_use_the_formula():
    torch.manual_seed(2)
    model = GPT(tiny(norm="rmsnorm"))
    ln = model.transformer.h[0].ln_1
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 16)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * ln.weight
    torch.testing.assert_close(ln(x), expected, rtol=1e-5, atol=1e-6)
    assert not any(name.endswith("ln_1.bias") for name, _ in model.named_parameters())


@pytest.mark.parametrize("backend", ["sdpa", "manual"])
def test_qk_norm_attention_equals_softmax_of_normalised_q_and_k(backend):
    torch.manual_seed(3)
    attn = GPT(tiny(qk_norm=True, attn_backend=backend)).transformer.h[0].attn.eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    attn.double()
    q, k, v = attn.c_attn(x).split(16, dim=2)
    heads = [t.view(2, 6, 2, 8).transpose(1, 2) for t in (q, k, v)]
    q, k, v = heads
    eps = 1e-5  # layer_norm_eps, the epsilon of every norm
    q = q / torch.sqrt(q.pow(2).mean(-1, keepdim=True) + eps)
    k = k / torch.sqrt(k.pow(2).mean(-1, keepdim=True) + eps)
    att = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(torch.triu(torch.ones(6, 6, dtype=torch.bool), 1), -math.inf)
    y = (att.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, 16)
    torch.testing.assert_close(attn(x), attn.c_proj(y), rtol=1e-7, atol=1e-9)


def test_relu2_mlp_is_relu_squared():
    mlp = GPT(tiny(mlp_act="relu2")).transformer.h[0].mlp
    x = torch.randn(4, 16)
    torch.testing.assert_close(mlp(x), mlp.c_proj(torch.clamp(mlp.c_fc(x), min=0) ** 2))


def test_swiglu_mlp_is_silu_gate_times_up_and_equals_hf_llamas_mlp():
    torch.manual_seed(6)
    mlp = GPT(tiny(mlp_act="swiglu", n_embd=48, n_head=2)).transformer.h[0].mlp.double()
    hidden = 128  # 8/3 * 48 = 128, already a multiple of 64
    assert mlp.c_fc.weight.shape == (2 * hidden, 48) and mlp.c_proj.weight.shape == (48, hidden)
    x = torch.randn(3, 5, 48, dtype=torch.float64)
    w_gate, w_up = mlp.c_fc.weight[:hidden], mlp.c_fc.weight[hidden:]
    b_gate, b_up = mlp.c_fc.bias[:hidden], mlp.c_fc.bias[hidden:]
    gate, up = x @ w_gate.T + b_gate, x @ w_up.T + b_up
    formula = (gate / (1 + torch.exp(-gate)) * up) @ mlp.c_proj.weight.T + mlp.c_proj.bias  # silu(g) = g * sigmoid(g)
    torch.testing.assert_close(mlp(x), formula, rtol=1e-10, atol=1e-12)

    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    hf = llama.LlamaMLP(LlamaConfig(hidden_size=48, num_attention_heads=2, intermediate_size=hidden, mlp_bias=True,
                                  hidden_act="silu")).double()
    with torch.no_grad():
        for name, w, b in (("gate_proj", w_gate, b_gate), ("up_proj", w_up, b_up),
                           ("down_proj", mlp.c_proj.weight, mlp.c_proj.bias)):
            getattr(hf, name).weight.copy_(w)
            getattr(hf, name).bias.copy_(b)
    torch.testing.assert_close(mlp(x), hf(x), rtol=1e-10, atol=1e-12)


def test_swiglu_hidden_width_keeps_gpt2s_parameter_count_rounded_to_64():
    from model.gpt import mlp_hidden

    assert mlp_hidden(tiny(mlp_act="swiglu", n_embd=768, n_head=12)) == 2048  # 3 matrices of 768 x 2048 = GPT-2's 2 of 768 x 3072
    assert mlp_hidden(tiny(mlp_act="swiglu", n_embd=128)) == 384  # 341.3 rounded up
    assert mlp_hidden(tiny(mlp_act="gelu", n_embd=128)) == mlp_hidden(tiny(mlp_act="relu2", n_embd=128)) == 512


# ------------------------------------------------------------------------------------------ head

def test_an_untied_zero_initialised_head_starts_at_uniform_logits():
    model = GPT(tiny(tie_embeddings=False, zero_init_proj=True))
    assert model.lm_head.weight is not model.transformer.wte.weight
    assert model.lm_head.weight.abs().sum() == 0
    for block in model.transformer.h:
        assert block.attn.c_proj.weight.abs().sum() == 0 and block.mlp.c_proj.weight.abs().sum() == 0
    assert model.transformer.h[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.3)
    idx = torch.randint(0, 29, (2, 10))
    loss = F.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
    assert loss.item() == pytest.approx(math.log(29), abs=1e-5)  # every logit 0


def test_parameter_counts_and_flops_follow_the_options_by_hand():
    C, V, L, T = 16, 29, 2, 24
    block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C)  # GPT-2 block
    gpt2 = GPT(tiny())
    assert gpt2.num_params(non_embedding=True) == L * block + 2 * C
    assert gpt2.num_params(non_embedding=False) == L * block + 2 * C + V * C + T * C
    modern = GPT(tiny(**MODERN))
    rms_block = block - 2 * C - 2 * C + 2 * C  # LayerNorm weight+bias twice -> RMSNorm weight twice
    assert modern.num_params(non_embedding=True) == L * rms_block + C  # no wpe, untied head left out
    assert modern.num_params(non_embedding=False) == L * rms_block + C + 2 * V * C
    for m in (gpt2, modern):
        assert m.flops_per_token(T) == 6 * (m.num_params(non_embedding=True) + V * C) + 12 * L * C * T


def test_softcapped_logits_and_both_loss_paths_equal_torch_cross_entropy_in_fp64():
    torch.manual_seed(4)
    model = GPT(tiny(logit_softcap=2.0, tie_embeddings=False)).double()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 1.0)  # big raw logits, so the cap bites
    idx, y = torch.randint(0, 29, (3, 10)), torch.randint(0, 29, (3, 10))
    y[1, :3] = -1
    with torch.no_grad():
        raw = model.lm_head(model.transformer.ln_f(_hidden(model, idx)))
        assert raw.abs().max() > 4
        torch.testing.assert_close(model(idx), 2.0 * torch.tanh(raw / 2.0))
    losses, grads = {}, {}
    for rows in (None, 7):  # the full-logits path, and the fused path in chunks that don't divide 30 rows
        model.zero_grad()
        losses[rows] = LMLoss(chunk_rows=rows)(model, idx, y)
        losses[rows].backward()
        grads[rows] = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits = model(idx)
    ref = F.cross_entropy(logits.view(-1, 29), y.view(-1), ignore_index=-1)
    ref.backward()
    for rows in (None, 7):
        torch.testing.assert_close(losses[rows], ref, rtol=1e-12, atol=1e-12)
        for n, p in model.named_parameters():
            torch.testing.assert_close(grads[rows][n], p.grad, rtol=1e-9, atol=1e-12, msg=n)


def _hidden(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(idx.shape[1]))
    for block in model.transformer.h:
        x = block(x)
    return x


def test_fused_loss_with_softcap_alone_equals_the_formula():
    torch.manual_seed(5)
    x = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 8, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 11, (13,))
    loss = linear_cross_entropy(x, w, t, chunk_rows=4, softcap=3.0)
    ref = F.cross_entropy(3.0 * torch.tanh(x @ w.t() / 3.0), t)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    gx, gw = torch.autograd.grad(loss, (x, w))
    rx, rw = torch.autograd.grad(ref, (x, w))
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gw, rw)


# ------------------------------------------------------------------------------------------ decoding

@pytest.mark.parametrize("backend", ["sdpa", "manual"])
def test_cached_decode_equals_the_full_forward_with_every_modern_option(backend):
    torch.manual_seed(6)
    model = GPT(tiny(**{**MODERN, "zero_init_proj": False}, attn_backend=backend)).eval()
    idx = torch.randint(0, 29, (2, 12))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_kv_cache(2, 12)
        steps = [model(idx[:, :5], input_pos=torch.arange(5), kv_cache=cache)]
        for t in range(5, 12):
            steps.append(model(idx[:, t:t + 1], input_pos=torch.tensor([t]), kv_cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_left_padded_rows_get_their_solo_logits_with_rotary_embeddings():
    torch.manual_seed(7)
    model = GPT(tiny(**{**MODERN, "zero_init_proj": False})).eval()
    a, b = torch.randint(0, 29, (1, 9)), torch.randint(0, 29, (1, 5))
    batch = torch.cat([a, torch.cat([torch.zeros(1, 4, dtype=torch.long), b], 1)])
    pad = torch.ones(2, 9, dtype=torch.bool)
    pad[1, :4] = False
    with torch.no_grad():
        both = model(batch, pad_mask=pad)
        torch.testing.assert_close(both[0], model(a)[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(both[1, 4:], model(b)[0], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ checkpoints, export

def test_an_untied_model_comes_back_untied_from_a_checkpoint():
    model = GPT(tiny(**{**MODERN, "zero_init_proj": False}))
    ckpt = {"model": model.state_dict(), "model_config": dataclasses.asdict(model.config)}
    back = model_from_checkpoint(ckpt, "test")
    assert back.lm_head.weight is not back.transformer.wte.weight
    torch.testing.assert_close(back.lm_head.weight, model.lm_head.weight)


def test_gpt2_incompatibilities_name_each_option_gpt2_cannot_express():
    assert GPTConfig().gpt2_incompatibilities() == []
    assert tiny(tie_embeddings=False, zero_init_proj=True, bias=False).gpt2_incompatibilities() == []
    reasons = tiny(**MODERN).gpt2_incompatibilities()
    for word in ("rotary", "RMSNorm", "QK-norm", "ReLU²", "soft-cap"):
        assert any(word in r for r in reasons), (word, reasons)


def test_an_untied_head_exports_to_hf_with_the_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    from checkpoint.export import export_hf

    torch.manual_seed(8)
    model = GPT(tiny(tie_embeddings=False, vocab_size=50257)).eval()
    export_hf(model, {"tokenizer": "gpt2", "chars": None}, tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, 50257, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx), rtol=0, atol=1e-4)


# ------------------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("kw,field", [
    (dict(pos_embedding="alibi"), "pos_embedding"), (dict(norm="batchnorm"), "norm"), (dict(mlp_act="geglu"), "mlp_act"),
    (dict(logit_softcap=-1.0), "logit_softcap"), (dict(rope_base=1.0), "rope_base"), (dict(qk_norm="yes"), "qk_norm"),
    (dict(pos_embedding="rope", n_embd=15, n_head=3), "pos_embedding"),
])
def test_bad_modern_options_name_the_field(kw, field):
    assert f"GPTConfig.{field}" in model_config_problem(tiny(**kw))
    assert model_config_problem(tiny()) is None


def test_the_config_layer_gives_one_line_errors_for_modern_options():
    with pytest.raises(UserError, match=r"model.norm must be one of layernorm, rmsnorm, got 'batchnorm'"):
        load_config(["--model.norm=batchnorm"])
    with pytest.raises(UserError, match=r"train.optimizer must be one of adamw, muon"):
        load_config(["--train.optimizer=lion"])
    with pytest.raises(UserError, match=r"model.mlp_act must be one of gelu, relu2, swiglu, got 'geglu'"):
        load_config(["--model.mlp_act=geglu"])


def assert_thirty_muon_steps_lower_the_loss(model: GPT) -> None:
    optimizers = make_optimizers(model, lr=3e-3, weight_decay=0.0, betas=(0.9, 0.99), device_type="cpu", kind="muon")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    idx = torch.randint(0, 29, (4, 24))
    amp = lambda: torch.autocast("cpu", enabled=False)  # noqa: E731
    losses = [train_step(model, LMLoss(), optimizers, scaler, [(idx[:, :-1], idx[:, 1:])], amp=amp, grad_clip=1.0).loss.item()
              for _ in range(30)]
    assert losses[-1] < losses[0] - 1.0


def test_swiglu_is_a_config_key_and_a_swiglu_model_trains():
    cfg = load_config(["--model.mlp_act=swiglu", "--model.n_embd=16", "--model.n_head=2"])
    assert cfg.model.gpt_config(29).mlp_act == "swiglu"
    torch.manual_seed(10)
    model = GPT(cfg.model.gpt_config(29))
    assert model.transformer.h[0].mlp.c_fc.weight.shape == (2 * 64, 16)  # gate | up, 8/3 * 16 rounded up to 64
    assert_thirty_muon_steps_lower_the_loss(model)


# ------------------------------------------------------------------------------------------ Muon

def test_muon_gets_the_blocks_matrices_by_name_and_adamw_everything_else():
    model = GPT(tiny(**MODERN))
    hidden, rest = split_for_muon(model)
    assert sorted(hidden) == sorted(f"transformer.h.{i}.{m}" for i in range(2) for m in (
        "attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"))
    assert sorted(rest) == sorted(["transformer.wte.weight", "lm_head.weight", "transformer.ln_f.weight"]
                                  + [f"transformer.h.{i}.{n}" for i in range(2) for n in (
                                      "ln_1.weight", "ln_2.weight", "attn.c_attn.bias", "attn.c_proj.bias",
                                      "mlp.c_fc.bias", "mlp.c_proj.bias")])
    muon, adamw = make_optimizers(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), device_type="cpu", kind="muon",
                                  muon_lr=0.02)
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    params = dict(model.named_parameters())
    muon_ids = {id(p) for g in muon.param_groups for p in g["params"]}
    adamw_ids = {id(p) for g in adamw.param_groups for p in g["params"]}
    assert muon_ids == {id(params[n]) for n in hidden} and adamw_ids == {id(params[n]) for n in rest}
    assert not muon_ids & adamw_ids and len(muon_ids | adamw_ids) == len(params)
    assert [g["initial_lr"] for g in muon.param_groups] == [0.02]
    assert all(g["initial_lr"] == 1e-3 for g in adamw.param_groups)


def test_training_steps_with_muon_lower_the_loss():
    torch.manual_seed(9)
    model = GPT(tiny(**MODERN))
    assert_thirty_muon_steps_lower_the_loss(model)


def test_a_modern_run_with_muon_resumes_bitwise(tmp_path):
    from data import DataConfig, prepare_data
    from faults import inject
    from tiny_runs import run

    root = tmp_path / "prepared"
    prepare_data(DataConfig(tokenizer="char", root=str(root)), progress=False)
    modern = [f"--model.{k}={str(v).lower()}" for k, v in MODERN.items()] + [
        "--train.optimizer=muon", "--train.max_iters=8", "--model.dropout=0.1", "--train.eval_interval=4"]
    full = run(tmp_path / "full", root, *modern)
    with inject(interrupt_after=3):
        run(tmp_path / "resumed", root, *modern)
    resumed = run(tmp_path / "resumed", root, *modern)
    assert {k: v for k, v in full["losses"].items() if k > 3} == resumed["losses"]
    from checkpoint import load_checkpoint

    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "resumed")
    assert len(a["optimizer"]["optimizers"]) == 2  # Muon's and AdamW's states
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
