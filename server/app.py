"""The HTTP side: OpenAI's API over the engine, the chat page, and errors in OpenAI's shape only.

    POST /v1/chat/completions   a chat model's reply, whole or streamed as server-sent events
    POST /v1/completions        a plain continuation of a prompt (any checkpoint, chat or not)
    GET  /v1/models, /v1/models/{id}, /health, /   (the page)

Nothing a client sends reaches a traceback: a bad request is an ApiError (4xx), a route that fails
anyway is a 500 in the same shape and one line in the log (`Guard`), and a client that goes away ends its
request in the engine at the next step.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request as HttpRequest
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from errors import UserError, short_error, to_stderr
from fileio import json_loads

from .engine import Engine, QueueFull, Request, Sampling
from .hosts import refusal, url_of
from .schema import ApiError, Limits, Params, check_messages, check_model, check_params, check_prompt, error_body
from .text import StopText

PAGE = Path(__file__).with_name("page.html")
GRACE_S = 5.0  # past a request's deadline the engine has ended it; waiting longer means a stuck step
COMPLETION_DEFAULT_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
# what a request answered before its body was read is read on for (Guard): a few MiB in flight, not 2**40 bytes
LINGER_S, LINGER_BYTES = 1.0, 64 * 2**20


@dataclass
class Served:
    engine: Engine
    tokenizer: Any  # data.tokenizer.Tokenizer
    template: Any  # data.chat_template.ChatTemplate, or None for a model that was not taught to chat
    model_id: str
    limits: Limits
    created: int


def create_app(served: Served, hosts: frozenset[str] | None = None) -> FastAPI:
    """`hosts`: the names a request's Host and Origin may give (server/hosts.py's allowed_hosts); None: any."""
    # redirect_slashes off: Starlette's 307 for "/health/" built its Location from the client's Host header
    # (an open redirect); a trailing slash is a 404 naming the route without it instead
    app = FastAPI(title="smallgpt", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
    page = PAGE.read_text(encoding="utf-8")

    GET = ["GET", "HEAD"]  # what answers a GET answers a HEAD (RFC 9110: its headers, no body): health checkers send it

    @app.exception_handler(ApiError)
    async def api_error(_, e: ApiError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)  # unknown routes (404), wrong methods (405)
    async def http_error(request: HttpRequest, e: HTTPException):
        path = request.url.path
        route = path.rstrip("/")
        if route != path and any(r.matches({"type": "http", "path": route, "method": request.method})[0].value
                                 for r in app.router.routes):
            missing = f"no route {path[:100]}; the route is {route[:100]} (without the trailing slash)"
        else:
            missing = f"no route {path[:100]}; see GET /v1/models, POST /v1/chat/completions"
        text = {404: missing, 405: f"{request.method} is not allowed on {path[:100]}"}.get(e.status_code, str(e.detail))
        return JSONResponse(error_body(text, code=str(e.status_code)), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def failed(_, e: Exception):
        # Starlette's ServerErrorMiddleware answers a failed route before Guard sees it: without this handler
        # that answer is its plain-text 500, not OpenAI's shape (Guard still writes the log line)
        return JSONResponse(internal_error(e), status_code=500)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(_, e: ClientDisconnect):
        # a client that left during its upload: nobody reads this answer (uvicorn drops it), and it is not a
        # failure of the server, so no error line and no 500
        return Response(status_code=400)

    @app.api_route("/", response_class=HTMLResponse, methods=GET)
    async def index():
        return HTMLResponse(page)

    @app.api_route("/health", methods=GET)
    async def health():
        # max_tokens (the most a request may ask for) and context (block_size): the page's bounds come from here
        return {"status": "ok", "model": served.model_id, "chat": served.template is not None,
                "max_tokens": served.limits.max_tokens, "context": served.engine.block_size, **served.engine.load()}

    @app.api_route("/v1/models", methods=GET)
    async def models():
        return {"object": "list", "data": [_model_card(served)]}

    @app.api_route("/v1/models/{model_id:path}", methods=GET)
    async def model(model_id: str):
        if not model_id or model_id.endswith("/"):  # "/v1/models/", "/v1/models/ID/": a trailing slash, as any other
            raise HTTPException(404)
        check_model({"model": model_id}, served.model_id)
        return _model_card(served)

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest):
        body = await read_json(request, served.limits)
        check_model(body, served.model_id)
        params = check_params(body, served.limits)
        messages = check_messages(body, served.limits)
        t = served.template
        if t is None:
            raise ApiError(400, f"{served.model_id} was not fine-tuned to chat (its checkpoint has no chat template); "
                           "use POST /v1/completions, or serve a checkpoint trained with sft.yaml",
                           param="model", code="model_not_chat")
        prompt = _encode_chat(t, served.tokenizer, messages)
        stop_ids = t.stop_ids(served.tokenizer)
        decode = lambda ids: t.decode(served.tokenizer, ids)  # noqa: E731
        return await respond(request, served, prompt, params, stop_ids, t.vocab_size, decode, chat=True)

    @app.post("/v1/completions")
    async def completions(request: HttpRequest):
        body = await read_json(request, served.limits)
        check_model(body, served.model_id)
        params = check_params(body, served.limits)
        tok = served.tokenizer
        prompt = check_prompt(body, tok.vocab_size)
        if isinstance(prompt, str):
            text = prompt
            # an empty prompt starts from end-of-text: generation needs a token to condition on
            prompt = _encode(lambda: tok.encode(text), "prompt") or [tok.eot]
        if params.max_tokens is None:  # OpenAI's default, within this server's limit (--max-tokens)
            params = _with_tokens(params, min(COMPLETION_DEFAULT_TOKENS, served.limits.max_tokens))
        return await respond(request, served, prompt, params, frozenset({tok.eot}), tok.vocab_size, tok.decode,
                             chat=False)

    return Guard(app, hosts)


def _model_card(served: Served) -> dict:
    return {"id": served.model_id, "object": "model", "created": served.created, "owned_by": "smallgpt"}


def _with_tokens(params: Params, n: int) -> Params:
    return replace(params, max_tokens=n)


def _encode(fn, param: str) -> list[int]:
    try:
        return list(fn())
    except UserError as e:  # e.g. a character the char vocabulary lacks
        raise ApiError(400, f"{param}: {e}", param=param, code="invalid_value") from None


def _encode_chat(template, tok, messages: list[dict]) -> list[int]:
    try:
        return list(template.encode_prompt(tok, messages, add_generation_prompt=True))
    except UserError as e:  # a character the char vocabulary lacks: the template counts messages from 1
        for i, m in enumerate(messages):  # so the message at fault is found here, named as the schema names it
            _encode(lambda text=m["content"]: tok.encode(text), f"messages[{i}].content")
        raise ApiError(400, f"messages: {e}", param="messages", code="invalid_value") from None


async def read_json(request: HttpRequest, limits: Limits) -> dict:
    """The body as a JSON object: at most max_body_bytes, received within read_timeout_s."""
    declared = request.headers.get("content-length")
    too_big = ApiError(413, f"the request body is over {limits.max_body_bytes} bytes", code="request_too_large")
    if declared is not None and (not declared.isdigit() or int(declared) > limits.max_body_bytes):
        raise too_big

    async def receive() -> bytes:
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limits.max_body_bytes:
                raise too_big
        return bytes(data)

    try:
        raw = await asyncio.wait_for(receive(), limits.read_timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {limits.read_timeout_s:g} s",
                       code="request_timeout") from None
    try:
        body = json_loads(raw)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise ApiError(400, f"the body is not valid JSON ({short_error(e, 100)})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    return body


async def respond(request: HttpRequest, served: Served, prompt: list[int], params: Params, stop_ids: frozenset,
                  vocab_limit: int, decode, *, chat: bool):
    block = served.engine.block_size
    param = "messages" if chat else "prompt"
    if len(prompt) >= block:
        raise ApiError(400, f"the prompt is {len(prompt)} tokens, and this model's context is {block}: it leaves no "
                       "room for a reply; shorten it", param=param, code="context_length_exceeded")
    max_tokens = params.max_tokens or min(block - len(prompt) + 1, served.limits.max_tokens)
    loop = asyncio.get_running_loop()
    sampling = Sampling(params.temperature, params.top_p, max_tokens, stop_ids, vocab_limit, params.seed, params.top_k,
                        params.min_p, params.repetition_penalty)
    req = Request(prompt, sampling, loop, deadline=time.monotonic() + served.limits.request_timeout_s)
    try:
        served.engine.submit(req)
    except QueueFull:
        raise ApiError(429, "the server is busy: every slot is decoding and the queue is full; retry shortly",
                       type="rate_limit_error", code="rate_limit_exceeded") from None
    text = StopText(decode, params.stop)
    reply = Reply(chat, served.model_id, len(prompt))
    if params.stream:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(_sse(req, text, reply, params.include_usage), media_type="text/event-stream",
                                 headers=headers)
    watcher = asyncio.create_task(_watch_disconnect(request, req))
    try:
        parts, reason = [], "stop"
        async for piece, finish in _pieces(req, text):
            parts.append(piece)
            reason = finish or reason
    finally:
        watcher.cancel()
    reply.tokens = text.tokens
    return JSONResponse(reply.whole("".join(parts), reason))


async def _watch_disconnect(request: HttpRequest, req: Request) -> None:
    """For a whole (unstreamed) reply: a client gone before the reply is done frees its row."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            req.cancel()
            req.queue.put_nowait(("gone", None))
            return


