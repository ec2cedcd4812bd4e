"""A checkpoint whose tensors hold the right values in another dtype or memory layout (edited by hand, or
written by other code): loaded, resumed and fine-tuned from as the same values written by train.py.

Found from outside: with load_state_dict(assign=True) an fp16 checkpoint trained on in fp16 under a plan saying
float32 (19x slower, a higher loss, fp16 checkpoints written), and a transposed weight or AdamW moment was
stepped wrongly by torch's fused CPU AdamW (the same values, other strides, another run)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training import loop
from checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from errors import UserError
from model import GPT, GPTConfig
from tiny_runs import run, tiny_argv
from training.config.sections import load_config

DTYPES = (torch.float16, torch.bfloat16, torch.float64, torch.float32)
LAYOUTS = ("contiguous", "transposed", "strided")


def odd(t: torch.Tensor, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """`t`'s values in `dtype`, laid out as `layout` says: a transposed copy viewed back (column-major), or
    every other element of a storage twice as long."""
    t = t.to(dtype)
    if layout == "transposed" and t.dim() == 2:
        return t.t().contiguous().t()
    if layout == "strided":
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=dtype)
        wide[..., ::2] = t
        return wide[..., ::2]
    return t


def rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What `odd` keeps of `t`'s values, written the way train.py writes them (fp32, contiguous)."""
    return t.to(dtype).float().contiguous()


CONFIG = GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8)


@settings(max_examples=10)
@given(data=st.data())
def test_class_any_float_dtype_and_layout_of_each_weight_loads_as_the_same_values_in_fp32(tmp_path_factory, data):
    model = GPT(CONFIG)
    state = model.state_dict()
    picks = {k: (data.draw(st.sampled_from(DTYPES)), data.draw(st.sampled_from(LAYOUTS))) for k in state}
    picks["lm_head.weight"] = picks["transformer.wte.weight"]  # tied: the model keeps one of the two
    path = tmp_path_factory.mktemp("ckpt") / "ckpt.pt"
    save_checkpoint(path, {"model": {k: odd(v, *picks[k]) for k, v in state.items()},
                           "model_config": {f: getattr(CONFIG, f) for f in CONFIG.__dataclass_fields__}})
    loaded = model_from_checkpoint(load_checkpoint(path), path)
    for name, p in loaded.state_dict().items():
        want = rounded(state[name], picks[name][0])
        assert p.dtype == torch.float32 and p.is_contiguous(), (name, p.dtype, p.stride())
        assert torch.equal(p, want), name
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # still tied
    x = torch.randint(0, CONFIG.vocab_size, (2, 8))
    reference = GPT(CONFIG)
    reference.load_state_dict({k: rounded(v, picks[k][0]) for k, v in state.items()})
    assert torch.equal(loaded(x), reference(x))


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_a_weight_that_is_not_floating_point_is_one_line(tmp_path, dtype):
    state = GPT(CONFIG).state_dict()
    state["transformer.h.0.mlp.c_fc.weight"] = torch.zeros_like(state["transformer.h.0.mlp.c_fc.weight"], dtype=dtype)
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"model": state, "model_config": {f: getattr(CONFIG, f) for f in CONFIG.__dataclass_fields__}})
    with pytest.raises(UserError, match=r"weight 'transformer.h.0.mlp.c_fc.weight' is \w+, not floating point; "
                                        r"use an intact ckpt.pt") as e:
        model_from_checkpoint(load_checkpoint(path), path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("dtype,layout", [(torch.float32, "transposed"), (torch.float16, "strided")])  # layout alone;
# both (the property above covers every dtype and layout in loading)
def test_resuming_and_fine_tuning_from_odd_tensors_is_the_run_from_the_same_values_written_plainly(
        tmp_path, data_root, dtype, layout):
    """Each weight and AdamW moment of a 4-step checkpoint rewritten in `dtype` and `layout`, beside the same
    values written as train.py writes them: 2 more steps from each (a resume; a fine-tune's init_from) end
    bit for bit equal."""
    run(tmp_path / "base", data_root, "--train.max_iters=4", "--train.eval_interval=4")
    ckpt = load_checkpoint(tmp_path / "base")
    plain, edited = dict(ckpt), dict(ckpt)
    plain["model"] = {k: rounded(v, dtype) for k, v in ckpt["model"].items()}
    edited["model"] = {k: odd(v, dtype, layout) for k, v in ckpt["model"].items()}
    for payload, how in ((plain, lambda t: rounded(t, dtype)), (edited, lambda t: odd(t, dtype, layout))):
        payload["optimizer"] = {"optimizers": [
            {**sd, "state": {i: {k: (how(v) if k.startswith("exp_avg") else v) for k, v in st.items()}
                             for i, st in sd["state"].items()}} for sd in ckpt["optimizer"]["optimizers"]]}
    for name, payload in (("plain", plain), ("edited", edited)):
        (tmp_path / name).mkdir()
        save_checkpoint(tmp_path / name / "ckpt.pt", payload)
    ends = {}
    for name in ("plain", "edited"):
        run(tmp_path / name, data_root, "--train.max_iters=6", "--train.eval_interval=6")  # the resume
        loop.train(load_config(tiny_argv(tmp_path / f"{name}_ft", data_root, "--train.max_iters=2",
                                          "--train.eval_interval=2", f"--model.init_from={tmp_path / name}")))
        ends[name] = [load_checkpoint(tmp_path / n)["model"] for n in (name, f"{name}_ft")]
    for plain_end, edited_end in zip(ends["plain"], ends["edited"]):
        assert all(v.dtype == torch.float32 for v in edited_end.values())
        assert all(torch.equal(plain_end[k], edited_end[k]) for k in plain_end)
