"""Stateless address validation cookies (DTLS HelloVerifyRequest, QUIC Retry).

UDP source addresses are spoofable, so a node fans messages out to an address
only after the client proved it receives there: it echoes a cookie the node
sent to that address. The cookie is an HMAC over (address, client id) with a
key of this node's own, so checking it needs no per-address state and a flood
of spoofed HELLOs costs the node no memory.

The key is random key material drawn from the core's ``rng`` (the shell's
``random.SystemRandom()``), never the cluster secret: whoever holds the peer
secret (every member, an operator's shell) could otherwise mint a cookie for
any address at every member. No one else can compute this node's key, not even
another member, so each member's cookies are valid at that member only (a
client that fails over says HELLO there first, as it always did).

The key is replaced every ``cookie_lifetime`` (time buckets of that length), and
the one before it is still accepted: a cookie is valid in the bucket it was made
in and the next, i.e. between one and two lifetimes. Keys are drawn when a
bucket is first used, so a node that was idle for longer than that forgets both.
A restarted node draws new keys: its clients hear BAD_COOKIE and say HELLO again.
"""

from __future__ import annotations

import hashlib
import hmac
import random

from roost.client.wire import COOKIE_LEN

Addr = tuple[str, int]
Proven = dict[tuple[Addr, bytes, bytes], None]

KEY_LEN = 32
#: Cookies remembered as proven, per key: a hit spares an HMAC on every datagram. Only a valid
#: cookie gets in (spoofed traffic cannot fill it), and a full cache is dropped, not grown.
MAX_PROVEN = 100_000


class CookieJar:
    def __init__(self, rng: random.Random, lifetime: float) -> None:
        self._rng = rng
        self._lifetime = lifetime
        self._bucket: int | None = None  # the bucket the current key was drawn for
        self._key = b""
        self._previous: bytes | None = None  # the key of the bucket before, still accepted
        # Cookies already proven valid under the current and the previous key.
        self._proven: Proven = {}
        self._proven_previous: Proven = {}

    def _rotate(self, now: float) -> None:
        """Draw the key of ``now``'s bucket if it is a later one. Time that goes back (a wall
        clock stepped back) keeps the current key: cookies then live longer, never shorter."""
        bucket = int(now // self._lifetime)
        if self._bucket is not None and bucket <= self._bucket:
            return
        follows = self._bucket is not None and bucket == self._bucket + 1
        self._previous = self._key if follows else None
        self._proven_previous = self._proven if follows else {}
        self._key = self._rng.randbytes(KEY_LEN)
        self._proven = {}
        self._bucket = bucket

    @staticmethod
    def _make(key: bytes, addr: Addr, client_id: bytes) -> bytes:
        msg = f"{addr[0]}|{addr[1]}|".encode() + client_id
        return hmac.new(key, msg, hashlib.sha256).digest()[:COOKIE_LEN]

    def issue(self, addr: Addr, client_id: bytes, now: float) -> bytes:
        self._rotate(now)
        return self._make(self._key, addr, client_id)

    def check(self, addr: Addr, client_id: bytes, cookie: bytes, now: float) -> bool:
        self._rotate(now)
        entry = (addr, client_id, cookie)
        if entry in self._proven or entry in self._proven_previous:
            return True
        if hmac.compare_digest(cookie, self._make(self._key, addr, client_id)):
            proven = self._proven
        elif self._previous is not None and hmac.compare_digest(cookie, self._make(self._previous, addr, client_id)):
            proven = self._proven_previous
        else:
            return False
        if len(proven) >= MAX_PROVEN:
            proven.clear()
        proven[entry] = None
        return True

    @property
    def remembered(self) -> int:
        """Cookies held as proven (both keys'): at most 2 * MAX_PROVEN."""
        return len(self._proven) + len(self._proven_previous)

    def is_fresh(self, addr: Addr, client_id: bytes, cookie: bytes, now: float) -> bool:
        """True if the cookie is from the current key (no refresh needed)."""
        return hmac.compare_digest(cookie, self.issue(addr, client_id, now))
