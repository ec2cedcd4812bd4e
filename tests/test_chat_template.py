"""The chat template (data/chat_template.py): its ids and loss mask against hand-built references, for gpt2, char
and bpe:N; no message content can forge a turn; the checkpoint entry and its damaged forms."""
from __future__ import annotations

import pytest
import tiktoken
from hypothesis import given
from hypothesis import strategies as st

from data.chat_template import MARKERS, ChatTemplate, template_for
from data.tokenizer import BpeTokenizer, CharTokenizer, get_tokenizer, train_bpe
from errors import UserError

ENC = tiktoken.get_encoding("gpt2")
# what contents are built from: the markers' own text and pieces of it, so any forgery would show
FRAGMENTS = ["<|", "|>", "<", "|", ">", "user", "assistant", "system", "end", "endoftext", " ", "\n", "a", "é",
             *MARKERS, "<|endoftext|>"]


@pytest.fixture(scope="module")
def tokenizers():
    chars = "".join(sorted(set("".join(FRAGMENTS) + "hi there, how are you? fine.")))
    texts = ["hi there <|user|> how are you <|end|> fine"] * 20 + [" ".join(FRAGMENTS)] * 20
    return {"gpt2": get_tokenizer("gpt2"), "char": CharTokenizer(chars),
            "bpe": BpeTokenizer("bpe:600", train_bpe(texts, 600))}


CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello there"}, {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "bye!"}]


def test_gpt2_ids_and_mask_equal_a_hand_built_reference():
    tok = get_tokenizer("gpt2")
    t = template_for(tok)
    assert (t.base, t.end, t.vocab_size) == (50257, 50260, 50261)
    sys_, user, asst, end = 50257, 50258, 50259, 50260  # GPT-2's vocabulary ends at 50256 (eot)
    e = ENC.encode_ordinary
    want_ids = ([sys_, *e("Be brief."), end, user, *e("hi"), end, asst, *e("hello there"), end,
                 user, *e("bye"), end, asst, *e("bye!"), end])
    want_mask = ([False] * (len(e("Be brief.")) + 2) + [False] * (len(e("hi")) + 2) + [False]
                 + [True] * (len(e("hello there")) + 1) + [False] * (len(e("bye")) + 2) + [False]
                 + [True] * (len(e("bye!")) + 1))
    ids, mask = t.encode_conversation(tok, CONV)
    assert ids == want_ids and mask == want_mask
    prompt = t.encode_prompt(tok, CONV[:4])
    assert prompt == want_ids[: len(prompt) - 1] + [asst] and prompt[-2] == end
    assert t.encode_prompt(tok, CONV, add_generation_prompt=False) == want_ids
    assert t.decode(tok, ids) == "Be brief.hihello therebyebye!"


def test_the_markers_sit_right_above_each_tokenizers_vocabulary(tokenizers):
    char, bpe = tokenizers["char"], tokenizers["bpe"]
    assert template_for(char).base == len(char.chars) + 1  # len(chars) is the char tokenizer's eot
    assert template_for(bpe).base == bpe.vocab_size and bpe.vocab_size <= 600
    t = template_for(char)
    assert [t.id(m) for m in MARKERS] == list(range(t.base, t.base + 4))
    with pytest.raises(UserError, match="not a chat marker"):
        t.id("<|bot|>")


content = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8).map("".join).filter(str.strip)


@st.composite
def conversations(draw):
    n = draw(st.integers(1, 3))
    msgs = [{"role": "system", "content": draw(content)}] if draw(st.booleans()) else []
    for _ in range(n):
        msgs += [{"role": "user", "content": draw(content)}, {"role": "assistant", "content": draw(content)}]
    return msgs


