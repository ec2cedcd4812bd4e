"""Hostile requests to the server, found from outside (`python serve.py` on loopback) and replayed here
in-process over ASGI: each class of input is a 4xx in OpenAI's shape naming the field, never a 500."""
from __future__ import annotations

import asyncio
import json
import os
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
import warm_runs

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


@given(name=st.sampled_from(["temperature", "top_p", "frequency_penalty", "presence_penalty", "min_p",
                             "repetition_penalty"]),
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


@given(field=st.sampled_from(["n", "max_tokens", "max_completion_tokens", "seed", "temperature", "top_p",
                              "frequency_penalty", "presence_penalty", "top_k", "min_p", "repetition_penalty"]),
       digits=st.integers(30, 4300), sign=st.sampled_from(["", "-"]))
def test_class_a_huge_number_in_any_field_is_quoted_cut(app, field, digits, sign):
    """n of 4000 digits gave an 8,171-byte error, the number twice ("send 9999...9 requests instead"): every
    field's refusal quotes a number cut, and names it once."""
    number = sign + "9" * digits
    msg = assert_openai_400(post(app, "/v1/chat/completions", f'{{"messages": {USER}, "{field}": {number}}}'), field)
    assert len(msg) < 300 and msg.count("9" * 20) <= 1, msg


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
    r = warm_runs.run([ROOT / "serve.py", "--checkpoint", ckpt, "--port", "0", "--model-name", name], cwd=ROOT,
                      env={**os.environ, "OMP_NUM_THREADS": "1"}, text=False)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2 and err.startswith("error: --model-name is not valid UTF-8") and err.count("\n") == 1, err


def asgi(app, path: str, chunks: list[bytes], *, declared: int, leaves: bool, method: str = "POST",
         host: bytes = b"t") -> list[dict]:
    """One request straight through the ASGI app: the body in `chunks`, then (leaves) the client gone before
    the rest arrives, as uvicorn reports it. -> the messages the app sent."""
    incoming = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]
    incoming.append({"type": "http.disconnect"} if leaves else {"type": "http.request", "body": b"", "more_body": False})
    sent = []

    async def receive():
        return incoming.pop(0) if len(incoming) > 1 else incoming[0]

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", host), (b"content-length", str(declared).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    asyncio.run(app(scope, receive, send))
    return sent


BODY = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}'