async def _pieces(req: Request, text: StopText) -> AsyncIterator[tuple[str, str | None]]:
    """(text, None) as tokens arrive, then (the rest, finish_reason) once. Ends the request however it ends."""
    try:
        while True:
            wait = req.deadline - time.monotonic() + GRACE_S
            try:
                kind, value = await asyncio.wait_for(req.queue.get(), max(wait, 0.1))
            except asyncio.TimeoutError:
                raise ApiError(503, "the reply did not finish in time; retry later", type="server_error",
                               code="timeout") from None
            if kind == "token":
                piece = text.push(value)
                if text.stopped:  # a stop string: the engine stops generating at its next step
                    yield piece, "stop"
                    return
                if piece:
                    yield piece, None
            elif kind == "done":
                yield text.flush(), value
                return
            elif kind == "gone":
                return
            elif kind == "timeout":  # nothing failed: the queue was long (the same code as the wait above)
                raise ApiError(503, value, type="server_error", code="timeout")
            else:
                raise ApiError(503, value, type="server_error", code="generation_failed")
    finally:
        req.cancel()


class Reply:
    """The JSON of a reply, in OpenAI's shapes for both endpoints, whole and as stream chunks."""

    def __init__(self, chat: bool, model: str, prompt_tokens: int):
        self.chat, self.model, self.prompt_tokens, self.tokens = chat, model, prompt_tokens, 0
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _base(self, stream: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if stream and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.tokens,
                "total_tokens": self.prompt_tokens + self.tokens}

    def whole(self, text: str, reason: str) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return {**self._base(False), "choices": [choice], "usage": self.usage()}

    def chunk(self, text: str | None, reason: str | None = None, *, first: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        return {**self._base(True), "choices": [choice]}


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _sse(req: Request, text: StopText, reply: Reply, include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events: a first chunk (the role), one per piece of text, the finish, [DONE]. A client
    that disconnects cancels this generator (Starlette), and _pieces' finally frees the row."""
    try:
        if reply.chat:
            yield _event(reply.chunk(None, first=True))
        async for piece, finish in _pieces(req, text):
            if piece:
                yield _event(reply.chunk(piece))
            if finish:
                reply.tokens = text.tokens
                yield _event(reply.chunk(None, finish))
        if include_usage:
            yield _event({**reply._base(True), "choices": [], "usage": reply.usage()})
    except ApiError as e:  # the status line is sent already: the error goes in the stream, as OpenAI's does
        yield _event(e.body())
    yield "data: [DONE]\n\n"


class Guard:
    """The outermost ASGI layer: an exception that escapes a route becomes one line on stderr, never a
    traceback in the log or in the reply. The 500 itself is create_app's Exception handler's (Starlette sends
    it before the exception gets here); Guard sends one only where nothing was sent (a failing middleware).

    A response started before its request's body was read whole (a 413, a 408, a 404 of a POST) first reads
    on, for at most LINGER_S and LINGER_BYTES: a client still sending finds its bytes read, and the answer it
    then reads is not lost to the reset that closing on unread bytes sends. What is left unread then, the
    response says `Connection: close`, so uvicorn ends the connection after it: else, to read the next
    request, h11 drained the whole declared body (found from outside: after a 413 for Content-Length 2**40
    the server read on ~100 GiB in 25 s, and never closed the connection).

    With `hosts` (a loopback server), a request that is not for this server (server/hosts.py: its Host another
    name, its Origin another site) is answered 403 before the app sees it."""

    def __init__(self, app: FastAPI, hosts: frozenset[str] | None = None):
        self.app, self.hosts = app, hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, asked = False, False
        read = not _declares_body(scope)  # the whole body is in (a request with none: from the start)
        # a client that waits for "100 Continue" sends its body only after it: uvicorn says it at the first receive,
        # so a refusal before any (a 413 by Content-Length) closes at once, and the client uploads nothing
        waits = (b"expect", b"100-continue") in [(k, v.strip().lower()) for k, v in scope.get("headers", [])]

        async def reading():
            nonlocal read, asked
            asked = True
            message = await receive()
            read = read or message["type"] == "http.disconnect" or not message.get("more_body", False)
            return message

        async def tracked(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if not read and (asked or not waits):
                    await _linger(reading)
                if not read:
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            refused = refusal(scope.get("headers", []), self.hosts)  # not for this loopback server (DNS rebinding)
            if refused:
                await self._refuse(*refused, scope, tracked)
            else:
                await self.app(scope, reading, tracked)
        except Exception as e:  # noqa: BLE001 - the last line of defence; the server stays up
            to_stderr(f"error: {scope.get('method')} {scope.get('path', '')[:100]} failed ({short_error(e)})")
            if not started:
                body = json.dumps(internal_error(e)).encode()
                await tracked({"type": "http.response.start", "status": 500,
                               "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})

    async def _refuse(self, code: str, why: str, scope, send):
        url = url_of(*(scope.get("server") or ("127.0.0.1", "")))
        body = json.dumps(error_body(
            f"{why}: it listens on loopback only, as {url}; for a reverse proxy on this machine that passes its own "
            "name, start serve.py with --allow-host NAME", code=code)).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def internal_error(e: Exception) -> dict:
    """The 500's body, in OpenAI's shape: the route's handler's (create_app) and Guard's alike."""
    return error_body(f"internal error ({type(e).__name__}); the server is still up", "server_error", None,
                      "internal_error")


async def _linger(receive) -> None:
    """Read on (and drop) a request's body until it ends, or for LINGER_S, or LINGER_BYTES."""
    loop = asyncio.get_running_loop()
    deadline, seen = loop.time() + LINGER_S, 0
    while seen <= LINGER_BYTES and (left := deadline - loop.time()) > 0:
        try:
            message = await asyncio.wait_for(receive(), left)
        except asyncio.TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        seen += len(message.get("body", b""))


def _declares_body(scope) -> bool:
    """Whether the request says a body follows: a Content-Length other than 0, or a Transfer-Encoding."""
    for name, value in scope.get("headers", []):
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False
