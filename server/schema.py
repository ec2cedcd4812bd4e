"""The requests the server accepts, checked field by field, and its errors in OpenAI's shape.

Every fault is an `ApiError`: a 4xx status and `{"error": {"message", "type", "param", "code"}}`, the
body OpenAI's API sends, so that its clients raise their usual exceptions (openai.BadRequestError, ...).
Checked by hand rather than by a pydantic model: each fault gets its own one-line message naming the
field and the fix, and no validation library's wording or traceback reaches the client.

What is accepted, where OpenAI's API has more:
- n: 1 only (a request for several choices is refused: send that many requests; they batch together);
- stop: a string or up to 4 strings (the reply is cut before the first one);
- logprobs, tools, non-zero frequency/presence penalties, and a response_format, tool_choice, modalities or
  audio that asks for another kind of reply than text: refused by name;
- top_k, min_p and repetition_penalty, which OpenAI's API lacks, as vLLM's server takes them (top_k -1 or 0,
  min_p 0 and repetition_penalty 1 turn each off): the same filters as sample.py's;
- other fields (user, metadata, ...) are ignored, as OpenAI-compatible servers commonly do;
- model: optional; when given it must be the served model's id (404 model_not_found otherwise);
- message content: a string, or a list of {"type": "text", "text": ...} parts (joined);
- roles: system (or "developer", OpenAI's new name for it) first, then user and assistant alternating,
  ending with user.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from data.messages import lone_surrogate
from runtime.sampling import MIN_SCALE

ROLES = ("system", "user", "assistant")
MAX_STOP = 4
# As sample.py's bounds: the logits (fp32) are divided by the temperature, and below 1e-4 a large logit
# overflows to inf (nan probabilities: a failed step for every row of the batch), while such a temperature
# is greedy already; a top_p under 1e-6 keeps the top token only, as 1e-6 does (under 1.2e-38 it would keep
# nothing). So both are moved to the value that gives the same tokens.
MIN_TEMPERATURE, MIN_TOP_P = 1e-4, 1e-6
# fields this server does not implement, and the values that ask for nothing (accepted). A field that asks
# for another kind of reply (JSON mode, a tool call, audio) is refused too: ignored, it was a 200 with free text
UNSUPPORTED = {"logprobs": (None, False), "top_logprobs": (None,), "tools": (None, []), "functions": (None, []),
               "echo": (None, False), "suffix": (None, ""), "best_of": (None, 1), "logit_bias": (None, {}),
               "response_format": (None, {"type": "text"}), "tool_choice": (None, "none", "auto"),
               "function_call": (None, "none", "auto"), "modalities": (None, ["text"]), "audio": (None,)}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20
    max_messages: int = 256
    max_tokens: int = 1024  # the most new tokens one request may ask for (the context bounds it too)
    request_timeout_s: float = 300.0  # from arrival to the last token, queue included
    read_timeout_s: float = 10.0  # to receive a request's whole body


@dataclass(frozen=True)
class Params:
    """The fields both endpoints share, checked."""
    temperature: float
    top_p: float | None
    max_tokens: int | None  # None: the rest of the context (chat), or 16, OpenAI's default (completions)
    stream: bool
    include_usage: bool
    seed: int | None
    stop: tuple[str, ...]
    top_k: int | None = None  # None: off (each of these three)
    min_p: float | None = None
    repetition_penalty: float | None = None


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code=code)


def _number(body: dict, name: str, default, low: float, high: float, *, low_open: bool = False):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(name, f"must be a number, got {type(value).__name__}", "invalid_type")
    # NaN and inf are floats; an int is compared exactly (math.isfinite(10**400) would raise OverflowError)
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(name, f"must be a finite number, got {value}")
    if value < low or value > high or (low_open and value == low):
        raise _bad(name, f"must be {'>' if low_open else '>='} {low} and <= {high}, got {_shown(value)}")
    return float(value)


def _shown(value) -> str:
    """A number as the error shows it: an integer of 4000 digits is cut, not echoed whole."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"


def _integer(body: dict, name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"must be an integer, got {type(value).__name__}", "invalid_type")
    if not low <= value <= high:
        raise _bad(name, f"must be between {low} and {high}, got {_shown(value)}")
    return value


def _flag(body: dict, name: str, where: str | None = None) -> bool:
    """body[name] as a bool; `where` is the field's full name in the request (stream_options.include_usage)."""
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(where or name, f"must be true or false, got {type(value).__name__}", "invalid_type")
    return value


def check_model(body: dict, served: str) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise _bad("model", f"must be a string, got {type(model).__name__}", "invalid_type")
    if model != served:
        raise ApiError(404, f"The model {model[:100]!r} does not exist; this server serves {served!r} "
                       "(GET /v1/models)", param="model", code="model_not_found")


