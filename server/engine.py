"""Continuous batching: one model, one KV cache of `slots` rows, one background thread that decodes every
active request together.

A request joins between two steps: its prompt is prefilled alone into a free row of the shared cache
(model/gpt.py's per-row positions let rows sit at different lengths), and from then on each step feeds
every active row its last token at that row's own slot, in one forward of (n, 1). A request leaves between
steps too: on its stop token, at max_tokens, when its row of the cache is full, at its deadline, or when
its client goes away. Active rows are kept in cache rows 0..n-1 (a leaving row's place is taken by the
last one, whose keys and values are copied over), so a step runs n rows and reads only the slots in use,
never the idle ones.

Each request samples with its own settings: rows that share them (temperature, top_p, top_k, min_p, the
repetition penalty) and no seed are sampled by one call of model.generate.sample (the generation path sample.py
and chat.py use), each with its own context's tokens for the penalty; a request with a seed has its own
generator, so its text does not depend on who else is being served.

The thread hands each token to its request's asyncio queue with `loop.call_soon_threadsafe`; torch
releases the GIL inside its kernels, so the event loop keeps answering while a step runs. Requests
beyond the slots wait in a bounded queue; `submit` raises QueueFull past it (the server's 429).
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import threading
import time
from dataclasses import dataclass, field

import torch

from errors import short_error, to_stderr
from model.generate import sample
from model.gpt import KVCache

IDLE_WAIT_S = 0.5  # an idle thread wakes this often to notice a stop or an expired queued request


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full."""


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0: greedy
    top_p: float | None = None
    max_tokens: int = 256
    stop_ids: frozenset[int] = frozenset()  # sampled -> the reply ends there (the token is not emitted)
    vocab_limit: int | None = None  # sample only ids below it (markers above a padded vocabulary's text)
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None  # over the tokens of the request's context, prompt and reply


