"""The server's engine in-process: continuous batching gives every request what it gets alone (references:
model.generate.generate on each prompt by itself), per-request settings, rows leaving and joining, the
bounded queue; the stop strings of the text layer; the app in-process (429 when the queue is full, a model
that was not taught to chat); serve.py's bad options."""
from __future__ import annotations

import asyncio
import math
import json
import socket
import time

import httpx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from data import get_tokenizer
from data.chat_template import template_for
from model import GPT, GPTConfig
from errors import run_cli
from model.generate import generate
from server import cli
from server.app import Served, create_app
from server.engine import Engine, QueueFull, Request, Sampling
from server.schema import UNSUPPORTED, ApiError, Limits, check_params
from server.text import StopText
from serving import make_chat_checkpoint

VOCAB = 40


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=2, n_embd=32)).eval()
    with torch.no_grad():  # peaky logits: greedy choices are far from float ties
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.4)
    return m


def run_all(engine: Engine, jobs: list[tuple[list[int], Sampling]], *, stagger_s: float = 0.0):
    """Submit every job (prompt, sampling) to a running engine; each one's tokens and finish reason."""
    async def one(prompt, sampling, delay):
        await asyncio.sleep(delay)
        req = Request(prompt, sampling, asyncio.get_running_loop(), deadline=time.monotonic() + 60)
        engine.submit(req)
        out = []
        while True:
            kind, value = await asyncio.wait_for(req.queue.get(), 30)
            if kind == "token":
                out.append(value)
            else:
                return out, value

    async def main():
        return await asyncio.gather(*(one(p, s, i * stagger_s) for i, (p, s) in enumerate(jobs)))

    return asyncio.run(main())


def alone(model, prompt, n, stop=None):
    """The reference: the project's generation path on the prompt by itself (greedy)."""
    out = generate(model, [prompt], n, temperature=0, eot=stop)[0]
    return out


@pytest.fixture
def engine(model):
    e = Engine(model, slots=3, queue_size=8)
    e.start()
    yield e
    e.stop()


def test_concurrent_greedy_requests_each_get_their_text_alone(model, engine):
    # more jobs than slots (some wait), different lengths and budgets (rows leave at different steps, so the
    # last row moves into the holes), joining while others decode
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(VOCAB, (n,), generator=g).tolist() for n in (1, 5, 9, 3, 12, 2)]
    budgets = [20, 4, 15, 9, 18, 7]
    jobs = [(p, Sampling(temperature=0.0, max_tokens=b)) for p, b in zip(prompts, budgets)]
    results = run_all(engine, jobs, stagger_s=0.002)
    for (p, b), (tokens, reason) in zip(zip(prompts, budgets), results):
        want = alone(model, p, min(b, 32 - len(p) + 1))
        assert tokens == want
        assert reason == "length"
    assert engine.max_batch >= 2  # they really decoded together


def test_stop_token_ends_a_row_and_is_not_emitted(model, engine):
    prompt = [1, 2, 3]
    free = alone(model, prompt, 10)
    stop = free[4]
    (tokens, reason), = run_all(engine, [(prompt, Sampling(temperature=0.0, max_tokens=10, stop_ids=frozenset({stop})))])
    assert tokens == free[: free.index(stop)] and reason == "stop"


def test_a_full_context_ends_the_reply_with_length(model, engine):
    prompt = list(range(30))  # block_size 32: prefill gives one token, two more slots give two more
    (tokens, reason), = run_all(engine, [(prompt, Sampling(temperature=0.0, max_tokens=100))])
    assert tokens == alone(model, prompt, 3) and reason == "length"


def test_each_request_samples_with_its_own_settings_and_a_seed_is_its_own(model, engine):
    prompt = [5, 6, 7]
    seeded = Sampling(temperature=1.0, top_p=0.9, max_tokens=12, seed=1234)
    (solo, _), = run_all(engine, [(prompt, seeded)])
    crowd = [(prompt, Sampling(temperature=1.5, max_tokens=12)), (prompt, seeded), (prompt, Sampling(temperature=0.0, max_tokens=12))]
    results = run_all(engine, crowd)
    assert results[1][0] == solo  # the seed decides the text, not who else is served
    assert results[2][0] == alone(model, prompt, 12)  # a greedy row among sampled ones stays greedy
    assert len(results[0][0]) == 12


def test_vocab_limit_keeps_sampling_below_it(model, engine):
    (tokens, _), = run_all(engine, [([1], Sampling(temperature=2.0, max_tokens=30, vocab_limit=5))])
    assert tokens and all(t < 5 for t in tokens)


