"""Which names a loopback server answers to (DNS rebinding).

A page of another site can rebind its DNS name to 127.0.0.1 and then reach a server on this machine from the
user's browser: load its page, read /v1/models, POST to the API. The browser still sends the site's own name in
the Host header, so a server that listens on loopback answers only the names a client on this machine uses for
it: the loopback names, the address it is bound to, the name given to --host, and each --allow-host (a reverse
proxy on this machine that passes its clients' Host through). A page of another site that simply posts to
http://127.0.0.1:8000 sends the right Host but its own Origin (a browser sends one with every cross-site POST;
curl and the openai package send none): an Origin of another name is refused too, so no page but the server's
own makes it generate. A server the user exposed (--host 0.0.0.0, or an address of another interface) answers
whatever name reaches it.
"""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address `name` spells (an IPv4-mapped IPv6 address as IPv4, an IPv6 zone dropped); None: a name."""
    try:
        ip = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return None
    return getattr(ip, "ipv4_mapped", None) or ip


def canonical(name: str) -> str:
    """One spelling per name: lower-case, no trailing dot, an IP address in its short form (_ip):
    '[0:0:0:0:0:0:0:1]' and '::1', 'LocalHost.' and 'localhost' alike."""
    name = name.strip().lower()
    name = name[:-1] if name.endswith(".") else name
    ip = _ip(name)
    return name if ip is None else str(ip)


def url_of(address: str, port: int | str) -> str:
    """http://ADDRESS:PORT, an IPv6 address in brackets (the start-up line's and the refusal's)."""
    return f"http://{f'[{address}]' if ':' in address else address}:{port}"


def host_of(value: bytes) -> str | None:
    """The canonical name of a Host header's value, its port left off; None where it is no host[:port]
    ('[::1]evil' is not '::1')."""
    text = value.decode("latin-1").strip()
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1:] if end > 0 else "x"
        if rest and not (rest[0] == ":" and rest[1:].isdigit()) and rest != ":":
            return None
        return canonical(text[1:end])
    if text.count(":") == 1:
        text, port = text.split(":")
        if port and not port.isdigit():
            return None
    return canonical(text)


def is_loopback(address: str) -> bool:
    ip = _ip(address)
    return ip is not None and ip.is_loopback


def allowed_hosts(bound: str, given: str, extra: list[str] = ()) -> frozenset[str] | None:
    """The names a server bound to the address `bound` (for --host `given`) answers to; None: any (not loopback)."""
    if not is_loopback(bound):
        return None
    return frozenset(canonical(n) for n in (*LOOPBACK_NAMES, bound, given, *extra))


def origin_host(value: bytes) -> str | None:
    """The canonical name of an Origin header's site ('http://localhost:8000' -> 'localhost'); None: no http(s)
    origin ('null', a sandboxed frame's or a file's)."""
    try:
        parts = urlsplit(value.decode("latin-1").strip())
        name = parts.hostname
    except ValueError:
        return None
    return canonical(name) if parts.scheme in ("http", "https") and name else None


def refusal(headers: list[tuple[bytes, bytes]], hosts: frozenset[str] | None) -> tuple[str, str] | None:
    """(code, why) where a request is not for this loopback server: its Host another name, or its Origin a page
    of another site; None where it is (or the server answers any name: `hosts` None). HTTP/1.0 may send no Host."""
    if hosts is None:
        return None
    for header, read, code, why in ((b"host", host_of, "host_not_allowed", "Host {!r} is not this server's name"),
                                    (b"origin", origin_host, "origin_not_allowed",
                                     "a page of another site (Origin {!r}) may not use this server")):
        given = [v for k, v in headers if k == header]
        if given and (len(given) > 1 or read(given[0]) not in hosts):
            return code, why.format(b", ".join(given).decode("latin-1")[:100])
    return None
