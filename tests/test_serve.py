"""The server from outside: `python serve.py` started for real on a loopback port, talked to with the
official `openai` client (its greedy reply equal to `python chat.py`'s, piped), with httpx for bad requests, raw sockets for slow and disconnecting clients, and
headless Chromium for the page. One server process for the module (a tiny chat checkpoint made here)."""
from __future__ import annotations

import concurrent.futures as futures
import io
import json
import os
import re
import socket

import httpx
import openai
import psutil
import pytest

from model.generate import generate
from serving import CHARS, ROOT, Browser, Server, chromium, make_chat_checkpoint
import warm_runs

MODEL = "tinychat"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there, who are you?"}]
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "ckpt.pt"
    model, tok, template = make_chat_checkpoint(path)
    # --read-timeout 3: short, for the test of bodies that never come, and long enough that a body sent at once
    # arrives within it while the other test process keeps both cores busy (at 1 s, one of 500 requests once did not)
    server = Server(path, "--model-name", MODEL, "--slots", "4", "--queue", "64", "--read-timeout", "3",
                    "--request-timeout", "60")
    yield server, model, tok, template, path
    server.stop()
    log = server.log()
    assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def http():
    """One httpx client for the module: a new one per request costs ~80 ms (its SSL context)."""
    with httpx.Client(timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key="unused", max_retries=0, timeout=30)


def reference_reply(model, tok, template, messages, max_tokens: int) -> str:
    """The greedy reply by the generation path itself, not through the server: it ends at the first marker
    or end-of-text, as the server's and chat.py's replies do."""
    ids = generate(model, [template.encode_prompt(tok, messages)], max_tokens, temperature=0, eot=template.end,
                   vocab_size=template.vocab_size)[0]
    ends = [i for i, t in enumerate(ids) if t >= template.base or t == tok.eot]
    return template.decode(tok, ids[: ends[0]] if ends else ids)


def chat_py_reply(checkpoint, system: str, message: str, max_tokens: int) -> str:
    """`python chat.py` with the message piped on stdin (greedy): its one stdout line, unescaped."""
    r = warm_runs.run(["chat.py", "--checkpoint", checkpoint, "--system", system, "--max-new-tokens", max_tokens,
                       "--dtype", "float32", "--device", "cpu"], input=message + "\n", cwd=ROOT,
                      env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    line = r.stdout.removesuffix("\n")
    assert "\n" not in line, r.stdout
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r", "\\": "\\"}[m.group(1)], line)


def test_openai_client_streams_a_reply_and_gets_the_same_greedy_text_whole(served, client):
    server, model, tok, template, path = served
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=30, stream=True)
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1  # it streamed
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=30)
    text = whole.choices[0].message.content
    assert "".join(pieces) == text and text
    assert whole.usage.completion_tokens >= len(pieces)
    assert text == reference_reply(model, tok, template, MESSAGES, 30)
    assert text == chat_py_reply(path, MESSAGES[0]["content"], MESSAGES[1]["content"], 30)
    # vLLM's sampling fields, as its clients send them (extra_body): top_k 1 keeps the greedy token at any temperature
    hot = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=2, max_tokens=30, extra_body={"top_k": 1})
    assert hot.choices[0].message.content == text


def test_completions_continue_plain_text_and_models_lists_the_model(served, client):
    server, model, tok, _, _ = served
    whole = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0)
    ids = generate(model, [tok.encode("Once upon a time")], 12, temperature=0, eot=tok.eot, vocab_size=tok.vocab_size)[0]
    assert whole.choices[0].text == tok.decode(ids)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0, stream=True))
    assert streamed == whole.choices[0].text
    assert [m.id for m in client.models.list()] == [MODEL]


def test_stop_strings_cut_the_reply_before_them(served, client):
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=30)
    text = whole.choices[0].message.content
    assert len(text) >= 4
    stop = text[2:4]
    cut = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=30, stop=[stop])
    assert cut.choices[0].message.content == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=30,
                                              stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text[: text.index(stop)]


