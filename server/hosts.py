"""Which names a loopback server answers to (DNS rebinding).

A page of another site can rebind its DNS name to 127.0.0.1 and then reach a server on this machine from the
user's browser: load its page, read /v1/models, POST to the API. The browser still sends the site's own name in
the Host header, so a server that listens on loopback answers only the names a client on this machine uses for
it: the loopback names, the address it is bound to, the name given to --host, and each --allow-host (a reverse
proxy on this machine that passes its clients' Host through). A server the user exposed (--host 0.0.0.0, or an
address of another interface) answers whatever name reaches it.
"""
from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def canonical(name: str) -> str:
    """One spelling per name: lower-case, no trailing dot, an IP address in its short form (an IPv4-mapped IPv6
    address as IPv4, an IPv6 zone dropped): '[0:0:0:0:0:0:0:1]' and '::1', 'LocalHost.' and 'localhost' alike."""
    name = name.strip().lower()
    name = name[:-1] if name.endswith(".") else name
    try:
        ip = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return name
    return str(getattr(ip, "ipv4_mapped", None) or ip)


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
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def allowed_hosts(bound: str, given: str, extra: list[str] = ()) -> frozenset[str] | None:
    """The names a server bound to the address `bound` (for --host `given`) answers to; None: any (not loopback)."""
    if not is_loopback(bound):
        return None
    return frozenset(canonical(n) for n in (*LOOPBACK_NAMES, bound, given, *extra))
