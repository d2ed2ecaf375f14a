"""Stateless address validation cookies (DTLS HelloVerifyRequest, QUIC Retry).

UDP source addresses are spoofable, so a node fans messages out to an address
only after the client proved it receives there: it echoes a cookie the node
sent to that address. The cookie is an HMAC over (address, client id, time
bucket) with a node secret, so checking it needs no per-address state and a
flood of spoofed HELLOs costs the node no memory. A cookie is valid for the
bucket it was made in and the one after, i.e. between one and two lifetimes.
"""

from __future__ import annotations

import hashlib
import hmac

from roost.client.wire import COOKIE_LEN

Addr = tuple[str, int]


class CookieJar:
    def __init__(self, secret: bytes, lifetime: float) -> None:
        self._secret = secret
        self._lifetime = lifetime
        # Cookies already proven valid, with the last bucket they are valid in.
        # Only a valid cookie gets in, so spoofed traffic cannot fill it.
        self._proven: dict[tuple[Addr, bytes, bytes], int] = {}

    def _make(self, addr: Addr, client_id: bytes, bucket: int) -> bytes:
        msg = f"{addr[0]}|{addr[1]}|".encode() + client_id + bucket.to_bytes(8, "big", signed=True)
        return hmac.new(self._secret, msg, hashlib.sha256).digest()[:COOKIE_LEN]

    def issue(self, addr: Addr, client_id: bytes, now: float) -> bytes:
        return self._make(addr, client_id, int(now // self._lifetime))

    def check(self, addr: Addr, client_id: bytes, cookie: bytes, now: float) -> bool:
        bucket = int(now // self._lifetime)
        key = (addr, client_id, cookie)
        last = self._proven.get(key)
        if last is not None:
            return bucket <= last
        for b in (bucket, bucket - 1):
            if hmac.compare_digest(cookie, self._make(addr, client_id, b)):
                if len(self._proven) >= 100_000:
                    self._proven.clear()
                self._proven[key] = b + 1
                return True
        return False

    def is_fresh(self, addr: Addr, client_id: bytes, cookie: bytes, now: float) -> bool:
        """True if the cookie is from the current bucket (no refresh needed)."""
        return hmac.compare_digest(cookie, self.issue(addr, client_id, now))
