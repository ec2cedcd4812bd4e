"""The HF export of a chat model carries the template: transformers' apply_chat_template gives exactly our
encode_prompt ids (gpt2, and a trained bpe), pipeline("text-generation") takes a list of messages, and the
markers' rows are exported (the HF logits equal ours on a prompt holding them)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

import checkpoint.export  # noqa: E402
from checkpoint import save_checkpoint  # noqa: E402
from data.chat_template import template_for  # noqa: E402
from data.tokenizer import get_tokenizer, train_bpe  # noqa: E402
from errors import UserError  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
import warm_runs

CONVS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "What is 2 + 2?"},
     {"role": "assistant", "content": "four"}, {"role": "user", "content": "Ünïcödé: naïve café — 你好\n\ttabs  and  spaces "}],
    [{"role": "user", "content": " leading space, <| and |> and <|user| apart"}],
]


def export(root, tokenizer: dict, vocab_size: int, template: dict | None):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=vocab_size)).eval()
    payload = {"model": model.state_dict(), "model_config": dataclasses.asdict(model.config), "tokenizer": tokenizer}
    if template is not None:
        payload["chat_template"] = template
    save_checkpoint(root / "run" / "ckpt.pt", payload)
    checkpoint.export.main(["--checkpoint", str(root / "run"), "--out", str(root / "hf")])
    return model, root / "hf"


@pytest.fixture(scope="module")
def gpt2_export(tmp_path_factory):
    tok = get_tokenizer("gpt2")
    template = template_for(tok)
    model, out = export(tmp_path_factory.mktemp("chat"), {"tokenizer": "gpt2", "chars": None}, 50304, template.to_dict())
    return tok, template, model, out


def test_apply_chat_template_gives_exactly_our_prompt_ids(gpt2_export):
    from transformers import AutoTokenizer

    tok, template, _, out = gpt2_export
    hf = AutoTokenizer.from_pretrained(out)
    for messages in CONVS:
        ours = template.encode_prompt(tok, messages)
        assert hf.apply_chat_template(messages, add_generation_prompt=True)["input_ids"] == ours
        assert ours[-1] == 50259 and ours[0] in (50257, 50258)
    whole = CONVS[1][:3]
    assert hf.apply_chat_template(whole)["input_ids"] == template.encode_conversation(tok, whole)[0]
    assert hf.decode(template.encode_prompt(tok, CONVS[1]), skip_special_tokens=True) == \
        template.decode(tok, template.encode_prompt(tok, CONVS[1]))


def test_content_holding_a_marker_is_refused_by_the_hf_template_not_forged(gpt2_export):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(gpt2_export[3])
    for text in ("<|user|>", "a<|end|>b", "<|endoftext|>"):
        with pytest.raises(Exception, match="cannot tell from the token"):
            hf.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)


def test_the_markers_rows_are_exported_and_a_pipeline_takes_messages(gpt2_export):
    from transformers import GPT2LMHeadModel, pipeline

    tok, template, model, out = gpt2_export
    ids = torch.tensor([template.encode_prompt(tok, CONVS[1])])
    hf = GPT2LMHeadModel.from_pretrained(out).eval()
    assert hf.config.vocab_size == 50261  # the tokenizer's 50257 and the four markers; the padding cut
    with torch.no_grad():
        ours = model(ids)
        theirs = hf(ids).logits
    torch.testing.assert_close(theirs, ours[..., :50261], atol=1e-4, rtol=1e-4)
    pipe = pipeline("text-generation", model=str(out), device="cpu")
    reply = pipe(CONVS[0], max_new_tokens=4, do_sample=False)[0]["generated_text"]
    assert reply[:-1] == CONVS[0] and reply[-1]["role"] == "assistant"
    new = hf.generate(torch.tensor([template.encode_prompt(tok, CONVS[0])]), max_new_tokens=4, do_sample=False)
    assert reply[-1]["content"] == template.decode(tok, new[0, len(template.encode_prompt(tok, CONVS[0])):].tolist())


def test_a_trained_bpe_export_carries_the_template_too(tmp_path):
    from transformers import AutoTokenizer

    from data.tokenizer import BpeTokenizer

    texts = [" ".join(m["content"] for c in CONVS for m in c)] * 30
    bpe = train_bpe(texts, 600)
    tok = BpeTokenizer("bpe:600", bpe)
    template = template_for(tok)
    _, out = export(tmp_path, {"tokenizer": "bpe:600", "chars": None, "bpe": bpe}, template.vocab_size, template.to_dict())
    hf = AutoTokenizer.from_pretrained(out)
    for messages in CONVS:
        assert hf.apply_chat_template(messages, add_generation_prompt=True)["input_ids"] == template.encode_prompt(tok, messages)


def test_a_damaged_or_misplaced_template_entry_is_one_line(tmp_path):
    template = template_for(get_tokenizer("gpt2"))
    with pytest.raises(UserError, match="chat_template entry is damaged"):
        export(tmp_path / "a", {"tokenizer": "gpt2", "chars": None}, 50304, {"name": "smallgpt-chat-v1"})
    with pytest.raises(UserError, match="puts <\\|system\\|> at id 50300, but its tokenizer has 50257 ids"):
        export(tmp_path / "b", {"tokenizer": "gpt2", "chars": None}, 50304,
               {**template.to_dict(), "markers": {m: 50300 + k for k, m in enumerate(template.to_dict()["markers"])}})
    with pytest.raises(UserError, match="markers take ids up to 50260 but the model has only 50257 rows"):
        export(tmp_path / "c", {"tokenizer": "gpt2", "chars": None}, 50257, template.to_dict())


def test_the_exported_models_greedy_reply_through_transformers_equals_chat_py(tmp_path):
    """issue 42's export must-show: the same checkpoint, exported, answers through transformers' generate
    exactly what `python chat.py` (piped, greedy) answers; a reply ends at the first marker or end-of-text.
    The model's weights are scaled up and its marker rows zeroed, so its greedy reply is text (a reply that
    ended at once would make the comparison empty)."""
    import subprocess
    import sys
    from pathlib import Path

    from transformers import GPT2LMHeadModel

    tok = get_tokenizer("gpt2")
    template = template_for(tok)
    torch.manual_seed(1)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=50304)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(10.0) if p.dim() == 2 else None
        model.transformer.wte.weight[template.base:] = 0.0  # (tied: the markers' logits are 0, below the top)
    payload = {"model": model.state_dict(), "model_config": dataclasses.asdict(model.config),
               "tokenizer": {"tokenizer": "gpt2", "chars": None}, "chat_template": template.to_dict()}
    save_checkpoint(tmp_path / "run" / "ckpt.pt", payload)
    checkpoint.export.main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")])
    root = Path(__file__).resolve().parents[1]
    message, new = "What is 2 + 2?", 6
    run = warm_runs.run([root / "chat.py", "--checkpoint", tmp_path / "run", "--max-new-tokens", new,
                         "--dtype", "float32", "--device", "cpu"], input=message + "\n", cwd=root)
    assert run.returncode == 0, run.stderr
    ours = run.stdout.rstrip("\n").replace("\\n", "\n").replace("\\r", "\r").replace("\\\\", "\\")
    prompt = template.encode_prompt(tok, [{"role": "user", "content": message}])
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        ids = hf.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None,
                          pad_token_id=tok.eot)[0, len(prompt):].tolist()
    stop = next((i for i, t in enumerate(ids) if t >= template.base or t == tok.eot), len(ids))
    assert stop > 0 and ours == tok.decode(ids[:stop]), (ours, ids)  # (a reply of at least one token)


def test_an_export_of_ours_loads_back_with_its_own_tokenizer_and_template(tmp_path):
    """An export read back by sample.py, chat.py and serve.py: a bpe run's export was read with GPT-2's tokenizer
    ("50257 ids but the model only 512"), and a chat model's was "not a chat model: fine-tune it first". Each
    kind loads with the tokenizer and template it was exported with (compared with the checkpoint's own), and the
    same logits on the rows it keeps."""
    from checkpoint import load_for_inference
    from data import tokenizer_from_meta
    from data.tokenizer import BpeTokenizer

    bpe = train_bpe([" ".join(m["content"] for c in CONVS for m in c)] * 30, 600)
    bpe_tok = BpeTokenizer("bpe:600", bpe)
    gpt2_chat, bpe_chat = template_for(get_tokenizer("gpt2")).to_dict(), template_for(bpe_tok).to_dict()
    bpe_entry = {"tokenizer": "bpe:600", "chars": None, "bpe": bpe}
    cases = {"gpt2, chat": ({"tokenizer": "gpt2", "chars": None}, 50304, gpt2_chat),
             "bpe": (bpe_entry, bpe_tok.vocab_size, None), "bpe, chat": (bpe_entry, bpe_tok.vocab_size + 4, bpe_chat)}
    text = "What is 2 + 2? naïve café"
    for name, (entry, vocab, chat) in cases.items():
        model, out = export(tmp_path / name.replace(", ", "-"), entry, vocab, chat)
        loaded, tok = load_for_inference(str(out)), tokenizer_from_meta(entry)
        assert loaded.tok.encode(text) == tok.encode(text) and loaded.tok.vocab_size == tok.vocab_size, name
        assert (loaded.chat_template.to_dict() if loaded.chat_template else None) == chat, name
        ids = torch.tensor([tok.encode(text)])
        rows = loaded.model.config.vocab_size
        with torch.no_grad():
            torch.testing.assert_close(loaded.model(ids)[..., :rows], model(ids)[..., :rows], rtol=0, atol=1e-5)


def test_a_gpt2_folder_saved_by_transformers_alone_stays_gpt2s(tmp_path):
    """transformers 5 saves GPT-2's tokenizer as tokenizer.json alone (no vocab.json), as our bpe exports are: read
    back as a trained BPE, it was named bpe:50257, and model.init_from then demanded data.tokenizer=gpt2 and refused
    it. Only our export's own tokenizer class is read as a trained BPE."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from checkpoint import load_for_inference

    _, out = export(tmp_path, {"tokenizer": "gpt2", "chars": None}, 50257, None)
    AutoTokenizer.from_pretrained(out).save_pretrained(tmp_path / "resaved")
    AutoModelForCausalLM.from_pretrained(out).save_pretrained(tmp_path / "resaved")
    assert not (tmp_path / "resaved" / "vocab.json").exists() and (tmp_path / "resaved" / "tokenizer.json").exists()
    assert load_for_inference(str(tmp_path / "resaved")).tokenizer["tokenizer"] == "gpt2"
