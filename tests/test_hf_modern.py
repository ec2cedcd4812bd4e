"""The modern recipe leaves the project: each model is exported to the transformers architecture that expresses
it exactly (Llama, Qwen3), or with its own modeling code for trust_remote_code=True, and transformers' logits
equal ours. The references are transformers' own Llama and Qwen3, and lm-eval's `hf` model. Tiny random
models with every weight perturbed (norm gains, biases and zero-initialised projections included)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from model import GPT, GPTConfig  # noqa: E402
from checkpoint.export import export_hf  # noqa: E402
from model.hf_modern import hf_format  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPT2_TOKENIZER = {"tokenizer": "gpt2", "chars": None}
ROPE_RMS_SWIGLU = dict(pos_embedding="rope", norm="rmsnorm", mlp_act="swiglu")
CASES = {  # name: (GPTConfig fields, the HF format, the class transformers builds)
    "llama_untied": (dict(ROPE_RMS_SWIGLU, tie_embeddings=False, bias=False), "llama", "LlamaForCausalLM"),
    "llama_tied_with_biases": (dict(ROPE_RMS_SWIGLU, bias=True, rope_base=500.0), "llama", "LlamaForCausalLM"),
    "qwen3_qk_norm": (dict(ROPE_RMS_SWIGLU, qk_norm=True, bias=False, tie_embeddings=False), "qwen3",
                      "Qwen3ForCausalLM"),
    # the README's full modern recipe, and small_modern.yaml's (rope, QK-norm, ReLU², LayerNorm)
    "modern_relu2_softcap": (dict(pos_embedding="rope", norm="rmsnorm", qk_norm=True, mlp_act="relu2", tie_embeddings=False,
                                  zero_init_proj=True, logit_softcap=15.0), "smallgpt", "SmallGPTForCausalLM"),
    "small_modern": (dict(pos_embedding="rope", qk_norm=True, mlp_act="relu2"), "smallgpt", "SmallGPTForCausalLM"),
    "learned_swiglu_softcap": (dict(mlp_act="swiglu", bias=False, logit_softcap=30.0), "smallgpt",
                                  "SmallGPTForCausalLM"),
}


def perturbed(fields: dict, seed: int = 0, vocab_size: int = 50257, block_size: int = 32) -> GPT:
    """A tiny model whose every weight is random: norm gains off 1, biases and zero-init projections off 0."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=block_size, vocab_size=vocab_size, **fields))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def load(path: Path, fmt: str):
    return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=fmt == "smallgpt").eval()


def test_each_model_goes_to_the_format_that_expresses_it():
    assert hf_format(GPTConfig()) == "gpt2"
    assert hf_format(GPTConfig(bias=False, tie_embeddings=False)) == "gpt2"
    for fields, fmt, _ in CASES.values():
        assert hf_format(GPTConfig(**fields)) == fmt, fields
    # Qwen3's MLP has no biases; Llama has no QK-norm; neither has a soft-cap, LayerNorm or a learned table
    assert hf_format(GPTConfig(**ROPE_RMS_SWIGLU, qk_norm=True, bias=True)) == "smallgpt"
    assert hf_format(GPTConfig(**ROPE_RMS_SWIGLU, logit_softcap=30.0)) == "smallgpt"
    assert hf_format(GPTConfig(pos_embedding="rope", mlp_act="swiglu")) == "smallgpt"
    assert hf_format(GPTConfig(norm="rmsnorm", mlp_act="swiglu")) == "smallgpt"