def test_a_cancelled_request_leaves_and_the_others_go_on(model, engine):
    async def main():
        loop = asyncio.get_running_loop()
        gone = Request([1, 2], Sampling(temperature=0.0, max_tokens=1000), loop, deadline=time.monotonic() + 60)
        engine.submit(gone)
        await gone.queue.get()
        gone.cancel()
        stay = Request([3, 4], Sampling(temperature=0.0, max_tokens=6), loop, deadline=time.monotonic() + 60)
        engine.submit(stay)
        out = []
        while (ev := await asyncio.wait_for(stay.queue.get(), 30))[0] == "token":
            out.append(ev[1])
        return out

    assert asyncio.run(main()) == alone(model, [3, 4], 6)
    deadline = time.monotonic() + 5
    while engine.load()["active"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.load()["active"] == 0


def test_the_queue_is_bounded(model):
    e = Engine(model, slots=2, queue_size=3)  # not started: nothing leaves the queue
    loop = asyncio.new_event_loop()
    try:
        for _ in range(2 + 3):
            e.submit(Request([1], Sampling(), loop, deadline=0))
        with pytest.raises(QueueFull):
            e.submit(Request([1], Sampling(), loop, deadline=0))
    finally:
        loop.close()


def test_a_full_queue_is_429_in_openais_shape(model):
    tok = get_tokenizer("char", " abc")
    e = Engine(model, slots=1, queue_size=1)  # not started
    app = create_app(Served(e, tok, template_for(tok), "m", Limits(), 0))
    loop = asyncio.new_event_loop()
    for _ in range(2):
        e.submit(Request([1], Sampling(), loop, deadline=0))
    loop.close()

    async def post():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.post("/v1/completions", json={"prompt": "ab"})

    r = asyncio.run(post())
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "rate_limit_exceeded" and set(r.json()["error"]) == {"message", "type", "param", "code"}


def texts(tokens: list[str], stops=()) -> tuple[list[str], str]:
    """StopText over a toy tokenizer whose token i is the string tokens[i]."""
    s = StopText(lambda ids: "".join(tokens[i] for i in ids), stops)
    pieces = [s.push(i) for i in range(len(tokens))]
    return pieces, "".join(pieces) + s.flush()


def test_stop_strings_cut_the_text_before_them_even_across_tokens():
    assert texts(["he", "llo", " wo", "rld"], ["o w"])[1] == "hell"
    assert texts(["ab", "cd"], ["zz"])[1] == "abcd"
    pieces, whole = texts(["a", "b", "X", "Y", "c"], ["XY"])
    assert whole == "ab" and "X" not in "".join(pieces)  # no part of the stop string was ever sent
    assert texts(["XY", "z"], ["XY"])[1] == ""


def test_text_waits_for_whole_characters():
    raw = "é!".encode()
    s = StopText(lambda ids: bytes(raw[i] for i in ids).decode("utf-8", errors="replace"))
    assert [s.push(i) for i in range(len(raw))] == ["", "é", "!"]


def test_a_model_without_a_chat_template_completes_text_and_refuses_chat(model):
    tok = get_tokenizer("char", " abc")
    e = Engine(model, slots=2)
    e.start()
    app = create_app(Served(e, tok, None, "m", Limits(), 0))

    async def talk():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            chat = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "ab"}]})
            done = await client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 6, "temperature": 0})
            return chat, done

    try:
        chat, done = asyncio.run(talk())
    finally:
        e.stop()
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "model_not_chat"
    want = generate(model, [tok.encode("ab")], 6, temperature=0, eot=tok.eot, vocab_size=tok.vocab_size)[0]
    assert done.status_code == 200 and done.json()["choices"][0]["text"] == tok.decode(want)


