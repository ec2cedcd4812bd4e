"""Decoding rows: GPT-2 124M's shape (random weights), batch 1, a 16-token prompt, greedy.

Ours is sample.py's path: runtime.decoding.setup_decoding (the dtype auto picks for this model, then
device, dtype, compile or CPU prepacking) and model.generate.generate with the KV cache; on a CPU the
dtype auto did not pick is timed beside it. The baseline is nanoGPT's uncached loop
(benchmarks/baseline.py) in the same dtype as ours' default; transformers' generate on the same
weights is shown for information. tok/s = new tokens / wall time of the whole call, prefill included.
"""
from __future__ import annotations

import copy
import tempfile

import torch

from model import GPT, GPTConfig
from checkpoint import load_model
from model.generate import generate
from runtime.decoding import prepare_for_decoding
from runtime.decoding import setup_decoding
from runtime.precision import cpu_native_bf16, dtype_name
from runtime.static_decode import StaticDecode

from .baseline import uncached_decode
from .timing import Variant, median, run_interleaved

QUICK_SHAPE = dict(n_layer=2, n_head=2, n_embd=64)  # --quick: a tiny model with GPT-2's vocabulary


def decode_models(shape: dict, use_hf: bool):
    """(our GPT, HF GPT2LMHeadModel or None), in eval mode with the same random weights (seed 0): the
    HF model is initialised and saved, and ours loads that directory."""
    cfg = GPTConfig(**shape)
    if use_hf:
        try:
            from transformers import GPT2Config, GPT2LMHeadModel
        except ImportError:
            use_hf = False
    if not use_hf:
        torch.manual_seed(0)
        return GPT(cfg).eval(), None
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                                    n_positions=cfg.block_size, vocab_size=cfg.vocab_size)).eval()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        return load_model(d).model.eval(), hf


def _ours(model: GPT, device, dtype, compile: bool, prompt: list[int], new: int):
    ready, decode_fn, packed = prepare_for_decoding(copy.deepcopy(model), device, dtype, compile=compile)
    return (lambda i: generate(ready, [prompt], new, temperature=0, decode_fn=decode_fn)[0]), packed


def _hf(hf, prompt: list[int], new: int):
    def run(i):
        with torch.inference_mode():
            out = hf.generate(torch.tensor([prompt], device=hf.device), do_sample=False, max_new_tokens=new,
                              min_new_tokens=new, pad_token_id=50256,
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=hf.device))
        return out[0, len(prompt):].tolist()
    return run


def bench_decode(*, device: torch.device, quick: bool, repeats: int, new_tokens: int, prompt_len: int, use_hf: bool,
                 compile: bool, say) -> tuple[list[dict], dict]:
    shape = QUICK_SHAPE if quick else {}
    model, hf = decode_models(shape, use_hf)
    n_params = sum(p.numel() for p in model.parameters())
    prompt = torch.randint(0, model.config.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    default = setup_decoding(model, device, "auto")  # exactly what sample.py does
    auto = default.dtype
    say(f"[decode] {default.note}")

    variants, info = [], {}
    base_model = copy.deepcopy(model).to(device=device, dtype=auto).eval()
    variants.append(Variant(f"baseline {dtype_name(auto)}", lambda i: uncached_decode(base_model, prompt, new_tokens)()))
    graphed = isinstance(default.decode_fn, StaticDecode)
    variants.append(Variant(f"ours {dtype_name(auto)}{' prepacked' if default.prepacked else ''}"
                            f"{' CUDA graph' if graphed else ''} (sample.py default)",
                            lambda i: generate(default.model, [prompt], new_tokens, temperature=0,
                                               decode_fn=default.decode_fn)[0]))
    if graphed:  # the same static step uncaptured (what the CPU tests run), and the plain eager loop
        uncaptured = StaticDecode(default.model, capture=False)
        variants.append(Variant(f"ours {dtype_name(auto)} static buffers, uncaptured",
                                lambda i: generate(default.model, [prompt], new_tokens, temperature=0,
                                                   decode_fn=uncaptured)[0]))
        variants.append(Variant(f"ours {dtype_name(auto)} eager",
                                lambda i: generate(default.model, [prompt], new_tokens, temperature=0)[0]))
    other = torch.bfloat16 if auto == torch.float32 else torch.float32
    if device.type == "cpu" and (other != torch.bfloat16 or cpu_native_bf16()):  # the dtype auto did not pick
        # (bf16 only where native: an emulated dtype is never timed)
        step, packed = _ours(model, device, other, False, prompt, new_tokens)
        variants.append(Variant(f"ours {dtype_name(other)}{' prepacked' if packed else ''}", step))
    if compile:
        variants.append(Variant(f"ours {dtype_name(auto)} compiled", _ours(model, device, auto, True, prompt, new_tokens)[0]))
    if hf is not None:
        hf_dtype = auto if device.type == "cuda" else torch.float32
        hf = hf.to(device=device, dtype=hf_dtype)
        variants.append(Variant(f"HF generate {dtype_name(hf_dtype)}", _hf(hf, prompt, new_tokens)))
    say(f"[decode] {'tiny model (--quick)' if quick else 'GPT-2 124M shape'}, {n_params / 1e6:.1f}M params, batch 1, "
        f"prompt {prompt_len}, {new_tokens} new tokens, greedy: {', '.join(v.name for v in variants)}; "
        f"{repeats} call(s) each")
    run_interleaved(variants, 2 if compile else 1, repeats, repeats, device)

    tokens = {v.name: v.step(0) for v in variants}  # the greedy tokens, for the agreement check
    if graphed:  # the graph's greedy text must be the eager step's (CPU tests check the uncaptured step)
        ours = [n for n in tokens if n.startswith("ours")]
        info["graph_tokens_equal_eager"] = all(tokens[n] == tokens[ours[0]] for n in ours if "compiled" not in n)
        say(f"[decode] greedy tokens of the CUDA graph, the uncaptured static step and eager: "
            f"{'equal' if info['graph_tokens_equal_eager'] else 'DIFFERENT'}")
    fp32 = [n for n in tokens if n.startswith("ours float32")]
    if hf is not None and device.type == "cpu" and fp32:
        info["fp32_tokens_equal_hf"] = tokens[fp32[0]] == tokens["HF generate float32"]
    base_s = median(variants[0].times)
    rows = []
    for v in variants[1:]:
        s = median(v.times)
        rows.append({"section": "decode", "name": v.name, "precision": v.name.split()[2 if v.name.startswith("HF") else 1],
                     "unit": "ms/tok",
                     "ours": s / new_tokens * 1e3, "base": base_s / new_tokens * 1e3, "ours_tok_s": new_tokens / s,
                     "base_tok_s": new_tokens / base_s, "speedup": base_s / s, "ours_first_s": v.first,
                     "ours_times_s": v.times, "base_times_s": variants[0].times})
    info.update(shape=shape or "GPT-2 124M", params=n_params, prompt_len=prompt_len, new_tokens=new_tokens,
                dtype=dtype_name(auto), prepacked=default.prepacked, auto_note=default.note, hf=hf is not None)
    return rows, info
