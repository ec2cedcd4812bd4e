"""`python serve.py`: load one checkpoint, start the engine's decode thread, serve HTTP with uvicorn.

    python serve.py --checkpoint out/sft                # http://127.0.0.1:8000, the page at /
    python serve.py --checkpoint out/small --port 8080  # a plain model: /v1/completions only

Every bad option or checkpoint is one `error: ...` line and exit status 2 (errors.run_cli), before the
port is taken. --host defaults to loopback: the server has no authentication, so exposing it is a choice
the user makes by name (--host 0.0.0.0).
"""
from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path

import torch
import uvicorn

from checkpoint import default_checkpoint, load_for_inference
from errors import ArgumentParser, UserError, clipped, short_error, to_stderr, utf8_arg
from fileio import path_arg
from runtime.decoding import check_logits_finite, setup_decoding
from runtime.device import resolve_device
from runtime.precision import DTYPE_NAMES, dtype_name

from .app import Served, create_app
from .engine import Engine
from .hosts import allowed_hosts, url_of
from .protocol import protocol_class, quiet_bad_request_warnings
from .schema import Limits

MAX_SLOTS, MAX_QUEUE = 1024, 100_000


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python serve.py", description="An OpenAI-compatible server and a chat page for one checkpoint.")
    p.add_argument("--checkpoint", default=None, type=path_arg, help="ckpt.pt, a training out_dir, an HF GPT-2 directory or hub name "
                   "(default: the run under out/ trained last)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback only)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME", help="on loopback, also answer "
                   "requests whose Host is NAME (a reverse proxy on this machine that passes its own name); repeatable")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:N, mps")
    p.add_argument("--dtype", default="auto", choices=DTYPE_NAMES, help="as sample.py's --dtype")
    p.add_argument("--slots", type=int, default=8, help="requests decoded together in one batch (default 8)")
    p.add_argument("--queue", type=int, default=32, help="requests that may wait for a slot; more get 429 (default 32)")
    p.add_argument("--max-tokens", type=int, default=None, help="the most new tokens a request may ask for "
                   "(default: the model's block_size)")
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds a request may take, queue included")
    p.add_argument("--read-timeout", type=float, default=10.0, help="seconds to receive a request's head (its line and "
                   "headers), and again its body")
    p.add_argument("--shutdown-timeout", type=float, default=10.0, help="seconds a stop (SIGTERM, Ctrl-C) waits for "
                   "the requests in flight before it closes their connections (default 10)")
    p.add_argument("--max-connections", type=int, default=256, help="open connections; more get 503 (default 256)")
    p.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: the usable cores less "
                   "one, at least 1: the HTTP side needs a core too)")
    p.add_argument("--model-name", default=None, help="the id /v1/models shows and requests name "
                   "(default: the checkpoint's folder or file name)")
    return p


def check_args(args) -> None:
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be in 0..65535, got {args.port}")
    for name, value, high in (("--slots", args.slots, MAX_SLOTS), ("--queue", args.queue, MAX_QUEUE),
                              ("--max-connections", args.max_connections, MAX_QUEUE)):
        if not 1 <= value <= high:
            raise UserError(f"{name} must be in 1..{high}, got {value}")
    for name, value in (("--request-timeout", args.request_timeout), ("--read-timeout", args.read_timeout),
                        ("--shutdown-timeout", args.shutdown_timeout)):
        if not 0 < value <= 86400:  # (also refuses nan)
            raise UserError(f"{name} must be > 0 and at most 86400 seconds, got {value}")
    if args.threads is not None and not 1 <= args.threads <= 1024:
        raise UserError(f"--threads must be in 1..1024, got {args.threads}")
    if args.model_name is not None:  # not UTF-8: every JSON reply that names the model would fail (a 500)
        args.model_name = utf8_arg(args.model_name, "--model-name")
        if not args.model_name.strip("/ ") or args.model_name.endswith("/"):  # GET /v1/models/ID/ is a trailing slash
            raise UserError(f"--model-name must be a name that does not end with '/', got {clipped(args.model_name)}; "
                            "e.g. --model-name my-chat")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise UserError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    for name in args.allow_host:  # a Host header's name: no port, path, user or space in it
        if not name.strip() or any(c in name for c in " /@\t\n\r\\") or not name.isascii():
            raise UserError(f"--allow-host takes a host name as a Host header gives it (e.g. chat.example.org), got "
                            f"{clipped(name)}")


def default_threads() -> int:
    """The usable cores less one: the event loop (JSON, sockets, every client's events) runs beside the decode
    thread, and torch's threads wait for each other at every op, so one of them stalled behind the HTTP side
    stalls the step (small.yaml's model on a 2-core EPYC, 8 clients: 1 thread 12.9 ms a step, 2 threads ~100 ms
    when the cores are shared)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


def model_id(spec: str) -> str:
    path = Path(spec)
    return (path.parent.name if path.suffix == ".pt" and path.parent.name else path.stem or path.name) or "smallgpt"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    device = resolve_device(args.device, option="--device")
    torch.set_num_threads(args.threads or default_threads())
    spec = args.checkpoint if args.checkpoint is not None else default_checkpoint()
    loaded = load_for_inference(spec)
    tok, template = loaded.tok, loaded.chat_template
    ready = setup_decoding(loaded.model, device, args.dtype, say=to_stderr)
    check_logits_finite(ready.model, device, loaded.description, ready.dtype)  # before the port is taken
    block = ready.model.config.block_size
    limits = Limits(max_tokens=min(args.max_tokens or block, block), request_timeout_s=args.request_timeout,
                    read_timeout_s=args.read_timeout)
    engine = Engine(ready.model, slots=args.slots, queue_size=args.queue)
    name = args.model_name or model_id(spec)
    sock = listen(args.host, args.port)
    host, port = sock.getsockname()[:2]
    # on loopback only this machine's names for it are served (DNS rebinding: server/hosts.py)
    app = create_app(Served(engine, tok, template, name, limits, int(time.time())),
                     hosts=allowed_hosts(host, args.host, args.allow_host))
    # a stop (SIGTERM, Ctrl-C) lets the requests in flight finish within --shutdown-timeout: unbounded, a client
    # that stopped reading a long stream kept its reply unsent, and the server alive, for as long as it held on
    # the HTTP layer's own answers (a request that is not HTTP, a request head that never arrives) in the server's
    # terms: server/protocol.py
    config = uvicorn.Config(app, log_level="warning", access_log=False, limit_concurrency=args.max_connections,
                            timeout_keep_alive=5, lifespan="off", timeout_graceful_shutdown=args.shutdown_timeout,
                            http=protocol_class(head_timeout_s=args.read_timeout), ws="none")
    quiet_bad_request_warnings()
    to_stderr(f"{loaded.description}: {'chat' if template else 'plain completion (no chat template)'}, "
              f"{tok.name} tokenizer, {device} {dtype_name(ready.dtype)}, {torch.get_num_threads()} thread(s), "
              f"{args.slots} slots; serving {name!r} on {url_of(host, port)}")
    engine.start()
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        engine.stop()
        sock.close()
    return 0


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here rather than by uvicorn: a taken port or a bad address is then one
    line before anything is served (uvicorn would log it after start-up), and --port 0 picks a free port."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise UserError(f"cannot listen on {host!r} ({short_error(e)}); pass an address of this machine to --host, "
                        "e.g. 127.0.0.1") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({short_error(e)}); pass another --port (or stop what "
                        "uses it)") from None
    sock.set_inheritable(True)
    return sock

