"""The chat template in an HF export: tokenizer_config.json's `chat_template` (Jinja) and the four markers as
added special tokens at our ids, so that `AutoTokenizer.apply_chat_template(messages, add_generation_prompt=True)`
gives exactly `ChatTemplate.encode_prompt`'s ids and `pipeline("text-generation")` takes a list of messages.

transformers renders the template to a string and then tokenizes it, splitting at the special tokens: so the
markers must be recognised in text (split_special_tokens off), and a message whose content holds a marker's
text would become a forged turn there. Our encoder reads such content as plain text; the Jinja template
refuses it (raise_exception) instead of giving other ids. The same goes for "<|endoftext|>", which a chat
export's tokenizer reads as the end-of-text token (a plain export's reads it as text).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from data.chat_template import MARKERS, NAME, ChatTemplate
from data.manifest import TOKENIZER_MAX  # (the largest bpe:<n> a run may train)
from data.tokenizer import BPE_MIN
from errors import UserError
from fileio import json_loads, path_kind, read_user_file


EOT_TEXT = "<|endoftext|>"
BPE_CLASS = "PreTrainedTokenizerFast"  # tokenizer_config.json's class in an export of a trained BPE (export.py)
GPT2_IDS = 50257  # GPT-2's BPE vocabulary, end-of-text included
# The layout of data/chat_template.py: [<|system|> c <|end|>] (<|user|> c <|end|> <|assistant|> c <|end|>)+ and,
# for a generation prompt, <|assistant|>. Order and alternation are checked by our encoder, not here: the
# template only renders what it is given, and refuses what it would render wrongly.
JINJA = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('unknown role ' + message['role'] + ': the roles are system, user and assistant') }}"
    "{%- endif -%}"
    "{%- for marker in " + json.dumps([*MARKERS, EOT_TEXT]) + " -%}"
    "{%- if marker in message['content'] -%}"
    "{{ raise_exception('a message holds the text ' + marker + ', which this template cannot tell from the "
    "token; remove it') }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)


def _added(content: str, token_id: int) -> dict:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def template_of(checkpoint: dict | None, base: int) -> ChatTemplate | None:
    """The checkpoint's chat template (None for a model that was not fine-tuned to chat), checked against the
    tokenizer's vocabulary size `base`."""
    entry = (checkpoint or {}).get("chat_template")
    if entry is None:
        return None
    template = ChatTemplate.from_dict(entry)
    if template.base != base:
        raise UserError(f"the checkpoint's chat template puts {MARKERS[0]} at id {template.base}, but its tokenizer has "
                        f"{base} ids; the checkpoint is damaged: use another one, or fine-tune again")
    return template


def with_chat(files: dict[str, bytes], template: ChatTemplate, eot: int) -> dict[str, bytes]:
    """The tokenizer files of an export, the chat template and its markers added."""
    files = dict(files)
    config = json_loads(files["tokenizer_config.json"])
    decoder = {str(eot): _added(EOT_TEXT, eot)}
    decoder.update({str(template.id(m)): _added(m, template.id(m)) for m in MARKERS})
    config.update(chat_template=JINJA, split_special_tokens=False, extra_special_tokens=list(MARKERS),
                  added_tokens_decoder={k: {x: v[x] for x in v if x != "id"} for k, v in decoder.items()})
    files["tokenizer_config.json"] = _json(config)
    if "tokenizer.json" in files:  # a trained BPE: its own file lists the added tokens too
        spec = json_loads(files["tokenizer.json"])
        spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in MARKERS]
        spec["added_tokens"] += [_added(m, template.id(m)) for m in MARKERS]
        files["tokenizer.json"] = json.dumps(spec, ensure_ascii=False).encode()
    special = json_loads(files["special_tokens_map.json"])
    files["special_tokens_map.json"] = _json({**special, "additional_special_tokens": list(MARKERS)})
    return files


def chat_generation_config(config: bytes, template: ChatTemplate) -> bytes:
    """Generation stops at <|end|> (the end of a reply) as well as at the end-of-text token."""
    gen = json_loads(config)
    gen["eos_token_id"] = [template.end, gen["eos_token_id"]]
    return _json(gen)


def read_back(path: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """What an export of ours in GPT-2's format says of its tokenizer, read back: (the tokenizer entry of a
    checkpoint, or None for GPT-2's own files; the chat_template entry, or None). Our trained BPE is the folder's
    tokenizer.json with no vocab.json (its ids are not GPT-2's: loaded with GPT-2's tokenizer, a bpe:512 export
    was "50257 ids but the model only 512", a bpe:N of N >= 50257 would read wrong text); our chat template is
    tokenizer_config.json's exact JINJA with the four markers (chat.py called a fine-tuned export "not a chat
    model" and said to fine-tune it). Anything else is read as GPT-2's, as transformers' GPT2Tokenizer reads it."""
    def text(name: str, needed_by: str = "") -> str | None:
        if not (path / name).is_file():
            if os.path.lexists(path / name):  # a FIFO (a read would wait), a device, a directory, a broken link
                raise UserError(f"{path / name} is {path_kind(path / name)}, not a file; put the file there (re-export "
                                "the checkpoint), or remove it")
            if needed_by:  # read as GPT-2's, the model's ids would be said not to fit GPT-2's 50257, naming neither file
                raise UserError(f"{path / name} is missing, but {needed_by}; re-export the checkpoint")
            return None
        raw = read_user_file(path / name, name, limit=TOKENIZER_MAX, fix="re-export it")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{path / name} is not UTF-8 text; re-export it") from None

    config = text("tokenizer_config.json")
    try:
        config = json_loads(config) if config is not None else {}
    except ValueError:
        raise UserError(f"{path / 'tokenizer_config.json'} is not JSON; re-export it") from None
    chat = None
    decoder = config.get("added_tokens_decoder") if isinstance(config, dict) else None
    if isinstance(config, dict) and config.get("chat_template") == JINJA and isinstance(decoder, dict):
        ids = {v.get("content"): k for k, v in decoder.items() if isinstance(v, dict)}
        if all(m in ids for m in MARKERS):
            chat = {"name": NAME, "markers": {m: int(ids[m]) if str(ids[m]).isdigit() else ids[m] for m in MARKERS}}
    # ours: the class bpe_tokenizer_files writes, and no vocab.json (transformers 5 saves GPT-2's own tokenizer as a
    # tokenizer.json alone, under its own class name: that folder is GPT-2's, and read as GPT-2's)
    ours = isinstance(config, dict) and config.get("tokenizer_class") == BPE_CLASS
    bpe = text("tokenizer.json", f"tokenizer_config.json's tokenizer_class {BPE_CLASS} reads its vocabulary "
                                 "from it") if ours and not os.path.lexists(path / "vocab.json") else None
    if bpe is None:
        return None, chat
    try:
        spec = json_loads(bpe)
        spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in MARKERS]  # with_chat's, undone
        vocab = spec["model"]["vocab"]
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path / 'tokenizer.json'} is not a tokenizer this project reads ({type(e).__name__}); pass "
                        "an HF GPT-2 directory with GPT-2's vocab.json, or the checkpoint it was exported from") from None
    if isinstance(vocab, dict) and len(vocab) == GPT2_IDS and vocab.get("Ġthe") == 262:  # GPT-2's own, so named
        return None, chat
    vocab = len(vocab)
    # the name the run asked for (bpe:<n>) is not in the export; the tokenizer is its tokenizer.json, the name a label
    name = f"bpe:{max(vocab, BPE_MIN)}"
    return {"tokenizer": name, "chars": None, "bpe": json.dumps(spec, ensure_ascii=False)}, chat


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()
