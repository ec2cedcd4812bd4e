"""inference/chat_session.py against references written here: the plain uncached forward over the whole
conversation (logits, greedy replies) and the template's own encoding of the messages (the ids)."""
from __future__ import annotations

import pytest
import torch

from chat_models import char_tok, layout, tiny_chat_model
from data.chat_template import template_for
from errors import UserError
from inference.chat_session import ChatSession
from runtime.sampling import Sampling

TOK = char_tok()
TEMPLATE = template_for(TOK)


def session(model, **kw) -> ChatSession:
    kw.setdefault("sampling", Sampling(temperature=0))
    kw.setdefault("max_new_tokens", 10)
    return ChatSession(model, TOK, TEMPLATE, **kw)


def full_logits(model, ids) -> torch.Tensor:
    """The next-token logits from scratch: one plain forward over every id, no cache."""
    with torch.no_grad():
        return model(torch.tensor([ids]))[0, -1]


def reference_greedy(model, ids, n) -> list[int]:
    """Argmax, one uncached forward per token, until a marker or end-of-text (or n tokens)."""
    out = []
    for _ in range(n):
        t = int(full_logits(model, ids + out)[:TEMPLATE.vocab_size].argmax())
        if t >= TEMPLATE.base or t == TOK.eot:
            break
        out.append(t)
    return out


def test_a_new_turn_prefills_only_its_tokens_and_gets_the_logits_of_a_full_prefill():
    model = tiny_chat_model(block_size=128)
    s = session(model, system="be brief")
    for text in ("hello there", "what is 2+2?"):
        "".join(s.reply(text))
    pending = len(s.seq.ids) - s.seq.cached  # the last reply's closing <|end|> (and its last token)
    assert 1 <= pending <= 2
    widths = []
    hook = model.transformer.wte.register_forward_hook(lambda m, args, out: widths.append(args[0].size(1)))
    try:
        new = s.turn_ids("user", "and 3+3?") + [TEMPLATE.id("<|assistant|>")]
        s.seq.append(new)
        cached = s.seq.logits()[0]
    finally:
        hook.remove()
    assert widths == [pending + len(new)]  # one forward, of the new turn only: the cache kept the earlier turns
    expected = full_logits(model, s.seq.ids)
    assert cached.dtype == torch.float32
    torch.testing.assert_close(cached, expected, rtol=0, atol=1e-5)
    # the session's ids are the template's (a conversation with no empty reply: encode_prompt takes it)
    assert all(m["content"] for m in s.messages)
    assert s.seq.ids[:-len(new)] == TEMPLATE.encode_prompt(TOK, s.messages, add_generation_prompt=False)
    asked = s.messages + [{"role": "user", "content": "and 3+3?"}]
    assert layout(TEMPLATE, TOK, asked) == TEMPLATE.encode_prompt(TOK, asked) == s.seq.ids  # the tests' hand layout too


def test_greedy_replies_equal_the_uncached_argmax_loop_and_ignore_the_seed():
    model = tiny_chat_model(end_bias=5.0)
    replies = []
    for seed in (0, 1):
        s = session(model, seed=seed, system="you add")
        replies.append(["".join(s.reply(t)) for t in ("hi", "1+1?", "bye")])
        ids = layout(TEMPLATE, TOK, s.messages[:-1])
        assert TOK.encode(s.messages[-1]["content"]) == reference_greedy(model, ids, 10)
    assert replies[0] == replies[1]
    assert any(0 < len(r) < 10 for r in replies[0]), "some reply should end at <|end|> before max_new_tokens"


def test_sampling_with_a_temperature_draws_from_the_session_seed():
    model = tiny_chat_model()
    texts = {seed: "".join(session(model, seed=seed, sampling=Sampling(temperature=1.0, top_k=None)).reply("hi"))
             for seed in (0, 0, 1, 2)}
    again = "".join(session(model, seed=0, sampling=Sampling(temperature=1.0, top_k=None)).reply("hi"))
    assert again == texts[0] and len(set(texts.values())) > 1


def test_a_full_context_drops_the_oldest_exchanges_keeps_the_system_message_and_says_so():
    model = tiny_chat_model(block_size=64)
    notices = []
    s = session(model, system="sys", max_new_tokens=8, notice=notices.append)
    for i in range(8):
        "".join(s.reply(f"message number {i}"))
        assert s._length() <= 64 + 1
    assert notices and all("dropped the oldest" in n and "system message is kept" in n for n in notices)
    assert s.messages[0] == {"role": "system", "content": "sys"}
    assert s.messages[1]["content"] != "message number 0" and s.messages[-2]["content"] == "message number 7"
    new = s.turn_ids("user", "x") + [TEMPLATE.id("<|assistant|>")]
    if s.seq.room >= len(new):
        s.seq.append(new)
        torch.testing.assert_close(s.seq.logits()[0], full_logits(model, s.seq.ids), rtol=0, atol=1e-5)


