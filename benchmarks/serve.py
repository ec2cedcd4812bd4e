"""The server under load (--only serve): `python serve.py` started for real, with small.yaml's model
(4 layers, 128 wide, block 64, GPT-2's vocabulary; random weights: speed does not depend on them), and
streaming clients on loopback: 1 client, then 8 at once.

Each client sends /v1/completions with its own 16-token prompt, greedy, 48 new tokens (the block's
rest), streamed. Time to first token: from sending the request to its first text chunk. Tokens per
second: completion tokens (the usage chunk) over the request's whole time, prefill included; for 8
clients the aggregate, every client's tokens over the round's wall time (first send to last end). Each
figure is the median over `repeats` rounds. The clients run in this process (one asyncio loop, httpx),
on the same cores as the server, as they would on a 2-core laptop.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from checkpoint import CKPT_NAME, save_checkpoint
from model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=50257)  # configs/small.yaml's model
QUICK = dict(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=50257)
PROMPT, NEW, CLIENTS = 16, 48, (1, 8)
START_TIMEOUT_S = 120


def _checkpoint(path: Path, shape: dict) -> None:
    torch.manual_seed(0)
    config = GPTConfig(**shape)
    save_checkpoint(path, {"model": GPT(config).state_dict(), "model_config": dataclasses.asdict(config), "config": {},
                           "tokenizer": {"tokenizer": "gpt2", "chars": None}, "iter": 0})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _one(client: httpx.AsyncClient, url: str, prompt: list[int], new: int) -> dict:
    body = {"prompt": prompt, "max_tokens": new, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first, tokens = None, 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"the server answered {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text") and first is None:
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    return {"start": start, "end": end, "ttft": (first or end) - start, "tokens": tokens}


async def _rounds(url: str, clients: int, repeats: int, new: int, vocab: int) -> dict:
    g = torch.Generator().manual_seed(clients)
    async with httpx.AsyncClient(timeout=300) as client:
        await _one(client, url, [1] * PROMPT, new)  # warm-up: the first forward of each shape is slower
        rounds = []
        for _ in range(repeats):
            prompts = [torch.randint(vocab, (PROMPT,), generator=g).tolist() for _ in range(clients)]
            rounds.append(await asyncio.gather(*(_one(client, url, p, new) for p in prompts)))
    aggregate = [sum(r["tokens"] for r in rs) / (max(r["end"] for r in rs) - min(r["start"] for r in rs)) for rs in rounds]
    per_client = [r["tokens"] / (r["end"] - r["start"]) for rs in rounds for r in rs]
    return {"clients": clients, "tok_s": statistics.median(aggregate), "tok_s_per_client": statistics.median(per_client),
            "ttft_ms": 1000 * statistics.median(r["ttft"] for rs in rounds for r in rs),
            "tokens": sum(r["tokens"] for rs in rounds for r in rs)}


def bench_serve(*, device: torch.device, quick: bool, repeats: int, threads: int | None, say) -> dict:
    shape = QUICK if quick else SMALL
    new = 8 if quick else NEW
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / CKPT_NAME
        _checkpoint(ckpt, shape)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log = Path(tmp) / "serve.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen([sys.executable, "serve.py", "--checkpoint", str(ckpt), "--port", str(port),
                                     "--device", device.type, "--dtype", "float32", "--slots", str(max(CLIENTS)),
                                     "--model-name", "bench", *(["--threads", str(threads)] if threads else [])],
                                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        try:
            _wait(url, proc, log)
            say(f"[serve] small.yaml's model ({shape}), {PROMPT}-token prompts, {new} new tokens, {repeats} rounds")
            rows = []
            for clients in CLIENTS:
                rows.append(asyncio.run(_rounds(url, clients, repeats, new, shape["vocab_size"])))
                say(f"[serve] {clients} client(s): {rows[-1]['tok_s']:.0f} tok/s, first token {rows[-1]['ttft_ms']:.0f} ms")
            health = httpx.get(url + "/health", timeout=10).json()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    return {"model": shape, "prompt": PROMPT, "new_tokens": new, "repeats": repeats, "rows": rows,
            "max_batch": health["max_batch"], "speedup": rows[-1]["tok_s"] / rows[0]["tok_s"], "target": 3.0}


def _wait(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve.py exited: {log.read_text(errors='replace')[-500:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"serve.py did not answer /health within {START_TIMEOUT_S} s")


def format_serve(s: dict) -> str:
    lines = [f"server under load (python serve.py, small.yaml's model, random weights, fp32; {s['prompt']}-token "
             f"prompts, {s['new_tokens']} new tokens each, greedy, streamed; medians of {s['repeats']} rounds)",
             "clients  tok/s (all)  tok/s (each)  first token ms"]
    for r in s["rows"]:
        lines.append(f"{r['clients']:>7}  {r['tok_s']:>11.1f}  {r['tok_s_per_client']:>12.1f}  {r['ttft_ms']:>14.0f}")
    lines.append(f"{max(CLIENTS)} clients / 1: {s['speedup']:.2f}x the aggregate tokens per second (target >= "
                 f"{s['target']:.0f}x); largest batch one decode step ran: {s['max_batch']}")
    return "\n".join(lines)