@dataclass(eq=False)
class Request:
    """One generation. The engine thread writes its events to `queue` on `loop`: ("token", id) per token,
    then ("done", finish_reason), ("error", message) or ("timeout", message: its time ran out in the queue) once."""

    prompt: list[int]
    sampling: Sampling
    loop: asyncio.AbstractEventLoop
    deadline: float  # time.monotonic() past which the request ends
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False  # set by the server when the client goes away; the engine drops the row
    # engine-side state
    length: int = 0  # tokens in this request's row of the cache
    last: int = 0  # the token to feed at the next step
    generated: int = 0
    generator: torch.Generator | None = None
    seen: torch.Tensor | None = None  # (V,) bool: the context's tokens, where a repetition penalty is asked for

    def cancel(self) -> None:
        self.cancelled = True

    def _emit(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server is shutting down, nobody is listening
            pass


class Engine:
    def __init__(self, model, *, slots: int = 8, queue_size: int = 32):
        self.model = model
        self.block_size = model.config.block_size
        self.slots, self.queue_size = slots, queue_size
        self.cache = model.new_kv_cache(slots, self.block_size)
        self.device = model.transformer.wte.weight.device
        self.active: list[Request] = []  # row i of the cache holds active[i]
        self.waiting: collections.deque[Request] = collections.deque()
        self.cond = threading.Condition()
        self.generator = torch.Generator(device=self.device)
        self.generator.seed()
        self.stopping = False
        self.steps = 0  # decode steps run (for tests and the benchmark: batching really happened)
        self.max_batch = 0  # the most rows one step has decoded
        self.thread = threading.Thread(target=self._run, name="decode", daemon=True)

    # ------------------------------------------------------------------ the server's side (event loop)
    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(timeout=10)

    def submit(self, request: Request) -> None:
        """Queue a request; QueueFull when the slots and the queue are all taken."""
        with self.cond:
            self._prune_waiting()
            if len(self.waiting) >= self.queue_size + max(0, self.slots - len(self.active)):
                raise QueueFull
            self.waiting.append(request)
            self.cond.notify()

    def load(self) -> dict:
        with self.cond:
            self._prune_waiting()
            return {"active": len(self.active), "waiting": len(self.waiting), "slots": self.slots,
                    "queue_size": self.queue_size, "decode_steps": self.steps, "max_batch": self.max_batch}

    def _prune_waiting(self) -> None:
        """Drop the queued requests whose clients went away (under self.cond): kept until a slot freed, each held
        a place in the queue (a client retrying after its timeout left one behind per try), and live clients got
        429 from a queue of nobody."""
        if any(r.cancelled for r in self.waiting):
            self.waiting = collections.deque(r for r in self.waiting if not r.cancelled)

    # ------------------------------------------------------------------ the engine thread
    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self.cond:
                    while not self.stopping and not self.active and not self.waiting:
                        self.cond.wait(IDLE_WAIT_S)
                    if self.stopping:
                        break
                    joining = []
                    while self.waiting and len(self.active) + len(joining) < self.slots:
                        joining.append(self.waiting.popleft())
                for request in joining:
                    try:
                        self._join(request)
                    except Exception as e:  # noqa: BLE001 - one request's prefill failed: only it ends
                        self._fail([request], "a prefill", e)
                        if self.active and self.active[-1] is request:
                            self.active.pop()
                try:
                    self._drop_finished()
                    if self.active:
                        self._step()
                except Exception as e:  # noqa: BLE001 - one bad step must not kill the server
                    self._fail(self.active, "a decoding step", e)
                    self.active.clear()
        for request in self.active + list(self.waiting):
            request._emit(("error", "the server is shutting down"))

    @staticmethod
    def _fail(requests: list[Request], what: str, e: Exception) -> None:
        to_stderr(f"error: {what} failed ({short_error(e)}); its requests were ended, the server goes on")
        for request in requests:
            request._emit(("error", f"generation failed ({short_error(e)})"))

    def _join(self, request: Request) -> None:
        """Prefill the request's prompt alone into the next free row, then sample its first token."""
        now = time.monotonic()
        if request.cancelled:
            return
        if now > request.deadline:
            request._emit(("timeout", "the request waited past its time limit in the queue; retry later"))
            return
        row = len(self.active)
        if request.sampling.seed is not None:
            request.generator = torch.Generator(device=self.device).manual_seed(generator_seed(request.sampling.seed))
        P = len(request.prompt)
        view = [_RowCache(layer, row, P) for layer in self.cache]
        idx = torch.tensor([request.prompt], dtype=torch.long, device=self.device)
        pos = torch.arange(P, device=self.device).unsqueeze(0)
        logits = self.model(idx, input_pos=pos, kv_cache=view)[:, -1]
        if request.sampling.repetition_penalty is not None:
            request.seen = torch.zeros(logits.size(-1), dtype=torch.bool, device=self.device)
            request.seen[idx[0]] = True
        request.length = P
        self.active.append(request)
        self._take(request, self._sample([request], logits)[0])

    def _step(self) -> None:
        """One token for every active row, each fed at its own slot."""
        n = len(self.active)
        span = max(r.length for r in self.active) + 1  # slots any row reads this step
        view = [_BatchCache(layer, n, span) for layer in self.cache]
        tok = torch.tensor([[r.last] for r in self.active], dtype=torch.long, device=self.device)
        pos = torch.tensor([[r.length] for r in self.active], dtype=torch.long, device=self.device)
        logits = self.model(tok, input_pos=pos, kv_cache=view)[:, -1]
        for r in self.active:
            r.length += 1
        self.steps += 1
        self.max_batch = max(self.max_batch, n)
        for r, t in zip(list(self.active), self._sample(self.active, logits)):
            self._take(r, t)
        self._drop_finished()

    def _sample(self, rows: list[Request], logits: torch.Tensor) -> list[int]:
        """One token per row, each with its own settings; rows that share them are sampled together."""
        out: list[int | None] = [None] * len(rows)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(rows):
            s = r.sampling
            key = ((s.temperature, s.top_p, s.top_k, s.min_p, s.repetition_penalty, s.vocab_limit)
                   if r.generator is None else ("own", i))
            groups.setdefault(key, []).append(i)
        for members in groups.values():
            s, gen = rows[members[0]].sampling, rows[members[0]].generator or self.generator
            sub = logits[members] if len(members) < len(rows) else logits
            seen = None if s.repetition_penalty is None else torch.stack([rows[i].seen for i in members])
            if s.vocab_limit is not None:
                sub = sub[:, : s.vocab_limit]
                seen = None if seen is None else seen[:, : s.vocab_limit]
            toks = sample(sub, s.temperature, s.top_k, s.top_p, gen, s.min_p, s.repetition_penalty, seen).tolist()
            for i, t in zip(members, toks):
                out[i] = t
        return out  # type: ignore[return-value]

    def _take(self, request: Request, token: int) -> None:
        """The request's new token: emitted, or the end of the request."""
        s = request.sampling
        if token in s.stop_ids:
            return self._finish(request, "stop")
        request._emit(("token", token))
        request.generated += 1
        request.last = token
        if request.seen is not None:
            request.seen[token] = True
        if request.generated >= s.max_tokens or request.length >= self.block_size:
            # no slot left in the row for this token's keys: the context is full
            return self._finish(request, "length")
        if time.monotonic() > request.deadline:
            return self._finish(request, "length")

    def _finish(self, request: Request, reason: str) -> None:
        request._emit(("done", reason))
        request.cancelled = True  # leaves at the next _drop_finished

    def _drop_finished(self) -> None:
        """Remove ended and cancelled rows; the last row moves into each hole (rows stay 0..n-1)."""
        i = 0
        while i < len(self.active):
            if not self.active[i].cancelled:
                i += 1
                continue
            last = len(self.active) - 1
            if i != last:
                moved = self.active[last]
                for layer in self.cache:
                    layer.k[i, :, : moved.length] = layer.k[last, :, : moved.length]
                    layer.v[i, :, : moved.length] = layer.v[last, :, : moved.length]
                self.active[i] = moved
            self.active.pop()


def generator_seed(seed: int) -> int:
    """A request's seed (any 64-bit integer) as the generator's seed. torch's CPU generator (mt19937) keeps
    only the low 32 bits of its seed, so seeds 5 and 2**32 + 5 gave the same text: the whole seed is hashed
    (blake2b, 64 bits) and the hash folded to 32 bits, so distinct seeds give distinct streams in practice,
    and the same seed the same stream on every run."""
    h = int.from_bytes(hashlib.blake2b(seed.to_bytes(8, "little", signed=True), digest_size=8).digest(), "little")
    return (h ^ (h >> 32)) & 0xFFFFFFFF


class _RowCache:
    """One row of a layer's KVCache, its first `span` slots: what a joining request's prefill writes.
    Views, so the KVCache's own update writes into the shared cache."""

    def __init__(self, layer, row: int, span: int):
        self.k, self.v = layer.k[row : row + 1, :, :span], layer.v[row : row + 1, :, :span]

    def update(self, pos, k, v):
        return KVCache.update(self, pos, k, v)  # type: ignore[arg-type]


class _BatchCache(_RowCache):
    """Rows 0..n-1 of a layer's KVCache, slots 0..span-1: a step reads no idle row and no unused slot."""

    def __init__(self, layer, n: int, span: int):
        self.k, self.v = layer.k[:n, :, :span], layer.v[:n, :, :span]