def test_concurrent_requests_decode_together_and_each_gets_its_own_reply(served, client):
    server, model, tok, template, _ = served
    questions = [[{"role": "user", "content": q}] for q in ("Hi!", "What is this?", "Tell me a story.", "Why?",
                                                             "ok", "Name three colors, please.")]
    before = server.health()["decode_steps"]
    with futures.ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda m: client.chat.completions.create(model=MODEL, messages=m, temperature=0,
                                                                         max_tokens=40).choices[0].message.content,
                                questions))
    assert replies == [reference_reply(model, tok, template, m, 40) for m in questions]
    assert server.health()["max_batch"] >= 2 and server.health()["decode_steps"] > before


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    return body["error"]


CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
BAD = [  # (path, body, status, code or param the error names)
    (CHAT, b'{"messages": [', 400, "invalid_json"),
    (CHAT, b"\xff\xfe\x00garbage", 400, "invalid_json"),
    (CHAT, b"[1, 2]", 400, "invalid_json"),
    (CHAT, b"[" * 100_000, 400, "invalid_json"),
    (CHAT, {"messages": "hi"}, 400, "messages"),
    (CHAT, {}, 400, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user", "content": 7}]}, 400, "messages[0].content"),
    (CHAT, {"messages": [{"role": "assistant", "content": "hi"}]}, 400, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "hi"}]}, 400, "messages[1].role"),
    (CHAT, {"messages": USER, "temperature": "hot"}, 400, "temperature"),
    (CHAT, {"messages": USER, "temperature": 9}, 400, "temperature"),
    (CHAT, {"messages": USER, "top_p": 0}, 400, "top_p"),
    (CHAT, {"messages": USER, "max_tokens": 0}, 400, "max_tokens"),
    (CHAT, {"messages": USER, "max_tokens": 10**12}, 400, "max_tokens"),
    (CHAT, {"messages": USER, "max_tokens": True}, 400, "max_tokens"),
    (CHAT, {"messages": USER, "stream": "yes"}, 400, "stream"),
    (CHAT, {"messages": USER, "n": 2}, 400, "n"),
    (CHAT, {"messages": USER, "logprobs": True}, 400, "logprobs"),
    (CHAT, {"messages": USER, "stop": [1]}, 400, "stop"),
    (CHAT, {"messages": USER, "model": "gpt-4o"}, 404, "model_not_found"),
    (CHAT, {"messages": USER, "model": ["x"]}, 400, "model"),
    (CHAT, {"messages": [{"role": "user", "content": "hi " * 60}]}, 400, "context_length_exceeded"),
    (CHAT, {"messages": [{"role": "user", "content": "\u00e9\u00e8"}]}, 400, "messages[0].content"),  # not in the vocabulary
    (CHAT, {"messages": USER * 300}, 400, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": "x" * (2 << 20)}]}, 413, "request_too_large"),
    ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, -1]}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "a b " * 60}, 400, "context_length_exceeded"),
    ("/nowhere", {}, 404, "404"),
]


@pytest.mark.parametrize("path, body, status, names", BAD, ids=[f"{i}-{b[3]}" for i, b in enumerate(BAD)])
def test_each_bad_request_is_an_openai_shaped_4xx(served, http, path, body, status, names):
    server = served[0]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    err = error_of(http.post(server.url + path, content=content), status)
    assert names in (err["code"], err["param"]), err


def test_the_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.chat.completions.create(model=MODEL, messages=USER, n=2)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=USER)


def test_wrong_method_is_405(served, http):
    error_of(http.get(served[0].url + CHAT), 405)


@pytest.mark.parametrize("route", ["/", "/health", "/v1/models", f"/v1/models/{MODEL}", "/v1/models/nope"])
def test_every_get_route_answers_head_with_gets_status_and_headers_and_no_body(served, http, route):
    """Found from outside: HEAD / was a 405 (uptime checkers send HEAD)."""
    got, head = http.get(served[0].url + route), http.head(served[0].url + route)
    assert head.status_code == got.status_code and head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    if route != "/health":  # (its load figures change between the two requests)
        assert head.headers["content-length"] == got.headers["content-length"] == str(len(got.content))