def test_a_completion_without_max_tokens_gets_the_default_within_the_servers_limit(model):
    """OpenAI's default of 16 new tokens for /v1/completions was applied past `serve.py --max-tokens 5` (an
    explicit 16 was refused): the default is at most the server's limit, as the chat route's is."""
    tok = get_tokenizer("char", " abc")
    e = Engine(model, slots=2)
    e.start()
    app = create_app(Served(e, tok, None, "m", Limits(max_tokens=5), 0))

    async def talk():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.post("/v1/completions", json={"prompt": "ab", "temperature": 0})

    try:
        done = asyncio.run(talk())
    finally:
        e.stop()
    want = generate(model, [tok.encode("ab")], 16, temperature=0, eot=tok.eot, vocab_size=tok.vocab_size)[0]
    assert len(want) > 5  # the default would give more than the limit
    assert done.status_code == 200 and done.json()["choices"][0]["text"] == tok.decode(want[:5])
    assert done.json()["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("argv, words", [
    (["--port", "70000"], "--port"), (["--slots", "0"], "--slots"), (["--queue", "-1"], "--queue"),
    (["--request-timeout", "nan"], "--request-timeout"), (["--threads", "0"], "--threads"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout"), (["--shutdown-timeout", "inf"], "--shutdown-timeout"),
    (["--max-tokens", "0"], "--max-tokens"), (["--bogus"], "unrecognized"),
    (["--checkpoint", "/nonexistent/ckpt.pt"], "does not exist"),
])
def test_bad_options_are_one_error_line(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        run_cli(lambda: cli.main(argv))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and words in err, err


def test_a_taken_port_is_one_error_line(tmp_path, capsys):
    make_chat_checkpoint(tmp_path / "ckpt.pt")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exc:
            run_cli(lambda: cli.main(["--checkpoint", str(tmp_path / "ckpt.pt"), "--port", str(port), "--dtype", "float32"]))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err, err


def test_a_failing_prefill_or_step_ends_its_requests_and_the_engine_goes_on(model, engine, capsys):
    real = engine.model
    calls = {"steps": 0}

    def flaky(idx, **kw):
        if idx.size(1) > 1 and int(idx[0, 0]) == 39:  # this prompt's prefill fails
            raise RuntimeError("boom in prefill")
        if idx.size(1) == 1:
            calls["steps"] += 1
            if calls["steps"] == 3:  # and one decoding step
                raise RuntimeError("boom in a step")
        return real(idx, **kw)

    engine.model = flaky
    try:
        results = run_all(engine, [([39, 1], Sampling(temperature=0.0, max_tokens=5)),
                                   ([1, 2], Sampling(temperature=0.0, max_tokens=5))])
    finally:
        engine.model = real
    assert results[0] == ([], "generation failed (RuntimeError: boom in prefill)")
    assert results[1][1] == "generation failed (RuntimeError: boom in a step)"
    assert "boom" in capsys.readouterr().err
    (tokens, reason), = run_all(engine, [([1, 2], Sampling(temperature=0.0, max_tokens=5))])
    assert tokens == alone(model, [1, 2], 5) and reason == "length"


def test_extreme_sampling_values_give_tokens_not_a_failed_batch(model, engine):
    # temperature 1e-38 overflows the logits to inf (nan probabilities, a failed step for every row) unless
    # the schema moves it to greedy; a top_p of 1e-40 keeps the top token only
    params = check_params({"temperature": 1e-38, "top_p": 0.5}, Limits())
    extreme = Sampling(temperature=params.temperature, top_p=params.top_p, max_tokens=8)
    results = run_all(engine, [([1, 2], extreme), ([3, 4], Sampling(temperature=0.0, max_tokens=8))])
    assert results[0] == (alone(model, [1, 2], 8), "length")  # the same tokens as greedy
    assert results[1] == (alone(model, [3, 4], 8), "length")
    params = check_params({"temperature": 0.5, "top_p": 1e-40}, Limits())
    (tokens, _), = run_all(engine, [([1, 2], Sampling(temperature=0.5, top_p=params.top_p, max_tokens=8))])
    assert tokens == alone(model, [1, 2], 8)  # only the top token is ever kept


@given(seed=st.integers(-(2**31), 2**31 - 1), k=st.integers(-(2**31) + 1, 2**31 - 1).filter(bool))
def test_class_seeds_that_differ_only_above_32_bits_give_different_text(model, engine, seed, k):
    # torch's CPU generator keeps a seed's low 32 bits: seeds 5, 2**32 + 5 and 5 - 2**32 gave the same text
    other = seed + k * 2**32  # the same low 32 bits, anywhere in the accepted range (+-2**63)
    assert -(2**63) <= other < 2**63 and (other - seed) % 2**32 == 0
    prompt, hot = [5, 6, 7], dict(temperature=2.0, max_tokens=24)
    (a, _), = run_all(engine, [(prompt, Sampling(**hot, seed=seed))])
    crowd = run_all(engine, [(prompt, Sampling(**hot, seed=other)), (prompt, Sampling(**hot, seed=seed)),
                             (prompt, Sampling(temperature=0.0, max_tokens=24))])
    assert crowd[0][0] != a  # distinct seeds, distinct streams
    assert crowd[1][0] == a  # the same seed, the same text, alone or batched


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | st.text(max_size=3),
                           lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner, max_size=2),
                           max_leaves=4)


