"""train.float8: refused in one line wherever it can't run (before any work), and where it runs it swaps
only the blocks' Linear layers, keeps GPT-2's parameter names and the very same parameters, and trains
close to the plain model. torchao's Float8Linear runs on a CPU too (torch._scaled_mm), which lets the
conversion be checked here; its speed is a GPU matter (benchmarks, issue 24)."""
from __future__ import annotations

import pytest
import torch

from model import GPT, GPTConfig
from runtime.loss_path import LMLoss
from training.float8 import check_float8, convert_to_float8, float8_problem
from errors import UserError

from cli_lines import cli, an_error_line
from tiny_runs import tiny_argv

CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_is_refused_in_one_line_where_it_cannot_run(recipe):
    cpu = float8_problem(recipe, torch.device("cpu"))
    assert "CUDA GPU of compute capability 8.9" in cpu and "set train.float8=off" in cpu
    ampere = float8_problem(recipe, CUDA, capability=(8, 0), has_torchao=True)
    assert "8.0" in ampere and "float8 tensor cores" in ampere and "set train.float8=off" in ampere
    no_torchao = float8_problem(recipe, CUDA, capability=(9, 0), has_torchao=False)
    assert "pip install torchao" in no_torchao
    for problem in (cpu, ampere, no_torchao):
        assert "\n" not in problem
    # where it can run, nothing is said; "off" is never a problem
    assert float8_problem(recipe, CUDA, capability=(9, 0), has_torchao=True) is None
    assert float8_problem(recipe, CUDA, capability=(8, 9), has_torchao=True) is None
    assert float8_problem("off", torch.device("cpu")) is None
    with pytest.raises(UserError):
        check_float8(recipe, torch.device("cpu"))


def test_train_py_refuses_float8_on_a_cpu_before_preparing_any_data(tmp_path, data_root, capsys):
    code, _, err = cli(tiny_argv(tmp_path / "out", data_root, "--train.float8=tensorwise"), capsys)
    an_error_line(code, err, "train.float8=tensorwise", "set train.float8=off")
    assert not (tmp_path / "out").exists()
    code, _, err = cli(tiny_argv(tmp_path / "out", data_root, "--train.float8=fp8"), capsys)
    an_error_line(code, err, "train.float8", "off, tensorwise, rowwise")


def tiny_model() -> GPT:
    torch.manual_seed(0)
    # n_embd 64: every block Linear is a multiple of 16; the head (vocab 100) is not and is never converted
    return GPT(GPTConfig(vocab_size=100, block_size=32, n_layer=2, n_head=2, n_embd=64, dropout=0.0))


def test_float8_swaps_only_the_blocks_linears_and_keeps_the_same_named_parameters():
    from torchao.float8.float8_linear import Float8Linear  # requirements-dev.txt has torchao

    model = tiny_model()
    names_before = list(model.state_dict())
    params_before = {n: p for n, p in model.named_parameters()}
    assert convert_to_float8(model, "tensorwise") == 2 * 4  # c_attn, attn.c_proj, c_fc, mlp.c_proj per block
    for fqn, m in model.named_modules():
        is_block_linear = fqn.startswith("transformer.h.") and fqn.rsplit(".", 1)[-1] in ("c_attn", "c_proj", "c_fc")
        assert isinstance(m, Float8Linear) == is_block_linear, fqn
    assert type(model.lm_head) is torch.nn.Linear
    assert list(model.state_dict()) == names_before  # GPT-2's names: the checkpoint is a plain run's
    # the very same Parameter objects: optimizers built after the swap, tied weights, FSDP all see them
    assert all(p is params_before[n] for n, p in model.named_parameters())
    assert model.lm_head.weight is model.transformer.wte.weight


def test_float8_training_step_stays_close_to_the_plain_model():
    plain, f8 = tiny_model(), tiny_model()
    convert_to_float8(f8, "rowwise")
    x = torch.randint(0, 100, (4, 32), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    ref = LMLoss()(plain, x, y)
    loss = LMLoss()(f8, x, y)
    # e4m3 keeps 3 mantissa bits: the loss moves by well under 1% at init, where a wrong scale moves it by far more
    assert abs(loss.item() - ref.item()) < 0.01 * ref.item()
    ref.backward()
    loss.backward()
    for (name, p), q in zip(plain.named_parameters(), f8.parameters()):
        cos = torch.nn.functional.cosine_similarity(p.grad.flatten(), q.grad.flatten(), dim=0)
        assert cos > 0.98, (name, cos.item())
