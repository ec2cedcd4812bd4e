"""Helpers of the server tests: a tiny chat checkpoint, `python serve.py` started for real on a free
loopback port, and headless Chromium driven over the DevTools protocol (websocket-client)."""
from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from checkpoint import save_checkpoint
from data import get_tokenizer
from data.chat_template import template_for
from model import GPT, GPTConfig

from multirank_runs import free_port

ROOT = Path(__file__).resolve().parents[1]
CHARS = "".join(sorted(set(" !',.?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n")))


def make_chat_checkpoint(path: Path, block_size: int = 128, seed: int = 0):
    """A random tiny chat model (char tokenizer, the chat template's markers in its vocabulary), saved as
    train.py saves one. Peaky weights: greedy choices are far from float ties. -> (model, tok, template)"""
    tok = get_tokenizer("char", CHARS)
    template = template_for(tok)
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=template.vocab_size, block_size=block_size, n_layer=2, n_head=2, n_embd=32)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.4)
    save_checkpoint(path, {"model": model.state_dict(), "model_config": dataclasses.asdict(config), "config": {},
                           "tokenizer": {"tokenizer": "char", "chars": CHARS}, "iter": 0,
                           "chat_template": template.to_dict()})
    return model.eval(), tok, template


class Server:
    """`python serve.py ...` in a subprocess on 127.0.0.1; stderr kept in a file (read by `log`)."""

    def __init__(self, checkpoint: Path, *args: str, start_timeout: float = 90.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._err = tempfile.TemporaryFile()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "serve.py", "--checkpoint", str(checkpoint), "--port",
                                      str(self.port), "--device", "cpu", "--dtype", "float32", *args],
                                     cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self._err)
        self.http = httpx.Client(timeout=10)
        deadline = time.monotonic() + start_timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve.py exited ({self.proc.returncode}): {self.log()}")
            try:
                if self.http.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"serve.py did not answer /health in {start_timeout} s: {self.log()}")
            time.sleep(0.2)

    def health(self) -> dict:
        return self.http.get(self.url + "/health").json()

    def wait_idle(self, timeout: float = 10.0) -> dict:
        """/health once no request is active or waiting (or the last one seen at the timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if (h["active"] == 0 and h["waiting"] == 0) or time.monotonic() > deadline:
                return h
            time.sleep(0.05)

    def log(self) -> str:
        self._err.seek(0)
        return self._err.read().decode(errors="replace")

    def stop(self) -> None:
        self.http.close()
        end(self.proc, timeout=15)


def end(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, and SIGKILL if it has not exited within `timeout` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Browser:
    """Headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, url: str, profile: Path):
        import websocket  # websocket-client, a test-only dependency (requirements-dev.txt)

        self.proc = subprocess.Popen([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
                                      "--no-first-run", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                                      "--window-size=1000,700", url],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.is_file() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise AssertionError("headless Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        while True:
            pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json() if t["type"] == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=20)
        self.next_id = 0

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # events arrive in between; the answer has our id
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return msg["result"]

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"the page never got to: {expression}")
            time.sleep(0.1)

    def type_text(self, text: str) -> None:
        self.call("Input.insertText", text=text)

    def press_enter(self) -> None:
        key = dict(key="Enter", code="Enter", windowsVirtualKeyCode=13, nativeVirtualKeyCode=13)
        self.call("Input.dispatchKeyEvent", type="keyDown", text="\r", **key)
        self.call("Input.dispatchKeyEvent", type="keyUp", **key)

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        end(self.proc, timeout=10)