def test_a_client_that_disconnects_mid_stream_frees_its_row(served):
    server = served[0]
    body = {"messages": USER, "max_tokens": 60, "stream": True, "temperature": 1.0}
    with httpx.stream("POST", server.url + CHAT, json=body, timeout=30) as r:
        assert r.status_code == 200
        next(r.iter_lines())
    assert server.wait_idle()["active"] == 0


def raw(port: int, data: bytes, *, read: bool = True, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except socket.timeout:
            pass
        return out


def request_bytes(path: str, body: bytes, declared: int | None = None) -> bytes:
    n = len(body) if declared is None else declared
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n"
            "Connection: close\r\n\r\n").encode() + body


# for each field, values that are wrong (type or range), each a 400 or 404
WRONG = {"messages": [None, True, -1, "x", [], {}, [[]], [{"role": 1}], [{"role": "user"}], [{"content": "hi"}]],
         "temperature": [True, "x", [], -1, 3, {}], "top_p": [0, -1, "x", True, 2, []],
         "max_tokens": [0, -1, "x", True, 1.5, 10**9], "n": [0, 2, "x", True, 1.5], "stream": ["x", 1, [], {}],
         "stop": [1, [1], ["a"] * 5, [""], {}], "model": [1, [], "other", True], "seed": ["x", 1.5, True, []],
         "stream_options": ["x", 1, [], {"include_usage": "x"}], "frequency_penalty": [1, "x", 9]}


def hostile_bodies(n: int) -> list[tuple[str, bytes]]:
    """n bad requests, deterministic: garbage bytes, JSON of the wrong shape, every field with a wrong value."""
    shapes = [None, True, -1, "x", [], [1, 2], "\x00" * 10]
    cases = [(field, value) for field, values in WRONG.items() for value in values]
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append((CHAT, bytes((i * 7 + j * 13) % 256 for j in range(i % 97 + 1))))
        elif kind == 1:
            out.append(("/v1/completions", json.dumps(shapes[i % len(shapes)]).encode() if i % 3 else b"{" * (i % 50)))
        else:
            field, value = cases[i % len(cases)]
            out.append((CHAT, json.dumps({"messages": [{"role": "user", "content": "hi"}], field: value}).encode()))
    return out


def test_hostile_clients_get_answers_and_a_good_request_still_gets_its_reply(served, client, http):
    server = served[0]
    bad = hostile_bodies(300)

    def send(item):
        path, body = item
        r = http.post(server.url + path, content=body)
        return r.status_code, r.json()

    with futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, bad))
    for (path, body), (status, payload) in zip(bad, answers):
        assert 400 <= status < 500 and set(payload["error"]) == ERROR_KEYS, (body[:80], status, payload)

    slow_body = request_bytes(CHAT, b'{"messages": [', declared=100)  # the rest never comes
    stream = json.dumps({"messages": USER, "stream": True, "max_tokens": 50}).encode()
    with futures.ThreadPoolExecutor(16) as pool:
        slow = [pool.submit(raw, server.port, slow_body) for _ in range(4)]
        silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]  # half a request line, then nothing
        for s in silent:
            s.sendall(b"POST /v1/chat/comp")
        gone = [pool.submit(raw, server.port, request_bytes(CHAT, stream), read=False) for _ in range(20)]
        # and some leave during their upload: normal, not a route failure (no "error:" line)
        gone += [pool.submit(raw, server.port, request_bytes(CHAT, stream[:k], declared=len(stream)), read=False)
                 for k in (0, 1, len(stream) // 2, len(stream) - 1)]
        impatient = [pool.submit(lambda: http.post(server.url + CHAT, json={"messages": USER, "max_tokens": 60},
                                                    timeout=0.05)) for _ in range(10)]
        for f in slow:  # the read timeout (3 s here) answers them
            assert f.result().startswith(b"HTTP/1.1 408"), f.result()[:200]
        for f in gone:
            f.result()
        for f in impatient:  # gone after 50 ms: before or after their (short) reply
            try:
                assert f.result().status_code == 200
            except httpx.TimeoutException:
                pass
        reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=10)
        assert reply.choices[0].message.content
        for s in silent:
            s.close()
    assert server.wait_idle(20)["active"] == 0  # nobody's row was left behind
    assert "Traceback" not in server.log() and "error:" not in server.log(), server.log()


def test_memory_after_500_requests_is_within_10_percent_of_after_50(served, http):
    server = served[0]
    proc = psutil.Process(server.proc.pid)
    bodies = [{"messages": [{"role": "user", "content": f"Question {chr(97 + i % 26)}?"}], "max_tokens": 8, "temperature": 0.7,
               "stream": i % 2 == 0} for i in range(500)]

    def send(body):
        r = http.post(server.url + CHAT, json=body)
        assert r.status_code == 200, r.text

    with futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(send, bodies[:50]))
        after_50 = proc.memory_info().rss
        list(pool.map(send, bodies[50:]))
        after_500 = proc.memory_info().rss
    assert after_500 <= 1.10 * after_50, (after_50 / 2**20, after_500 / 2**20)


