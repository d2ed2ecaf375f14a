"""Where a client finds its nodes: address lists, ``ROOST_NODES``, and name resolution order.

A user names nodes the way NATS and Redis users do: ``host:port``, ``[v6 literal]:port``, a
bare host (port 7400), a comma-separated list of those, or nothing, which means the
``ROOST_NODES`` environment variable (as ``NATS_URL``) and then ``127.0.0.1:7400``.

The sans-IO session compares the source address of every reply with the address it sent to,
so it must only ever see resolved addresses: the shells resolve names once per
connect and again when a session fails over (``node_silent``), and hand the session IP
literals. IPv4 addresses come first: a name such as ``localhost`` may also resolve to ``::1``
while the node listens on 127.0.0.1, and trying the silent address first would cost a whole
``node_timeout``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

Addr = tuple[str, int]
DEFAULT_PORT = 7400
DEFAULT_NODES = "127.0.0.1:7400"
ENV = "ROOST_NODES"

NodeSpec = Addr | str | Sequence[Addr | str] | None


def parse_node(value: str) -> Addr:
    """``"host:7400"``, ``"[::1]:7400"``, ``"::1"`` or ``"host"`` -> (host, port); ValueError says why not."""
    text = value.strip()
    if not text:
        raise ValueError("an empty node address (expected HOST:PORT)")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{value!r} is not [IPV6]:PORT")
        port = rest[1:] if rest else str(DEFAULT_PORT)
    elif text.count(":") > 1:  # (a bare IPv6 literal: no port)
        host, port = text, str(DEFAULT_PORT)
    else:
        host, sep, port = text.partition(":")
        if not sep:
            port = str(DEFAULT_PORT)
    if not port.isdigit():
        raise ValueError(f"{value!r} has no valid port (1 to 65535)")
    return checked(host, int(port), value)


def checked(host: str, port: int, value: Any) -> Addr:
    """A node's (host, port) as the session must see it: a literal in the kernel's own spelling
    (replies come from ``::1``, never from ``0:0:0:0:0:0:0:1``), a port that exists."""
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"{value!r} has no valid host (expected HOST:PORT)")
    if not 0 < port < 65536:
        raise ValueError(f"{value!r} has no valid port (1 to 65535)")
    if ":" in host:
        try:
            host = str(ipaddress.IPv6Address(host))
        except ValueError:
            raise ValueError(f"{value!r}: {host!r} is not an IPv6 address") from None
    elif is_literal(host):
        host = str(ipaddress.ip_address(host))
    return host, port


def parse_nodes(spec: NodeSpec, env: dict[str, str] | None = None) -> list[Addr]:
    """Every node ``spec`` names, in order, without repeats. None: ``ROOST_NODES``, then the default."""
    source = ""
    if spec is None:
        spec = (os.environ if env is None else env).get(ENV) or DEFAULT_NODES
        source = f"{ENV}: " if spec != DEFAULT_NODES else ""
    items: Iterable[Any] = spec.split(",") if isinstance(spec, str) else [spec] if _is_addr(spec) else spec
    out: list[Addr] = []
    try:
        for item in items:
            if isinstance(item, str):
                addr = parse_node(item)
            elif _is_addr(item):
                addr = checked(item[0].strip("[]"), item[1], item)
            else:
                raise ValueError(f"a node is HOST:PORT or (host, port), not {item!r}")
            if addr not in out:
                out.append(addr)
    except ValueError as exc:
        raise ValueError(f"{source}{exc}") from None
    if not out:
        raise ValueError("no node address given")
    return out


def _is_addr(x: Any) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and type(x[1]) is int


def is_literal(host: str) -> bool:
    """An IP address needs no resolution (and must not wait for a resolver)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def ordered(infos: Iterable[tuple[Any, ...]]) -> list[Addr]:
    """The UDP addresses of ``getaddrinfo`` results: IPv4 first, each once."""
    out: list[Addr] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        for fam, _type, _proto, _name, sockaddr in infos:
            addr = (str(sockaddr[0]), int(sockaddr[1]))
            if fam == family and addr not in out:
                out.append(addr)
    return out


def family(addr: Addr) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr[0] else socket.AF_INET


def hostport(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 literal in brackets (what parse_nodes and configs read back)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def show(addrs: Sequence[Addr]) -> str:
    return ", ".join(hostport(h, p) for h, p in addrs)