def check_params(body: dict, limits: Limits) -> Params:
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
        raise _bad("n", f"must be an integer, got {type(n).__name__}", "invalid_type")
    if n is not None and n < 1:
        raise _bad("n", f"must be 1 (one reply per request), got {_shown(n)}; leave it out")
    if n not in (None, 1):  # quoted cut, and once: n of 4000 digits was echoed twice, as the number of requests to send
        raise _bad("n", f"only n=1 is supported, got {_shown(n)}; send one request per reply instead (they decode "
                   "together)", "unsupported_value")
    for name in ("frequency_penalty", "presence_penalty"):
        if _number(body, name, 0.0, -2.0, 2.0) != 0.0:
            raise _bad(name, "is not supported; leave it out or 0", "unsupported_parameter")
    for name, harmless in UNSUPPORTED.items():  # by type too: 0 == False, but logprobs 0 asks for the sampled ones
        value = body.get(name)
        if not any(type(value) is type(h) and value == h for h in harmless):
            raise _bad(name, "is not supported by this server; leave it out", "unsupported_parameter")
    # both are checked (a bad max_tokens beside a good max_completion_tokens is still refused); the newer
    # name wins where both are given, as in OpenAI's API
    completion = _integer(body, "max_completion_tokens", 1, limits.max_tokens)
    legacy = _integer(body, "max_tokens", 1, limits.max_tokens)
    max_tokens = completion if completion is not None else legacy
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options", f"must be an object, got {type(options).__name__}", "invalid_type")
    return Params(
        temperature=_greedy_below(_number(body, "temperature", 1.0, 0.0, 2.0)),
        top_p=max(_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True), MIN_TOP_P),
        max_tokens=max_tokens,
        stream=_flag(body, "stream"),
        include_usage=_flag(options or {}, "include_usage", "stream_options.include_usage"),
        seed=_integer(body, "seed", -(2**63), 2**63 - 1),
        stop=_stops(body.get("stop")),
        top_k=_off_below_1(_integer(body, "top_k", -1, 2**31 - 1)),  # larger than the vocabulary keeps every token
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0) or None,
        repetition_penalty=_unless_1(_number(body, "repetition_penalty", 1.0, MIN_SCALE, 1 / MIN_SCALE)),
    )


def _off_below_1(top_k: int | None) -> int | None:
    return top_k if top_k is not None and top_k >= 1 else None  # vLLM's -1 (and 0): every token


def _unless_1(penalty: float) -> float | None:
    return None if penalty == 1.0 else penalty


def _greedy_below(temperature: float) -> float:
    return 0.0 if temperature < MIN_TEMPERATURE else temperature


def _stops(value) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop", "must be a string or a list of strings", "invalid_type")
    for s in stops:
        _text(s, "stop")
    if len(stops) > MAX_STOP or any(not s or len(s) > 256 for s in stops):
        raise _bad("stop", f"at most {MAX_STOP} non-empty strings of at most 256 characters")
    return tuple(stops)


def _text(value: str, where: str) -> str:
    """`value`, or 400 where it holds a lone UTF-16 surrogate (data.messages.lone_surrogate)."""
    at = lone_surrogate(value)
    if at:
        raise _bad(where, f"holds a lone surrogate ({at}), which is not text; send valid Unicode (a surrogate pair, "
                   "or the character itself)")
    return value


def _content(value, where: str) -> str:
    if isinstance(value, str):
        return _text(value, where)
    if isinstance(value, list):  # content parts: only text ones
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(where, "content parts must be {\"type\": \"text\", \"text\": \"...\"}; this model "
                           "reads text only", "invalid_type")
            texts.append(_text(part["text"], where))
        return "".join(texts)
    raise _bad(where, f"content must be a string, got {type(value).__name__}", "invalid_type")


def check_messages(body: dict, limits: Limits) -> list[dict]:
    """The conversation as [{"role", "content"}], in the order the chat template lays out."""
    messages = body.get("messages")
    if messages is None:
        raise _bad("messages", "is required: a list of {\"role\", \"content\"} objects", "missing_required_parameter")
    if not isinstance(messages, list):
        raise _bad("messages", f"must be a list, got {type(messages).__name__}", "invalid_type")
    if not 1 <= len(messages) <= limits.max_messages:
        raise _bad("messages", f"must hold 1 to {limits.max_messages} messages, got {len(messages)}")
    out, sent = [], []  # sent: each role as the client wrote it ("developer"), which errors quote
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, f"must be an object, got {type(m).__name__}", "invalid_type")
        role = m.get("role")
        if role not in ROLES and role != "developer":
            raise _bad(f"{where}.role", f"must be one of {', '.join(ROLES)} (or developer), got {str(role)[:40]!r}")
        content = _content(m.get("content"), f"{where}.content")
        # the chat template has no empty turns: refused here, where the message's index and field are known
        if not content.strip():
            raise _bad(f"{where}.content", f"the {role} message is {'blank' if content else 'empty'}; give it "
                       "some text, or leave the message out")
        sent.append(role)
        out.append({"role": "system" if role == "developer" else role, "content": content})
    first = 1 if out[0]["role"] == "system" else 0
    for i in range(first, len(out)):
        expected = "user" if (i - first) % 2 == 0 else "assistant"
        if out[i]["role"] != expected:
            why = {"developer": " (read as system, which may only come first)",
                   "system": " (a system message may only come first)"}.get(sent[i], "")
            raise _bad(f"messages[{i}].role", f"expected {expected!r} here (an optional system message first, then "
                       f"user and assistant alternating), got {sent[i]!r}{why}")
    if first == len(out) or out[-1]["role"] != "user":
        raise _bad(f"messages[{len(out) - 1}].role", f"the last message must be the user's (the reply is the "
                   f"assistant's next turn), got {sent[-1]!r}; end with a user message")
    return out


def check_prompt(body: dict, vocab: int) -> str | list[int]:
    """/v1/completions' prompt: a string, a list of token ids, or a list holding one of those."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _text(prompt, "prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(0 <= t < vocab for t in prompt):
            raise _bad("prompt", f"token ids must be in [0, {vocab})")
        return prompt
    if prompt is None:
        raise _bad("prompt", "is required: a string or a list of token ids", "missing_required_parameter")
    if isinstance(prompt, list) and len(prompt) > 1:
        raise _bad("prompt", "one prompt per request; send one request per prompt (they decode together)",
                   "unsupported_value")
    raise _bad("prompt", "must be a string or a non-empty list of token ids", "invalid_type")
