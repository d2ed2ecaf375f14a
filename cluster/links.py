"""One peer link as the member core sees it: phase, handshake, deadline (sans-IO).

Theory of operation
-------------------
Every pair of members has two TCP links, one dialled by each side. The
dialler's link carries its requests (HEARTBEAT, PUSH, PULL, DIGEST); the other
side answers on the same connection (PUSHACK, DUMP/DUMPEND, DIFF/DIFFEND).
Before anything else, the handshake of cluster/peerwire.py proves that both
ends know the cluster secret.

Phases (the dialler on the left, the listener on the right)::

    OPENING --LinkOpened/HELLO-->  HELLO_SENT      AWAIT_HELLO --HELLO/CHALLENGE--> CHALLENGED
    HELLO_SENT --CHALLENGE ok/AUTH--> UP           CHALLENGED  --AUTH ok--> UP

    any phase --bad frame, wrong secret, deadline, LinkClosed--> closed (gone)

Until UP a link accepts only frames of HANDSHAKE_MAX_FRAME bytes, and only the
next handshake frame; its deadline is the handshake deadline. Once UP, the
deadline of an accepted link is its idle deadline (the dialler sends a
heartbeat at least every heartbeat_interval); that of a dialled link is
``down_after`` past the last frame from the peer (who answers each heartbeat
with a BEAT), so a link dead in either direction is closed and dialled again.
"""

from __future__ import annotations

import hmac
import random
from typing import Any

from roost.cluster.events import Close, SendFrame
from roost.cluster.peerwire import (
    HANDSHAKE_MAX_FRAME,
    NONCE_LEN,
    PROTOCOL,
    FrameDecoder,
    PeerProtocolError,
    PeerType,
    check_auth_untrusted,
    check_challenge_untrusted,
    check_hello_untrusted,
    encode,
    mac,
)  # fmt: skip

OPENING, HELLO_SENT, AWAIT_HELLO, CHALLENGED, UP = "opening", "hello_sent", "await_hello", "challenged", "up"


class Link:
    __slots__ = ("id", "outbound", "peer", "phase", "decoder", "nonce", "their_nonce", "deadline", "remote", "unsent")

    def __init__(self, link_id: int, outbound: bool, peer: str | None, deadline: float, remote: str = "") -> None:
        self.id = link_id
        self.outbound = outbound
        self.peer = peer  # known from the start when we dial; after HELLO when they do
        self.phase = OPENING if outbound else AWAIT_HELLO
        self.decoder = FrameDecoder(HANDSHAKE_MAX_FRAME)
        self.nonce = b""
        self.their_nonce = b""
        self.deadline = deadline
        self.remote = remote
        self.unsent = 0  # bytes of SendFrame the runner has not yet reported sent (LinkSent)

    @property
    def up(self) -> bool:
        return self.phase == UP

    def hello(self, me: str, nonce: bytes, shape: str) -> bytes:
        """The connection is open: the dialler speaks first. ``shape`` (mode,
        partitions, replicas) must be the same at both ends."""
        self.nonce = nonce
        self.phase = HELLO_SENT
        return encode([PeerType.HELLO, PROTOCOL, me, nonce, shape])

    def handshake(self, f: list[Any], secret: bytes, me: str, members: set[str], nonce: bytes, shape: str) -> bytes:
        """Take one handshake frame; returns what to answer (maybe nothing).
        Raises PeerProtocolError for anything but the expected, correct frame."""
        if self.phase == HELLO_SENT:
            pid, their_nonce, their_mac = check_challenge_untrusted(f, shape)
            assert self.peer is not None
            want = mac(secret, b"L", self.nonce, their_nonce, self.peer, me)
            if pid != self.peer or not hmac.compare_digest(their_mac, want):
                raise PeerProtocolError("peer failed authentication (wrong cluster secret?)")
            self.phase = UP
            return encode([PeerType.AUTH, mac(secret, b"D", their_nonce, self.nonce, me, self.peer)])
        if self.phase == AWAIT_HELLO:
            self.peer, self.their_nonce = check_hello_untrusted(f, members, me, shape)
            self.nonce = nonce
            self.phase = CHALLENGED
            return encode(
                [PeerType.CHALLENGE, me, nonce, mac(secret, b"L", self.their_nonce, nonce, me, self.peer), shape]
            )
        if self.phase == CHALLENGED:
            assert self.peer is not None
            got = check_auth_untrusted(f)
            if not hmac.compare_digest(got, mac(secret, b"D", self.nonce, self.their_nonce, self.peer, me)):
                raise PeerProtocolError("wrong cluster secret")
            self.phase = UP
            return b""
        raise PeerProtocolError(f"no handshake frame expected in phase {self.phase}")


class LinkTable:
    """Every link of a member, and the frames it sends on them (shared by the member's components).

    ``links`` holds each open link by id; ``out`` each peer's link that we dialled (None while
    there is none: it carries our requests and heartbeats). ``frame`` queues a frame as a
    ``SendFrame`` on the member's action list ``actions`` (shared with the member, which hands
    them to its runner after every event) and counts its bytes as unsent until ``LinkSent``."""

    __slots__ = ("links", "out", "actions", "next_id")

    def __init__(self, peers: list[str], actions: list[Any]) -> None:
        self.links: dict[int, Link] = {}
        self.out: dict[str, int | None] = dict.fromkeys(peers)
        self.actions = actions
        self.next_id = 1

    def frame(self, lid: int, data: bytes) -> None:
        self.actions.append(SendFrame(lid, data))
        lk = self.links.get(lid)
        if lk is not None:
            lk.unsent += len(data)

    def opened(self, lid: int, me: str, rng: random.Random, shape: str) -> None:
        """``LinkOpened``: on a link we dialled, we speak first (HELLO, with a fresh nonce)."""
        link = self.links.get(lid)
        if link is not None and link.outbound:
            self.frame(lid, link.hello(me, rng.randbytes(NONCE_LEN), shape))

    def accepted(self, lid: int, deadline: float, remote: str, stopping: bool) -> None:
        """``Accepted``: a link a peer dialled, awaiting its HELLO until ``deadline`` (closed at
        once if we are ``stopping``)."""
        if stopping:
            self.actions.append(Close(lid, "stopping"))
        else:
            self.links[lid] = Link(lid, False, None, deadline, remote)

    def sent(self, lid: int, nbytes: int) -> None:
        """``LinkSent``: the runner sent these bytes of the link's frames."""
        link = self.links.get(lid)
        if link is not None:
            link.unsent -= nbytes

    def up(self, peer: str) -> int | None:
        """Our dialled link to ``peer`` if it is up (what requests go on), else None."""
        lid = self.out.get(peer)
        return lid if lid is not None and self.links[lid].up else None

    def to_peers(self, frame: bytes) -> None:
        """One frame on every link we dialled that is up."""
        links = self.links
        for lid in self.out.values():
            if lid is not None and links[lid].up:
                self.frame(lid, frame)

    def drained(self, lid: int, max_frame: int) -> bool:
        """May a dump stream send more on this link? (backpressure: at most about one frame's
        worth waits in the runner's queue)"""
        link = self.links.get(lid)
        return link is not None and link.unsent < max_frame