# equal to a value that asks for nothing, in another type (Python's 0 == False == 0.0, 1 == True == 1.0)
LOOK_ALIKES = st.sampled_from([0, 0.0, 1, 1.0, True, False, None, "", [], {}, -0.0, "0", [None], {"": None}])


@settings(max_examples=200)
@given(name=st.sampled_from(sorted(UNSUPPORTED)), value=LOOK_ALIKES | JSON_VALUES)
def test_class_an_unsupported_field_passes_only_with_a_value_that_asks_for_nothing(name, value):
    """"logprobs": 0 passed (0 == False) and was answered without logprobs, though on /v1/completions it asks for
    the sampled tokens' ones; likewise best_of true (== 1) or 1.0. The values that ask for nothing, as JSON
    writes them: null, false, 1, "", [], {} (each field its own)."""
    # what asks for nothing, as JSON writes it (the request's own text): 0 is not false, 1.0 not 1, true not 1
    nothing = {"logprobs": {"null", "false"}, "top_logprobs": {"null"}, "tools": {"null", "[]"},
               "functions": {"null", "[]"}, "echo": {"null", "false"}, "suffix": {"null", '""'},
               "best_of": {"null", "1"}, "logit_bias": {"null", "{}"}, "response_format": {"null", '{"type": "text"}'},
               "tool_choice": {"null", '"none"', '"auto"'}, "function_call": {"null", '"none"', '"auto"'},
               "modalities": {"null", '["text"]'}, "audio": {"null"}}[name]
    harmless = json.dumps(value) in nothing
    try:
        check_params({name: value}, Limits())
    except ApiError as e:
        assert not harmless and e.status == 400 and e.param == name, (value, e.message)
    else:
        assert harmless, value


@settings(max_examples=60)
@given(slots=st.integers(1, 3), queue=st.integers(1, 3),
       ops=st.lists(st.one_of(st.just(("submit", 0)), st.tuples(st.just("cancel"), st.integers(0, 9))), max_size=14))
def test_class_a_request_whose_client_left_while_queued_holds_no_place(model, slots, queue, ops):
    """Found from outside: clients that went away while queued (a timed-out client retrying left one per try)
    kept their places until a slot freed, and live clients got 429 from a queue of nobody; /health counted them.
    Any sequence of arrivals and departures (the engine not started: nothing leaves the queue by decoding): a
    request is refused exactly when the live ones fill the slots and the queue, and `waiting` counts the live."""
    e = Engine(model, slots=slots, queue_size=queue)
    loop = asyncio.new_event_loop()
    live = []
    try:
        for op, i in ops:
            if op == "cancel":
                if live:
                    live.pop(i % len(live)).cancel()
            else:
                req = Request([1], Sampling(), loop, deadline=0)
                if len(live) >= slots + queue:
                    with pytest.raises(QueueFull):
                        e.submit(req)
                else:
                    e.submit(req)
                    live.append(req)
            assert e.load()["waiting"] == len(live)
    finally:
        loop.close()


def test_a_request_whose_time_ran_out_in_the_queue_is_a_503_timeout_not_a_failure(model, monkeypatch):
    """Found from outside: a request that waited past --request-timeout in the queue was answered 503
    `generation_failed`, though nothing failed; it is `timeout`, whole and streamed (an error event)."""
    tok = get_tokenizer("char", " abc")
    e = Engine(model, slots=1, queue_size=4)
    real = e.model

    def slow(idx, **kw):  # each forward 20 ms: the first request holds the one slot for ~0.6 s
        time.sleep(0.02)
        return real(idx, **kw)

    e.model = slow
    e.start()
    app = create_app(Served(e, tok, None, "m", Limits(request_timeout_s=0.2), 0))

    async def talk():
        loop = asyncio.get_running_loop()
        holder = Request([1, 2], Sampling(temperature=0.0, max_tokens=30), loop, deadline=time.monotonic() + 60)
        e.submit(holder)
        await holder.queue.get()  # it decodes: the requests below wait in the queue
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await asyncio.gather(
                client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 4}),
                client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 4, "stream": True}))

    try:
        whole, streamed = asyncio.run(talk())
    finally:
        e.stop()
    assert whole.status_code == 503, whole.text
    err = whole.json()["error"]
    assert err["code"] == "timeout" and "waited past its time limit in the queue" in err["message"], err
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert streamed.status_code == 200 and events[-1]["error"]["code"] == "timeout", streamed.text
    assert streamed.text.rstrip().endswith("data: [DONE]")