@given(cut=st.integers(0, len(BODY) - 1), pieces=st.integers(1, 4),
       path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_class_client_leaving_during_its_upload_is_no_error_and_no_500(app, capsys, cut, pieces, path):
    # Starlette's ClientDisconnect escaped the route: a plain-text 500 was sent to nobody and the log got
    # "error: POST ... failed (ClientDisconnect)"
    part = BODY[:cut]
    step = max(1, -(-len(part) // pieces))
    sent = asgi(app, path, [part[i:i + step] for i in range(0, len(part), step)], declared=len(BODY), leaves=True)
    statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
    assert all(s < 500 for s in statuses), statuses
    assert "error" not in capsys.readouterr().err
    # and the app still answers the next client: a whole body that is refused (the engine is not started here)
    answer = asgi(app, path, [b'{"max_tokens": 0}'], declared=17, leaves=False)
    assert answer[0]["status"] == 400


FAULTS = ("empty", "blank", "parts", "role", "developer")


@st.composite
def one_fault(draw):
    """A good conversation ([system or developer] then user, assistant, ..., user) with one fault at a random
    index -> (messages, index, field, the role sent at that index)."""
    lead = draw(st.sampled_from([[], ["system"], ["developer"]]))
    exchanges = draw(st.integers(0, 3))
    roles = lead + ["user", "assistant"] * exchanges + ["user"]
    messages = [{"role": r, "content": f"m{i}"} for i, r in enumerate(roles)]
    fault = draw(st.sampled_from(FAULTS))
    if fault in ("empty", "blank", "parts"):
        i = draw(st.integers(0, len(roles) - 1))
        messages[i]["content"] = {"empty": "", "blank": draw(st.sampled_from([" ", "\n", " \t "])),
                                  "parts": draw(st.sampled_from([[], [{"type": "text", "text": " "}]]))}[fault]
        return messages, i, "content", roles[i]
    # a role out of place; index 0 (or the lead's) only takes 'assistant': a system there is allowed,
    # and a user would move the first mismatch to the next message
    i = draw(st.integers(len(lead), len(roles) - 1))
    expected = roles[i]
    if i == len(lead):
        wrong = "assistant"
    elif fault == "developer":
        wrong = draw(st.sampled_from(["developer", "system"]))
    else:
        wrong = "assistant" if expected == "user" else "user"
    messages[i]["role"] = wrong
    return messages, i, "role", wrong


@given(case=one_fault())
def test_class_a_faulty_message_is_named_by_its_0_based_index_field_and_role_as_sent(app, case):
    # an empty content was "message 2 (assistant)" (counted from 1, param "messages"), and a developer
    # message out of place was quoted as 'system'
    messages, i, field, role = case
    where = f"messages[{i}].{field}"
    msg = assert_openai_400(post(app, "/v1/chat/completions", json.dumps({"messages": messages})), where)
    assert msg.startswith(where + ": ") and repr(role)[1:-1] in msg, msg
    assert f"message {i + 1} " not in msg, msg


@given(value=st.sampled_from([1, 0, "yes", [], {}, 1.5]))
def test_class_a_nested_field_is_named_by_its_whole_path(app, value):
    body = json.dumps({"messages": json.loads(USER), "stream_options": {"include_usage": value}})
    assert_openai_400(post(app, "/v1/chat/completions", body), "stream_options.include_usage",
                      "stream_options.include_usage:")


@given(bad=st.sampled_from(["max_tokens", "max_completion_tokens"]), value=st.sampled_from([0, -1, 10**6, "3", 1.5]),
       good=st.integers(1, 64))
def test_class_each_token_limit_field_given_is_checked(app, bad, value, good):
    # {"max_completion_tokens": 3, "max_tokens": 0} was accepted: max_tokens was read only without the other
    other = "max_completion_tokens" if bad == "max_tokens" else "max_tokens"
    body = json.dumps({"messages": json.loads(USER), other: good, bad: value})
    assert_openai_400(post(app, "/v1/chat/completions", body), bad, bad + ":")


ROUTES = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/health"), ("GET", "/v1/models"),
          ("GET", "/v1/models/m")]  # a model's card: its id followed by a slash was "model 'm/' does not exist"


@given(route=st.sampled_from(ROUTES), slashes=st.integers(1, 3),
       host=st.sampled_from([b"evil.example", b"127.0.0.1:8000", b"x"]))
def test_class_a_trailing_slash_is_a_404_naming_the_route_not_a_redirect(app, route, slashes, host):
    # Starlette answered 307 with Location: http://<the client's Host>/<route>: an open redirect, empty body
    method, path = route
    sent = asgi(app, path + "/" * slashes, [], declared=0, leaves=False, method=method, host=host)
    start, body = sent[0], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert start["status"] == 404 and b"location" not in dict(start["headers"]), start
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and path + "/" * slashes in err["message"], err
    assert f"the route is {path} " in err["message"] and host.decode() not in err["message"], err


def test_a_route_that_fails_is_a_500_in_openais_shape_and_one_log_line(app, capsys, monkeypatch):
    # Starlette's own plain-text 500 went out before Guard's OpenAI-shaped one could
    monkeypatch.setattr(Engine, "load", lambda self: 1 / 0)
    sent = asgi(app, "/health", [], declared=0, leaves=False, method="GET")
    assert sent[0]["status"] == 500, sent
    assert json.loads(sent[1]["body"])["error"]["code"] == "internal_error", sent
    err = capsys.readouterr().err
    assert err == "error: GET /health failed (ZeroDivisionError: division by zero)\n", err


def _refused_upload(port: int, path: str, declared: int, send: int) -> tuple[bytes, str, float]:
    """POST `path` declaring `declared` bytes, send `send` of them as a client that does not wait, then read
    -> (what came back, how the reading ended: "closed" (EOF), "reset" or "open", seconds after the sending)."""
    import socket
    import time

    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {declared}\r\n\r\n".encode())
        try:
            for _ in range(send // 2**16):
                s.sendall(b" " * 2**16)
        except OSError:  # closed by the server already
            pass
        start, got, end = time.monotonic(), b"", "open"
        s.settimeout(3)
        try:
            while chunk := s.recv(2**16):
                got += chunk
            end = "closed"  # EOF
        except ConnectionResetError:  # closed on the client's bytes unread: its answer may be lost
            end = "reset"
        except OSError:  # the timeout: the server is still reading (draining) the declared body
            pass
        return got, end, time.monotonic() - start


def test_a_response_before_the_body_is_read_ends_the_connection(tmp_path):
    """A real uvicorn: a request refused before its body was read (Content-Length 2**40, a few MiB sent) gets
    its answer and then the connection ends within seconds, by EOF (the bytes sent were read: no reset); the
    server drained ~100 GiB in 25 s and never closed it. The next client is served. (One server for the four
    routes: each refusal is its own connection.)"""
    from serving import Server, make_chat_checkpoint

    make_chat_checkpoint(tmp_path / "ckpt.pt")
    server = Server(tmp_path / "ckpt.pt")
    try:
        for path, status in (("/v1/completions", 413), ("/v1/chat/completions", 413), ("/nowhere", 404),
                             ("/health", 405)):
            got, end, seconds = _refused_upload(server.port, path, 2**40, 4 * 2**20)
            assert got.startswith(f"HTTP/1.1 {status} ".encode()) and b"connection: close" in got.lower(), got[:300]
            assert end == "closed" and seconds < 2.5, (path, end, seconds)
            assert server.http.get(server.url + "/health").status_code == 200
        # a client waiting for "100 Continue" (curl past 1 MiB) gets the 413 at once, not a "100 Continue" first
        import socket

        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10000000\r\n"
                      b"Expect: 100-continue\r\n\r\n")
            s.settimeout(3)
            first = s.recv(64)
        assert first.startswith(b"HTTP/1.1 413 "), first
        # a body read whole keeps its connection (keep-alive): only a refusal before the body closes it
        r = server.http.post(server.url + "/v1/completions", json={"prompt": "ab", "max_tokens": 0})
        assert r.status_code == 400 and r.headers.get("connection") != "close", (r.status_code, r.headers)
    finally:
        server.stop()