@pytest.mark.parametrize("case", CASES)
def test_export_loads_in_transformers_with_our_logits(case, tmp_path):
    fields, fmt, cls = CASES[case]
    ours = perturbed(fields)
    assert export_hf(ours, GPT2_TOKENIZER, tmp_path / "hf") == fmt
    hf = load(tmp_path / "hf", fmt)
    assert type(hf).__name__ == cls
    # only our own format carries code; Llama and Qwen3 are transformers' own classes
    assert (tmp_path / "hf" / "modeling_smallgpt.py").exists() == (fmt == "smallgpt")
    idx = torch.randint(0, 50257, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ours(idx)
        assert expected.std() > 0.1  # logits that differ, so the comparison means something
        torch.testing.assert_close(hf(idx).logits, expected, rtol=0, atol=1e-5)
        # fine-tuning in transformers: its loss (labels = the inputs, shifted inside) is our next-token loss
        loss = torch.nn.functional.cross_entropy(ours(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        torch.testing.assert_close(hf(idx, labels=idx).loss, loss, rtol=0, atol=1e-5)


@pytest.mark.parametrize("case", ["modern_relu2_softcap", "learned_swiglu_softcap"])
def test_remote_code_generates_like_our_model_with_a_cache_and_left_padding(case, tmp_path):
    """HF's generate() drives the remote code with its DynamicCache, one token at a time, on a left-padded
    batch; each row must get the greedy tokens our model gives that prompt alone, without a cache."""
    fields, fmt, _ = CASES[case]
    ours = perturbed(fields, seed=2)
    export_hf(ours, GPT2_TOKENIZER, tmp_path / "hf")
    hf = load(tmp_path / "hf", fmt)
    prompts = [[464, 3797, 3332, 319, 262], [49, 2662, 46]]  # 5 and 3 tokens
    ids = torch.tensor([prompts[0], [50256, 50256] + prompts[1]])
    mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    with torch.no_grad():
        # one forward with the mask and no position ids: the padded row's real tokens as if alone
        torch.testing.assert_close(hf(ids, attention_mask=mask).logits[1, 2:], ours(torch.tensor([prompts[1]]))[0],
                                   rtol=0, atol=1e-5)
        out = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=50256)
        for row, prompt in enumerate(prompts):
            seq = torch.tensor([prompt])
            for _ in range(6):
                seq = torch.cat([seq, ours(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
            assert out[row, 5:].tolist() == seq[0, len(prompt):].tolist(), row


@pytest.mark.parametrize("name", ["past_key_values", "cache"])
def test_remote_code_takes_its_cache_under_either_transformers_name(name, tmp_path):
    """transformers before 5.2x passes the cache as past_key_values, later ones as cache: a prefix run
    into a DynamicCache, then the last token alone, gives our model's logits for the whole sequence."""
    from transformers.cache_utils import DynamicCache

    fields, fmt, _ = CASES["modern_relu2_softcap"]
    ours = perturbed(fields, seed=2)
    export_hf(ours, GPT2_TOKENIZER, tmp_path / "hf")
    hf = load(tmp_path / "hf", fmt)
    ids = torch.tensor([[464, 3797, 3332, 319, 262]])
    with torch.no_grad():
        cache = DynamicCache()
        hf(ids[:, :4], use_cache=True, **{name: cache})
        out = hf(ids[:, 4:], use_cache=True, **{name: cache})
        torch.testing.assert_close(out.logits[0, -1], ours(ids)[0, -1], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_remote_code_export_loads_offline_in_a_fresh_process_and_pipeline_runs_with_defaults(tmp_path):
    """AutoModelForCausalLM and pipeline(...)(prompt) with no arguments, in a new interpreter with the hub
    off and an empty modules cache: the directory alone is enough."""
    fields, _, _ = CASES["modern_relu2_softcap"]
    ours = perturbed(fields, seed=3)
    export_hf(ours, GPT2_TOKENIZER, tmp_path / "hf")
    idx = [[464, 3797, 3332, 319, 262, 2603]]
    with torch.no_grad():
        expected = ours(torch.tensor(idx))[0, -1].tolist()
    script = (
        "import json, sys, torch\n"
        "from transformers import AutoModelForCausalLM, pipeline\n"
        "d = sys.argv[1]\n"
        "m = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True).eval()\n"
        f"logits = m(torch.tensor({idx})).logits[0, -1].tolist()\n"
        "text = pipeline('text-generation', model=d, trust_remote_code=True, device='cpu')('ROMEO:')[0]['generated_text']\n"
        "print(json.dumps({'logits': logits, 'text': text, 'cls': type(m).__name__}))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "hf")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["cls"] == "SmallGPTForCausalLM" and got["text"].startswith("ROMEO:")
    torch.testing.assert_close(torch.tensor(got["logits"]), torch.tensor(expected), rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------ lm-eval

TASK = """task: smallgpt_tiny
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{endings}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
DOCS = [
    {"context": "The cat sat on the", "endings": ["mat", "moon", "table"], "label": 0},
    {"context": "ROMEO: O, she doth teach the torches to", "endings": ["burn bright!", "swim", "sing"], "label": 0},
]


def our_loglikelihood(model: GPT, context: str, continuation: str) -> tuple[float, bool]:
    """log p(continuation | context) and whether each of its tokens is the argmax, split as lm-eval splits
    (the context's tokens, then the rest of the whole string's), with tiktoken's GPT-2 BPE."""
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")
    whole, ctx = enc.encode_ordinary(context + continuation), enc.encode_ordinary(context)
    cont = whole[len(ctx):]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([whole[:-1]]))[0].double(), dim=-1)[len(ctx) - 1:]  # (len(cont), V)
    target = torch.tensor(cont)
    return logp[torch.arange(len(cont)), target].sum().item(), bool((logp.argmax(-1) == target).all())


def test_lm_eval_hf_model_scores_a_modern_export_like_our_model(tmp_path):
    """lm-eval's `hf` model (what `lm_eval --model hf` runs) on the remote-code export of the full modern
    recipe, over a local two-question task: every loglikelihood it computes equals ours."""
    pytest.importorskip("lm_eval", reason="lm-eval is a test-only dependency (requirements-dev.txt); not installed")
    pytest.importorskip("accelerate", reason="lm-eval's hf model needs accelerate (lm-eval[hf]); not installed")
    import lm_eval
    from lm_eval.tasks import TaskManager

    fields, _, _ = CASES["modern_relu2_softcap"]
    ours = perturbed(fields, seed=4, block_size=64)
    export_hf(ours, GPT2_TOKENIZER, tmp_path / "hf")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "data.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tasks / "smallgpt_tiny.yaml").write_text(TASK.format(data=tasks / "data.jsonl"))
    result = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={tmp_path / 'hf'},trust_remote_code=True", tasks=["smallgpt_tiny"],
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False), device="cpu", batch_size=4,
        log_samples=True, random_seed=None, numpy_random_seed=None, torch_random_seed=None)  # leave global RNGs alone
    samples = result["samples"]["smallgpt_tiny"]
    assert len(samples) == len(DOCS)
    correct = 0
    for sample in samples:
        scores = []
        for (context, continuation), (ll, greedy) in zip(sample["arguments"], sample["filtered_resps"]):
            want_ll, want_greedy = our_loglikelihood(ours, context, continuation)
            assert ll == pytest.approx(want_ll, abs=1e-4) and greedy == want_greedy, (context, continuation)
            scores.append(want_ll)
        correct += max(range(len(scores)), key=scores.__getitem__) == sample["doc"]["label"]
    assert result["results"]["smallgpt_tiny"]["acc,none"] == pytest.approx(correct / len(DOCS))
