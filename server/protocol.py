"""The HTTP/1.1 layer under the app: uvicorn's h11 protocol, with what it answers itself in the server's terms.

What a client sends that is not HTTP at all never reaches the app (server/app.py), so uvicorn answered it:
a plain-text "Invalid HTTP request received." for a request h11 cannot parse (no Host, two Content-Lengths,
headers over 16 KiB, a TLS hello on the plain port), with a warning in the server's log for each, and nothing
at all for a connection that never finished its request's head (sent nothing, or half a request line), which
held one of --max-connections until the client closed it: 256 such sockets were a 503 for everyone for as
long as they stayed open. Here:

- a request h11 refuses gets OpenAI's error body like every other fault, with the status h11 names (400; 431
  for headers over the limit; 501 for a Transfer-Encoding other than chunked) and what was wrong, and the
  connection closes;
- a connection whose request head has not arrived whole within `head_timeout_s` (serve.py's --read-timeout), on a
  new connection or after a reply on a kept-alive one, is closed: with a 408 where part of a head came, silently
  where not a byte did (uvicorn's keep-alive timeout closes an idle kept-alive connection so, sooner);
- uvicorn's warnings about such requests (and about a WebSocket or h2c upgrade, which this server does not
  speak: uvicorn served the request and advised installing a WebSocket library) are not logged: each bad
  request is answered to its client, and the log stays for the server's own faults.
"""
from __future__ import annotations

import json
import logging
import sys

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .schema import error_body

MAX_HEAD_BYTES = 16 * 1024  # h11's limit on an incomplete request head (uvicorn's default)
REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
           501: "Not Implemented"}
NOISE = ("Invalid HTTP request received.", "Unsupported upgrade request.", "No supported WebSocket library detected")


def protocol_class(head_timeout_s: float) -> type[H11Protocol]:
    """The protocol uvicorn.Config(http=...) takes, with this server's head timeout."""
    return type("Protocol", (Protocol,), {"head_timeout_s": head_timeout_s})


def quiet_bad_request_warnings() -> None:
    """uvicorn's log lines about requests its clients got wrong (answered to them, see above): dropped."""
    logging.getLogger("uvicorn.error").addFilter(
        lambda record: not any(str(record.msg).startswith(n) for n in NOISE))


class Protocol(H11Protocol):
    head_timeout_s = 10.0
    _head_timer = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_timer()  # the next request's head, on a kept-alive connection

    def connection_lost(self, exc) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        if not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        # h11 leaves IDLE once a request's head is parsed: from then on the app's own read timeout bounds the body
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if not self.conn.trailing_data[0]:  # not a byte of a request: closed silently, as an idle kept-alive one is
            self._disarm_head_timer()  # (a 408 there could be read as the answer to the client's next request)
            self.transport.close()
            return
        self._answer(408, f"no whole request (request line and headers) arrived within {self.head_timeout_s:g} s; "
                          "send the request at once", "request_timeout")

    def send_400_response(self, msg: str) -> None:
        """Called by uvicorn inside its `except h11.RemoteProtocolError`: the error h11 raised is the one handled."""
        error = sys.exc_info()[1]
        status = getattr(error, "error_status_hint", 400)
        detail = str(error or msg).split(": bytearray(")[0]  # h11 quotes the line it refused: not echoed back
        if status == 431:
            text, code = (f"the request's head (request line and headers) is over {MAX_HEAD_BYTES // 1024} KiB; "
                          "send shorter headers"), "request_headers_too_large"
        elif status == 501:
            text, code = ("only Transfer-Encoding: chunked is supported; send the body with a Content-Length or "
                          "chunked"), "unsupported_transfer_encoding"
        else:
            fix = ("frame the body as chunked encoding does (a hex size line, the bytes, CRLF), or send a Content-Length"
                   if "chunk" in detail else "send one request line, one Host header and at most one Content-Length")
            status, text, code = 400, f"the request is not valid HTTP/1.1 ({detail}); {fix}", "invalid_http"
            if detail == "illegal request line":
                text += " (this server speaks plain HTTP: http://, not https://)"
        self._answer(status, text, code)

    def _answer(self, status: int, message: str, code: str) -> None:
        """The error in OpenAI's shape, then the connection closed. Written as bytes: h11's state may be an error
        state here, and where the app had started its reply already (a bad chunk in its body) the connection
        can only be closed."""
        self._disarm_head_timer()
        if self.cycle is None or not self.cycle.response_started or self.cycle.response_complete:
            body = json.dumps(error_body(message, code=code)).encode()
            head = (f"HTTP/1.1 {status} {REASONS[status]}\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
            self.transport.write(head.encode() + body)
        self.transport.close()
