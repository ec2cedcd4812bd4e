"""Hostile requests to the server, found from outside (`python serve.py` on loopback) and replayed here
in-process over ASGI: each class of input is a 4xx in OpenAI's shape naming the field, never a 500."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chat_models import char_tok, save_chat_checkpoint, tiny_chat_model
from data.chat_template import template_for
import server.app
from server.app import Served, create_app
from server.engine import Engine
from server.schema import Limits

ROOT = Path(__file__).resolve().parents[1]
TOK = char_tok()


@pytest.fixture(scope="module")
def app():
    # the engine is not started: every request here is refused before it would reach it
    # (and a request accepted by mistake ends at its short deadline, a 503, rather than waiting)
    grace, server.app.GRACE_S = server.app.GRACE_S, 0.0
    yield create_app(Served(Engine(tiny_chat_model()), TOK, template_for(TOK), "m", Limits(request_timeout_s=0.05), 0))
    server.app.GRACE_S = grace


def post(app, path: str, raw: str) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.post(path, content=raw.encode(), headers={"content-type": "application/json"})
    return asyncio.run(go())


def assert_openai_400(r: httpx.Response, param: str, *words: str) -> str:
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param, err
    for w in words:
        assert w in err["message"], (w, err)
    return err["message"]


USER = '[{"role": "user", "content": "hi"}]'


@given(name=st.sampled_from(["temperature", "top_p", "frequency_penalty", "presence_penalty"]),
       digits=st.integers(309, 4300), sign=st.sampled_from(["", "-"]))
def test_class_integer_past_floats_range_in_a_number_field_is_400_not_500(app, name, digits, sign):
    # 10**400 as JSON is a Python int: math.isfinite() of it raised OverflowError (a 500)
    r = post(app, "/v1/chat/completions", f'{{"messages": {USER}, "{name}": {sign}{"9" * digits}}}')
    msg = assert_openai_400(r, name, "digits")
    assert len(msg) < 200, msg  # the number is cut, not echoed whole


SURROGATE = st.integers(0xD800, 0xDFFF).map(lambda c: f"\\u{c:04x}")
TEXT = st.text(alphabet="abc ", max_size=5)


@given(where=st.sampled_from(["content", "part", "prompt", "prompt list", "stop"]), s=SURROGATE, a=TEXT, b=TEXT)
def test_class_lone_surrogate_in_any_text_field_is_400_naming_the_field(app, where, s, a, b):
    # JSON's "\ud800" escape is valid JSON but not text: the char tokenizer raised UnicodeEncodeError (a 500)
    text = json.dumps(a + "@" + b).replace("@", s)
    path, body, param = {
        "content": ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": {text}}}]}}',
                    "messages[0].content"),
        "part": ("/v1/chat/completions",
                 f'{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": {text}}}]}}]}}',
                 "messages[0].content"),
        "prompt": ("/v1/completions", f'{{"prompt": {text}}}', "prompt"),
        "prompt list": ("/v1/completions", f'{{"prompt": [{text}]}}', "prompt"),
        "stop": ("/v1/chat/completions", f'{{"messages": {USER}, "stop": [{text}]}}', "stop"),
    }[where]
    assert_openai_400(post(app, path, body), param, "lone surrogate", "valid Unicode")


@given(n=st.integers(-(2**70), 0))
def test_class_n_below_one_is_refused_without_asking_for_n_requests(app, n):
    msg = assert_openai_400(post(app, "/v1/chat/completions", f'{{"messages": {USER}, "n": {n}}}'), "n", "must be 1")
    assert "requests instead" not in msg, msg  # "send 0 requests instead" was the old advice


@given(field=st.sampled_from(["max_tokens", "seed", "n", "temperature", "x"]), digits=st.integers(4301, 6000))
def test_class_integer_over_pythons_digit_limit_anywhere_says_so_not_how_to_raise_the_limit(app, field, digits):
    # int()'s own message ended "use sys.set_int_max_str_digits() to increase the limit": a fix for Python code
    r = post(app, "/v1/chat/completions", f'{{"messages": {USER}, "{field}": {"7" * digits}}}')
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "invalid_json", r.text
    assert "more than 4300 digits" in err["message"] and "sys." not in err["message"], err


@pytest.mark.parametrize("name", [b"m\xff", b"\xed\xa0\x80"])  # (a subprocess each)
def test_class_model_name_not_utf8_is_one_line_before_serving(tmp_path, name):
    # the server started, and every JSON reply naming the model (/v1/models, /health, chat) was a 500
    ckpt = save_chat_checkpoint(tmp_path / "ckpt.pt", tiny_chat_model())
    r = subprocess.run([sys.executable, str(ROOT / "serve.py"), "--checkpoint", str(ckpt), "--port", "0",
                        "--model-name", name], cwd=ROOT, capture_output=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2 and err.startswith("error: --model-name is not valid UTF-8") and err.count("\n") == 1, err