def trimmed_reply(client, conversation: list[dict], max_tokens: int) -> tuple[str, int]:
    """The greedy reply through the openai client, leaving out the oldest exchange while the server refuses the
    conversation as too long (as chat.py drops them); -> (reply, exchanges left out). Trims in place."""
    dropped = 0
    while True:
        try:
            r = client.chat.completions.create(model=MODEL, messages=conversation, temperature=0, max_tokens=max_tokens)
            return r.choices[0].message.content, dropped
        except openai.BadRequestError as e:
            assert e.code == "context_length_exceeded" and len(conversation) > 2, e
            del conversation[:2]
            dropped += 1


@pytest.mark.skipif(chromium() is None, reason="no Chromium here (apt-get install -y chromium); the page test needs it")
def test_the_page_in_headless_chromium_streams_typed_replies_with_its_defaults(served, client, tmp_path):
    # with its own max tokens (it sent 256, over the server's limit: a 400 on the first message) and turns that
    # outgrow the 128-character context by the third (it sent the whole conversation: context_length_exceeded)
    from PIL import Image

    server, block = served[0], 128  # make_chat_checkpoint's block_size; --max-tokens left at its default
    assert {k: server.health()[k] for k in ("max_tokens", "context")} == {"max_tokens": block, "context": block}
    turns = ["Tell me a story, please, a long one.", "Why is the sky blue, do you know?",
             "And then what happened next?", "What is your name, friend?", "Hello there, who are you?"]
    reply_of = ("(n) => { const b = document.querySelectorAll('.msg.assistant')[n];"
                " return b && b.dataset.state !== 'streaming' && "
                "{state: b.dataset.state, text: b.textContent, chunks: Number(b.dataset.chunks), "
                "errors: document.querySelectorAll('.msg.error').length, "
                "notices: document.querySelectorAll('.msg.notice').length}; }")
    browser = Browser(server.url + "/", tmp_path / "profile")
    try:
        browser.wait_for("document.readyState === 'complete' && document.getElementById('status').textContent "
                         "!== 'connecting…'")
        box = browser.eval("const m = document.getElementById('max_tokens'); [m.value, m.max]")
        assert box == [str(min(256, block))] * 2, box
        browser.eval("document.getElementById('temperature').value = '0'; document.getElementById('input').focus()")
        states = []
        for n, message in enumerate(turns):  # typed, then Enter; each turn sends the conversation so far
            browser.type_text(message)
            browser.press_enter()
            states.append(browser.wait_for(f"({reply_of})({n})"))
        png = browser.screenshot()
        browser.eval("document.getElementById('clear').click(); document.getElementById('input').focus()")
        browser.type_text("Too long. " * 13)  # over the context alone: nothing earlier to leave out
        browser.press_enter()
        alone = browser.wait_for(f"({reply_of})(0)")
        shown = browser.eval("[...document.querySelectorAll('.msg.error')].map(b => b.textContent).join()")
    finally:
        browser.close()
    conversation, notices = [], 0
    for message, state in zip(turns, states):
        conversation.append({"role": "user", "content": message})
        want, dropped = trimmed_reply(client, conversation, min(256, block))
        notices += dropped > 0
        assert state == {**state, "state": "done", "text": want, "errors": 0, "notices": notices}, (message, want)
        if want:  # the page keeps an exchange only with a reply (the template has no empty turns)
            conversation.append({"role": "assistant", "content": want})
        else:
            conversation.pop()
    assert notices >= 2  # the conversation did outgrow the context, more than once
    assert alone["state"] == "error" and "shorten the message" in shown, (alone, shown)
    assert states[0]["chunks"] > 1  # it arrived piece by piece
    image = Image.open(io.BytesIO(png)).convert("L")
    (tmp_path / "page.png").write_bytes(png)
    low, high = image.getextrema()
    assert high - low > 50 and len(image.getcolors(1 << 16)) > 10  # not blank: text and bubbles drawn


