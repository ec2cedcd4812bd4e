"""The HTTP layer under the app, found from outside (`python serve.py` on loopback, raw sockets): a request
that is not HTTP got uvicorn's plain-text "Invalid HTTP request received." and a warning in the log each time,
and a connection that never finished its request's head was held for as long as the client kept it open (256
of them: a 503 for everyone, indefinitely). server/protocol.py answers both in the server's terms; the oracle of
"not HTTP" here is h11 itself (the parser uvicorn uses), not the code under test."""
from __future__ import annotations

import json
import socket
import time

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving import Server, make_chat_checkpoint

READ_TIMEOUT = 1.0
CONNECTIONS = 8
HOST = (b"Host", b"127.0.0.1")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "ckpt.pt"
    make_chat_checkpoint(path, block_size=32)
    s = Server(path, "--read-timeout", str(READ_TIMEOUT), "--max-connections", str(CONNECTIONS), "--max-tokens", "2")
    yield s
    s.stop()
    # each bad request was answered to its client: the log has only the server at its connection limit (an
    # operator's matter: the idle-connection test fills it on purpose)
    log = s.log().replace("WARNING:  Exceeded concurrency limit.", "")
    assert "Traceback" not in log and "WARNING" not in log, log


def exchange(port: int, data: bytes, wait: float = 5.0) -> tuple[bytes, float]:
    """Send `data`, then read until the server closes -> (all it sent, seconds until it closed)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(data)
        s.settimeout(wait)
        start, got = time.monotonic(), b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except TimeoutError:
            raise AssertionError(f"the server kept the connection open past {wait} s: {got[:300]!r}") from None
        except ConnectionResetError:
            pass
        return got, time.monotonic() - start


def h11_verdict(data: bytes) -> int | None:
    """The status h11 (uvicorn's parser) names for refusing these bytes, or None if it takes them."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    try:
        while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            if isinstance(event, h11.EndOfMessage):
                return None
    except h11.RemoteProtocolError as e:
        return e.error_status_hint
    return None


def head(line: bytes, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> bytes:
    return line + b"\r\n" + b"".join(n + b": " + v + b"\r\n" for n, v in headers) + b"\r\n" + body


NOT_DIGITS = st.text("0123456789-+x. ,", min_size=1, max_size=8).filter(lambda v: not v.strip().isdigit())
FAULTS = st.one_of(
    st.just(head(b"GET /health HTTP/1.1", [])),  # no Host
    st.sampled_from([b"127.0.0.1", b"localhost"]).map(lambda h: head(b"GET /health HTTP/1.1", [HOST, (b"Host", h)])),
    NOT_DIGITS.map(lambda v: head(b"POST /v1/completions HTTP/1.1", [HOST, (b"Content-Length", v.encode())])),
    st.tuples(st.integers(0, 9), st.integers(10, 99)).map(lambda n: head(b"POST /v1/completions HTTP/1.1", [
        HOST, (b"Content-Length", str(n[0]).encode()), (b"Content-Length", str(n[1]).encode())])),
    st.sampled_from([b"gzip", b"deflate", b"chunked, gzip", b"x"]).map(
        lambda te: head(b"POST /v1/completions HTTP/1.1", [HOST, (b"Transfer-Encoding", te)])),  # 501
    st.text(" ()<>@,;\\\"/[]?={}", min_size=1, max_size=4).map(
        lambda bad: head(b"GET /health HTTP/1.1", [HOST, (b"X" + bad.encode() + b"Y", b"1")])),
    st.binary(min_size=1, max_size=30).filter(lambda b: b"\n" not in b and b"\r" not in b).map(
        lambda line: head(line, [HOST])),  # not a request line: random bytes, a TLS hello's first ones
    st.integers(17, 40).map(lambda kib: b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: " + b"a" * kib * 1024),  # 431
    st.text("xyzg-+ ", min_size=1, max_size=4).map(lambda size: head(  # a chunk whose size line is no hex number
        b"POST /v1/completions HTTP/1.1", [HOST, (b"Transfer-Encoding", b"chunked")], size.encode() + b"\r\nab\r\n")),
)


@settings(max_examples=40)
@given(data=FAULTS)
def test_class_a_request_that_is_not_http_is_answered_in_openais_shape_and_closed(server, data):
    """Whatever h11 refuses gets the status h11 names (400, 431 for a head over the limit, 501 for a transfer
    coding other than chunked) with OpenAI's error body naming what was wrong, and the connection closes; the
    next request is served."""
    expected = h11_verdict(data)
    assert expected in (400, 431, 501), (data[:80], expected)  # the strategy makes only what h11 refuses
    got, _ = exchange(server.port, data)
    status_line, _, rest = got.partition(b"\r\n")
    assert status_line.startswith(f"HTTP/1.1 {expected} ".encode()), got[:300]
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in headers.lower() and b"connection: close" in headers.lower(), headers
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] and "; " in err["message"], err
    assert server.http.get(server.url + "/health").status_code == 200


@settings(max_examples=3)
@given(cuts=st.lists(st.integers(1, 60), min_size=1, max_size=CONNECTIONS - 2, unique=True))
def test_class_a_request_head_cut_short_gets_a_408_within_the_read_timeout(server, cuts):
    """Half a request line, or a head without its blank line, held its connection until the client closed it.
    (Each example's heads are sent at once, on their own connections.)"""
    from concurrent.futures import ThreadPoolExecutor

    whole = head(b"POST /v1/completions HTTP/1.1", [HOST, (b"Content-Type", b"application/json")])
    parts = [whole[: min(cut, len(whole) - 2)] for cut in cuts]  # never the blank line that ends the head
    with ThreadPoolExecutor(len(parts)) as pool:
        for got, seconds in pool.map(lambda part: exchange(server.port, part), parts):
            assert got.startswith(b"HTTP/1.1 408 ") and b'"request_timeout"' in got, got[:300]
            assert READ_TIMEOUT - 0.1 <= seconds <= READ_TIMEOUT + 2.0, seconds


def test_connections_that_send_nothing_are_closed_and_the_server_is_not_held(server):
    """CONNECTIONS sockets that never send a byte took every place (--max-connections): a 503 for everyone for as
    long as they stayed open. Each is closed silently after the read timeout (no 408: a byte-less connection may
    be a browser's preconnect, which would read it as its next request's answer), and the server answers again."""
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(CONNECTIONS)]
    try:
        time.sleep(0.2)
        assert server.http.get(server.url + "/health").status_code == 503  # every place taken: the attack is real
        for s in idle:
            s.settimeout(READ_TIMEOUT + 3)
            assert s.recv(100) == b""  # closed, nothing sent
        assert server.http.get(server.url + "/health").status_code == 200
    finally:
        for s in idle:
            s.close()


def test_a_kept_alive_connection_serves_its_next_request_and_a_websocket_upgrade_is_plain_http(server):
    """The head timer starts again after each reply: a kept-alive connection's next request within the timeout
    is served. An Upgrade this server does not speak (WebSocket, h2c) is served as plain HTTP, with no advice to
    install a WebSocket library in the log (the module's fixture checks the log)."""
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(5)
        for upgrade in (b"websocket", b"h2c"):
            s.sendall(head(b"GET /health HTTP/1.1", [HOST, (b"Connection", b"Upgrade"), (b"Upgrade", upgrade),
                                                     (b"Sec-WebSocket-Key", b"dGhlIHNhbXBsZSBub25jZQ=="),
                                                     (b"Sec-WebSocket-Version", b"13")]))
            reply = b""
            while b'"status"' not in reply and (chunk := s.recv(65536)):
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 200 ") and b'"status"' in reply, reply[:300]
            time.sleep(READ_TIMEOUT / 2)