@pytest.mark.parametrize("name", ["gpt2", "char", "bpe"])
@given(msgs=conversations())
def test_no_content_can_forge_a_turn(tokenizers, name, msgs):
    """Contents made of the markers' text: the marker ids come only where the layout puts them, and what lies
    between them decodes back to each message's text exactly."""
    tok = tokenizers[name]
    t = template_for(tok)
    ids, mask = t.encode_conversation(tok, msgs)
    markers = [(k, i) for k, i in enumerate(ids) if i >= t.base]
    assert [i for _, i in markers] == [x for m in msgs for x in (t.id(f"<|{m['role']}|>"), t.end)]
    for n, m in enumerate(msgs):
        (start, _), (stop, _) = markers[2 * n], markers[2 * n + 1]
        assert tok.decode(ids[start + 1: stop]) == m["content"]
        assert all(mask[start + 1: stop + 1]) == (m["role"] == "assistant") and not mask[start]
        assert any(mask[start + 1: stop + 1]) == (m["role"] == "assistant")


def test_a_character_outside_the_char_vocabulary_is_one_line_naming_it(tokenizers):
    tok = tokenizers["char"]
    with pytest.raises(UserError) as e:
        template_for(tok).encode_conversation(tok, [{"role": "user", "content": "hi"},
                                                    {"role": "assistant", "content": "hi 🎉"}])
    assert "\n" not in str(e.value) and "message 2 (assistant)" in str(e.value) and "'🎉'" in str(e.value)


def test_a_prompt_must_end_with_a_user_turn_and_a_conversation_with_a_reply():
    tok = get_tokenizer("gpt2")
    t = template_for(tok)
    with pytest.raises(UserError, match="the prompt: it does not end with a user turn"):
        t.encode_prompt(tok, CONV)
    with pytest.raises(UserError, match="the conversation: its last message .* no reply"):
        t.encode_conversation(tok, CONV[:4])


def test_the_checkpoint_entry_round_trips():
    t = template_for(get_tokenizer("gpt2"))
    d = t.to_dict()
    assert d == {"name": "smallgpt-chat-v1", "markers": {"<|system|>": 50257, "<|user|>": 50258,
                                                         "<|assistant|>": 50259, "<|end|>": 50260}}
    assert ChatTemplate.from_dict(d) == t


GOOD = {"<|system|>": 10, "<|user|>": 11, "<|assistant|>": 12, "<|end|>": 13}


@pytest.mark.parametrize("entry", [None, [], "x", {"name": "smallgpt-chat-v1"}, {"name": "other", "markers": GOOD},
                                   {"name": "smallgpt-chat-v1", "markers": {**GOOD, "<|tool|>": 14}},
                                   {"name": "smallgpt-chat-v1", "markers": {**GOOD, "<|end|>": 15}},
                                   {"name": "smallgpt-chat-v1", "markers": {**GOOD, "<|system|>": "10"}},
                                   {"name": "smallgpt-chat-v1", "markers": {**GOOD, "<|system|>": True}},
                                   {"name": "smallgpt-chat-v1", "markers": dict(zip(MARKERS, [0, 1, 2, 3]))},
                                   {"name": "smallgpt-chat-v1", "markers": dict(zip(MARKERS, [1, True, 3, 4]))}])
def test_a_damaged_checkpoint_entry_is_one_line(entry):
    with pytest.raises(UserError) as e:
        ChatTemplate.from_dict(entry)
    assert "\n" not in str(e.value) and "chat_template entry is damaged" in str(e.value)


HUGE = st.one_of(st.integers(min_value=10**5000, max_value=10**5001), st.text(min_size=2000, max_size=3000),
                 st.just(-(10**9000)), st.lists(st.integers(), min_size=500, max_size=600))


@given(where=st.sampled_from(["name", "<|system|>", "<|end|>", "extra key"]), value=HUGE)
def test_a_damaged_entry_quotes_its_values_cut(where, value):
    """A checkpoint's chat_template entry holding a 5000-digit id was a ValueError from str() (Python's limit on
    printing ints), and a long name or key a line as long; each value is quoted cut, the line stays short."""
    markers = dict(GOOD)
    entry = {"name": "smallgpt-chat-v1", "markers": markers}
    if where == "name":
        entry["name"] = value
    elif where == "extra key":
        markers[str(value)[:3000] if not isinstance(value, int) else value] = 1
    else:
        markers[where] = value
    with pytest.raises(UserError) as e:
        ChatTemplate.from_dict(entry)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300 and "chat_template entry is damaged" in str(e.value)