def test_a_stop_ends_within_the_shutdown_timeout_when_a_client_stopped_reading(tmp_path):
    """Found from outside: a client that opened a long stream and never read it kept the reply unsent and, after
    SIGTERM, the server alive for as long as it held on (uvicorn's graceful shutdown waits without a bound). The
    stop now waits at most --shutdown-timeout (here 1 s) for the requests in flight: here a reply of 30,000
    tokens to a client that reads none of it, stopped while it is made (waiting for all of it to be made, and
    the write to stall, took 15 s more and fails the same way without the bound: --shutdown-timeout 600)."""
    import signal
    import time

    ckpt = endless_chat_checkpoint(tmp_path / "long.pt", 32768)
    server = Server(ckpt, "--shutdown-timeout", "1", "--slots", "1")
    client = socket.create_connection(("127.0.0.1", server.port))
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 30000, "temperature": 0.0,
                           "stream": True}).encode()
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # and never read: the reply stalls
        deadline = time.monotonic() + 30
        while not server.health()["active"] and time.monotonic() < deadline:  # the reply under way: its 30,000
            time.sleep(0.05)  # tokens (~4 MB of events, past the sockets' buffers) would take ~15 s, then stall
        assert server.health()["active"] == 1  # the request in flight when the stop comes
        start = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=30)
        assert time.monotonic() - start < 8, time.monotonic() - start
        assert "Traceback" not in server.log(), server.log()
    finally:
        client.close()
        server.stop()


def endless_chat_checkpoint(path, block_size: int):
    """A chat model that says "a" for ever (never its end marker): the final norm's output is the constant v, whose
    logit is "a"'s alone."""
    import torch

    from checkpoint import load_checkpoint, save_checkpoint

    make_chat_checkpoint(path, block_size=block_size)
    weights = load_checkpoint(path)["model"]
    v = torch.ones_like(weights["transformer.ln_f.bias"])
    weights["transformer.ln_f.weight"].zero_()
    weights["transformer.ln_f.bias"].copy_(v)
    for key in ("transformer.wte.weight", "lm_head.weight"):
        weights[key][:] = 0.0
        weights[key][CHARS.index("a")] = v
    save_checkpoint(path, load_checkpoint(path) | {"model": weights})
    return path