@given(name=st.text(st.sampled_from("ab/ "), min_size=0, max_size=6))
def test_class_a_model_name_ending_in_a_slash_or_blank_is_one_line(name, capsys):
    """GET /v1/models/NAME/ is read as a trailing slash (a 404 naming the route without it), so a served id
    ending in '/' could never be shown; a blank one names nothing. Refused before anything is loaded."""
    refused = not name.strip("/ ") or name.endswith("/")
    args = cli.build_parser().parse_args(["--model-name", name])
    try:
        cli.check_args(args)
    except Exception as e:  # noqa: BLE001 - UserError expected
        assert refused and type(e).__name__ == "UserError" and "--model-name" in str(e), (name, e)
        assert "\n" not in str(e)
    else:
        assert not refused, name


def penalised_greedy(model, prompt: list[int], n: int, penalty: float) -> list[int]:
    """The hand-written reference of a greedy reply under CTRL's repetition penalty (HF's
    RepetitionPenaltyLogitsProcessor): the whole context through the model each step (no cache), every token
    of it seen so far divided by the penalty where its logit is positive, multiplied where negative, argmax."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids]))[0, -1].double()
            for t in set(ids):
                logits[t] = logits[t] / penalty if logits[t] > 0 else logits[t] * penalty
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


@settings(max_examples=12)
@given(penalty=st.sampled_from([0.5, 1.3, 2.0, 5.0]), prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8))
def test_class_a_repetition_penalty_gives_the_hand_computed_greedy_reply_among_other_rows(model, engine, penalty, prompt):
    """top_k, min_p and repetition_penalty (vLLM's fields, sample.py's filters) were ignored: a 200 with the
    unfiltered text. Each row keeps its own context's tokens for the penalty, batched with rows that have none."""
    jobs = [(prompt, Sampling(temperature=0.0, max_tokens=10, repetition_penalty=penalty)),
            ([3, 4], Sampling(temperature=0.0, max_tokens=10)),
            ([5], Sampling(temperature=0.0, max_tokens=10, repetition_penalty=penalty))]
    results = run_all(engine, jobs)
    n = min(10, 32 - len(prompt) + 1)
    assert results[0][0] == penalised_greedy(model, prompt, n, penalty)
    assert results[1][0] == alone(model, [3, 4], 10)
    assert results[2][0] == penalised_greedy(model, [5], 10, penalty)


def test_top_k_1_and_min_p_1_keep_only_the_top_token_whatever_the_temperature(model, engine):
    hot = dict(temperature=2.0, max_tokens=12)
    results = run_all(engine, [([1, 2], Sampling(**hot, top_k=1)), ([1, 2], Sampling(**hot, min_p=1.0)),
                               ([1, 2], Sampling(**hot))])
    greedy = alone(model, [1, 2], 12)
    assert results[0][0] == greedy and results[1][0] == greedy
    assert results[2][0] != greedy  # at temperature 2 the unfiltered row does sample (the filters did the work)


@settings(max_examples=120)
@given(name=st.sampled_from(["top_k", "min_p", "repetition_penalty"]),
       value=st.one_of(st.integers(-10, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                       st.text(max_size=3), st.none()))
def test_class_the_sampling_filters_take_their_range_and_refuse_the_rest_by_name(name, value):
    """top_k: an integer, -1 or 0 for every token (vLLM's), else >= 1; min_p in [0, 1], 0 off; repetition_penalty in
    [1e-4, 1e4], 1 off. None is the default."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = value is None or (number and {
        "top_k": lambda v: isinstance(v, int) and v >= -1,
        "min_p": lambda v: math.isfinite(v) and 0 <= v <= 1,
        "repetition_penalty": lambda v: math.isfinite(v) and 1e-4 <= v <= 1e4}[name](value))
    try:
        params = check_params({name: value}, Limits())
    except ApiError as e:
        assert not ok and e.status == 400 and e.param == name, (value, e.message)
    else:
        assert ok, value
        got = getattr(params, name)
        off = value is None or value in {"top_k": (-1, 0), "min_p": (0,), "repetition_penalty": (1,)}[name]
        assert got is None if off else got == value, (value, got)
