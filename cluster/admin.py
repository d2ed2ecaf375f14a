"""``roost cluster join`` and ``leave``: membership requests to a running member, and what they move.

A request goes over the member's peer port (TCP), authenticated like a peer: the handshake of
cluster/peerwire.py with the cluster secret, under the id ``@admin``, which no member may have.
Then one JOIN or LEAVE frame, answered by ADMIN_REPLY ``[ok, message, roster]``
(cluster/joining.py). Blocking sockets: the CLI makes one request and exits.
"""

from __future__ import annotations

import hmac
import os
import socket
from typing import Any

from roost.client import ring
from roost.cluster.config import ClusterConfig
from roost.cluster.peerwire import (
    ADMIN,
    NONCE_LEN,
    PROTOCOL,
    FrameDecoder,
    PeerProtocolError,
    PeerType,
    check_challenge_untrusted,
    encode,
    mac,
)  # fmt: skip
from roost.cluster.roster import Addr, Roster, decode_untrusted_roster

__all__ = ["AdminError", "moved_report", "request", "roster_from"]


class AdminError(RuntimeError):
    """The request could not be made, or the member refused it (the message says which)."""


def request(cc: ClusterConfig, peer_addr: Addr, frame: list[Any], timeout: float = 10.0) -> tuple[str, list[Any]]:
    """One admin request; (the member's message, its roster after it). AdminError otherwise."""
    s = cc.settings
    shape = f"partitioned/{s.partitions}/{s.replicas}" if s.mode == "partitioned" else s.mode
    secret = s.secret.encode()
    where = f"{peer_addr[0]}:{peer_addr[1]}"
    try:
        with socket.create_connection(peer_addr, timeout=timeout) as sock:
            decoder = FrameDecoder(s.max_frame)

            def read() -> list[Any]:
                while (f := decoder.next_frame_untrusted()) is None:
                    data = sock.recv(65536)
                    if not data:
                        raise AdminError(f"{where} closed the connection (wrong secret, or another cluster?)")
                    decoder.feed(data)
                return f

            nonce = os.urandom(NONCE_LEN)
            sock.sendall(encode([PeerType.HELLO, PROTOCOL, ADMIN, nonce, shape]))
            member, their_nonce, their_mac = check_challenge_untrusted(read(), shape)
            if not hmac.compare_digest(their_mac, mac(secret, b"L", nonce, their_nonce, member, ADMIN)):
                raise AdminError(f"{where} failed authentication: is [cluster] secret the same?")
            sock.sendall(encode([PeerType.AUTH, mac(secret, b"D", their_nonce, nonce, ADMIN, member)]))
            sock.sendall(encode(frame))
            reply = read()
    except PeerProtocolError as exc:
        raise AdminError(f"{where}: {exc}") from None
    except OSError as exc:
        raise AdminError(f"cannot reach member at {where} (peer port): {exc.strerror or exc}") from None
    if reply[0] != PeerType.ADMIN_REPLY or len(reply) != 4 or reply[1].__class__ is not bool:
        raise AdminError(f"{where} answered with an unexpected frame")
    if not reply[1]:
        raise AdminError(f"{member} refused: {reply[2]}")
    return str(reply[2]), reply[3]


def roster_from(cc: ClusterConfig, entries: list[Any]) -> Roster:
    """The roster a member answered with, on the config's base."""
    return Roster.of(cc.members, decode_untrusted_roster(entries))


def moved_report(cc: ClusterConfig, before: list[str], after: list[str]) -> str:
    """What a change of members moves, against the ideal (P/N of the larger membership for a
    join; the member's own share for a leave): primaries and partition copies streamed."""
    s = cc.settings
    p, r = s.partitions, s.replicas
    a = ring.assign(before, p, r)
    b = ring.assign(after, p, r)
    primaries, copies = ring.moved(a, b)
    if len(after) > len(before):  # a join
        ideal_p = ideal_c = p / len(after)
        what = f"join of {(set(after) - set(before)).pop()}"
    else:
        gone = (set(before) - set(after)).pop()
        ideal_p = sum(1 for o in a if o and o[0] == gone) or 1
        ideal_c = sum(1 for o in a if gone in o) or 1
        what = f"leave of {gone}"
    if len(after) > len(before):
        ideal_c = ideal_p * min(r, len(after))
    return (f"{what}: {primaries} primaries moved (ideal {ideal_p:.1f}, ratio {primaries / ideal_p:.2f}); "
            f"{copies} partition copies streamed (ideal {ideal_c:.1f}, ratio {copies / ideal_c:.2f}); "
            f"P = {p}, replicas = {r}, members {len(before)} -> {len(after)}")  # fmt: skip


def resolve_peer(cc: ClusterConfig, text: str) -> Addr:
    """A member given by its client or peer address (as in the config); any other address is
    taken for a peer address (a member that joined is not in the config)."""
    from roost.node.config import parse_hostport

    try:
        addr = parse_hostport(text)
    except ValueError as exc:
        raise AdminError(f"--seed {text!r}: {exc}") from None
    for m in cc.members:
        if addr in (m.client_addr, m.peer_addr):
            return m.peer_addr
    return addr


def join_request(member: str, client: Addr, peer: Addr) -> list[Any]:
    return [PeerType.JOIN, member, list(client), list(peer)]


def leave(cc: ClusterConfig, member: str) -> tuple[str, list[str], str]:
    """Ask the first member of the config that answers to take ``member``'s leave; (its message,
    the members before the leave, the member that took it)."""
    errors = []
    for m in sorted(cc.members, key=lambda m: m.id == member):  # (the leaver itself last)
        try:
            message, entries = request(cc, m.peer_addr, [PeerType.LEAVE, member])
        except AdminError as exc:
            if "refused" in str(exc):
                raise
            errors.append(str(exc))
            continue
        # (the roster after the leave, and the leaver: it may have joined, so not be in the base)
        before = sorted({*roster_from(cc, entries).members(), member})
        return message, before, m.id
    raise AdminError("no member of the config answered: " + "; ".join(errors))