@pytest.mark.skipif(chromium() is None, reason="no Chromium here (apt-get install -y chromium); the page test needs it")
def test_the_page_forgets_a_cleared_reply_and_keeps_the_conversation_when_a_message_is_too_long(tmp_path):
    """Found from outside (in Chromium): "clear" during a streaming reply brought the cleared exchange back into the
    next request; and a message too long on its own deleted the whole conversation (each retry had left out an
    exchange for good). And a max tokens box at 0 or -5 sent the default without a word. The reference: the
    requests the page sends, recorded by a wrapper of its fetch."""
    server = Server(endless_chat_checkpoint(tmp_path / "endless.pt", 512))
    browser = Browser(server.url + "/", tmp_path / "profile")
    sent = "window.sent.map(b => b.messages.map(m => m.role + ':' + m.content.slice(0, 12)))"
    done = ("(n) => { const b = document.querySelectorAll('.msg.assistant')[n]; "
            "return b && b.dataset.state !== 'streaming' && b.dataset.state; }")
    try:
        browser.wait_for("document.readyState === 'complete' && document.getElementById('status').textContent "
                         "!== 'connecting…'")
        browser.eval("window.sent = []; const f = window.fetch; window.fetch = (u, o) => "
                     "(window.sent.push(JSON.parse(o.body)), f(u, o)); document.getElementById('temperature').value = "
                     "'0'; document.getElementById('max_tokens').value = '500'; document.getElementById('input').focus()")
        browser.type_text("first")
        browser.press_enter()
        browser.wait_for("Number((document.querySelector('.msg.assistant') || {dataset: {}}).dataset.chunks) > 3")
        browser.eval("document.getElementById('clear').click(); document.getElementById('max_tokens').value = '3'; "
                     "document.getElementById('input').focus()")
        for n, text in enumerate(["second", "third"]):
            browser.type_text(text)
            browser.press_enter()
            assert browser.wait_for(f"({done})({n})") == "done"
        browser.type_text("x" * 600)  # over the 512-character context alone
        browser.press_enter()
        assert browser.wait_for(f"({done})(2)") == "error"
        browser.type_text("fourth")
        browser.press_enter()
        assert browser.wait_for(f"({done})(3)") == "done"
        requests = browser.eval(sent)
        boxes, settings = [], []  # out-of-range settings: sent as the nearest bound, blank ones as the defaults
        shown = browser.eval("[...document.querySelectorAll('.msg')].map(b => b.className).join()")
        rows = [("0", "5"), ("-5", "-1"), ("", ""), ("7.9", "2.0"), ("600", "0.75")]
        for n, (tokens, temperature) in enumerate(rows, start=4):
            browser.eval(f"document.getElementById('max_tokens').value = '{tokens}'; "
                         f"document.getElementById('temperature').value = '{temperature}'; "
                         "document.getElementById('input').focus()")
            browser.type_text("settings " + "abcde"[n - 4])
            browser.press_enter()
            assert browser.wait_for(f"({done})({n})") == "done", browser.eval("document.body.innerText")
            boxes.append(browser.eval("['max_tokens', 'temperature'].map(i => document.getElementById(i).value)"))
            settings.append(browser.eval("[window.sent.at(-1).max_tokens, window.sent.at(-1).temperature]"))
    finally:
        browser.close()
        server.stop()
    # the defaults: the page's 256 tokens (under the server's 512-token limit), the box's temperature 0.8
    # over the server's limit: its 512; a fraction of a token: the whole tokens below it
    assert settings == [[1, 2], [1, 0], [256, 0.8], [7, 2], [512, 0.75]], settings
    # the boxes show what was sent, as typed where it is that number (0.75, 2.0)
    assert boxes == [["1", "2"], ["1", "0"], ["256", "0.8"], ["7", "2.0"], ["512", "0.75"]], boxes
    assert requests[1] == ["user:second"], requests  # nothing of the cleared exchange
    assert requests[2] == ["user:second", "assistant:aaa", "user:third"], requests
    # the too-long message (one try, then its retries without each exchange) left the conversation as it was
    assert requests[-1] == ["user:second", "assistant:aaa", "user:third", "assistant:aaa", "user:fourth"], requests
    assert "msg system" not in shown, shown  # no "stopped" bubble for the reply the clear dropped