def test_a_reply_that_fills_the_context_with_nothing_to_drop_is_cut_with_a_notice():
    """The reply takes the token the full context's logits give, as serve.py and sample.py do (it stopped one
    token earlier, so chat.py and the server's documented-equal replies differed at the context's end)."""
    model = tiny_chat_model(block_size=32)
    notices = []
    s = session(model, max_new_tokens=100, reply_room=4, notice=notices.append)
    ids = s.turn_ids("user", "tell me a story") + [TEMPLATE.id("<|assistant|>")]
    expected = reference_greedy(model, ids, 32 + 1 - len(ids))  # its last forward: all 32 slots
    reply = "".join(s.reply("tell me a story"))
    assert any("cut" in n for n in notices)
    assert len(expected) == 33 - len(ids) and reply == TOK.decode(expected)
    assert len(s.seq.ids) == 32
    s.set_system("be")  # the cut exchange outgrows the context: dropped, said (it asserted in seq.reset)
    assert [t.role for t in s.turns] == ["system"] and any("dropped the oldest" in n for n in notices)
    "".join(s.reply("more"))  # the next turn drops the cut exchange and goes on
    assert [m["content"] for m in s.messages if m["role"] == "user"] == ["more"]


def test_stopping_a_reply_closes_the_turn_with_what_was_said_and_the_chat_goes_on():
    model = tiny_chat_model()
    s = session(model, max_new_tokens=20)
    pieces = s.reply("hello")
    said = next(pieces) + next(pieces)
    pieces.close()  # what chat.py does on Ctrl-C
    assert s.messages[-1] == {"role": "assistant", "content": said}
    assert s.seq.ids == TEMPLATE.encode_prompt(TOK, s.messages, add_generation_prompt=False)
    "".join(s.reply("again"))
    s.seq.append(s.turn_ids("user", "x") + [TEMPLATE.id("<|assistant|>")])
    torch.testing.assert_close(s.seq.logits()[0], full_logits(model, s.seq.ids), rtol=0, atol=1e-5)


def test_bad_messages_are_one_line_errors_and_change_nothing():
    model = tiny_chat_model(block_size=64)
    s = session(model)
    "".join(s.reply("hi"))
    before = (list(s.seq.ids), s.messages)
    with pytest.raises(UserError, match="shorten it"):
        s.reply("a" * 200)
    with pytest.raises(UserError):
        s.reply("caf\u00e9 \u4e16")  # characters the char vocabulary lacks
    assert (s.seq.ids, s.messages) == before
    with pytest.raises(UserError, match="system message"):
        s.set_system("b" * 100)


def test_clear_and_system_rebuild_the_conversation():
    model = tiny_chat_model()
    s = session(model, system="one")
    "".join(s.reply("hi"))
    s.set_system("two")
    assert s.messages[0]["content"] == "two" and len(s.messages) == 3
    assert s.seq.ids == layout(TEMPLATE, TOK, s.messages, add_generation_prompt=False)
    s.clear()
    assert s.messages == [{"role": "system", "content": "two"}]
    s.set_system("")
    assert s.messages == [] and s.seq.ids == []
    assert "".join(s.reply("hi")) == "".join(session(model).reply("hi"))


def test_the_cache_grows_with_the_conversation_and_keeps_the_logits_of_a_full_prefill(monkeypatch):
    from model.generate import CachedSequence

    monkeypatch.setattr(CachedSequence, "FIRST_SLOTS", 8)
    model = tiny_chat_model(block_size=100)
    seq = CachedSequence(model)
    ids = torch.randint(0, TOK.vocab_size, (100,), generator=torch.Generator().manual_seed(0)).tolist()
    sizes, at = [], 0
    for n in (5, 1, 1, 20, 1, 40, 1, 31):  # 100 ids: past 8, 16, 32 and 64 slots, then capped at block_size
        seq.append(ids[at:at + n])
        at += n
        torch.testing.assert_close(seq.logits()[0], full_logits(model, seq.ids), rtol=0, atol=1e-5)
        sizes.append(seq.cache[0].k.size(2))
    assert sizes == [8, 8, 8, 32, 32, 100, 100, 100]  # 68 ids: 128 slots, capped at block_size
