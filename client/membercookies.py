"""The cookies a client session holds for the members other than its own node (sans-IO).

Every member keys its address-validation cookies with a key of its own (node/cookies.py),
so a cookie is valid only at the member that issued it. A session talks to one node, but in a
replicated cluster every member delivers what was published at it, and the session
acknowledges each member's stream at that member: the ACK must carry that member's cookie.
The session asks for it with a HELLO of its own there (HELLO is stateless at the member, and
its WELCOME is the cookie); an ACK waits until the cookie comes, or until the member has
not answered for ``node_timeout`` (it is gone: the ACK counts as sent and lost, and a
retransmission of the member, should it come, asks again).

Keys rotate every ``cookie_lifetime`` at wall-clock time boundaries, the same on every member
within their clock skew, and a cookie stays valid one to two lifetimes. When our node's
cookie changes (a PONG brings a new one: its key rotated), the session asks every member it
holds a cookie of for a new one, while the old one is still accepted. A member whose clock is
behind ours has not rotated yet and answers with the cookie we hold: we ask again every
``hello_retry`` until the answer differs (or, after :data:`RENEW_TRIES`, leave it to the
member's refusal, BAD_COOKIE, which makes the ACK wait for a new cookie). A member that
answers none of a renewal's HELLOs is gone (it left, or its address is another's now): its
cookie is forgotten, so that a session does not ask every member it ever met at every rotation.
"""

from __future__ import annotations

from roost.client import wire

Addr = tuple[str, int]

#: How many times a renewal asks again (every ``hello_retry`` at most, paced by the session's
#: turns) before it leaves the cookie to expire: covers a member's clock a few seconds behind.
RENEW_TRIES = 8
_NEVER = -1e18


class MemberCookies:
    def __init__(self, client_id: bytes, retry: float, give_up: float) -> None:
        self.cid = client_id
        self.retry = retry  # (ClientConfig.hello_retry)
        self.give_up = give_up  # (ClientConfig.node_timeout)
        self.held: dict[Addr, bytes] = {}  # member's client address -> its cookie for us
        self.renewing: dict[Addr, int] = {}  # renewals under way: tries left
        self._asked: dict[Addr, float] = {}  # when we last said HELLO to it
        self._waiting: dict[Addr, float] = {}  # since when an ACK waits for its cookie
        self._quiet: set[Addr] = set()  # asked in a renewal, not answered yet

    def _ask(self, member: Addr, now: float, out: list[tuple[Addr, bytes]]) -> None:
        self._asked[member] = now
        out.append((member, wire.encode_hello(self.cid)))

    def on_welcome(self, member: Addr, cookie: bytes) -> None:
        """A WELCOME from a member that is not our node: its cookie, if we asked for one."""
        if member not in self._asked:
            return
        self._quiet.discard(member)
        if cookie != self.held.get(member):
            self.renewing.pop(member, None)
        self.held[member] = cookie
        self._waiting.pop(member, None)

    def refused(self, member: Addr) -> None:
        """BAD_COOKIE from the member: it restarted (new keys) or the cookie expired."""
        self.held.pop(member, None)
        self.renewing.pop(member, None)
        self._asked.pop(member, None)
        self._waiting.pop(member, None)
        self._quiet.discard(member)

    def keep(self, member: Addr, cookie: bytes) -> None:
        """The cookie of the node the session leaves: still good for acknowledging it."""
        self.held[member] = cookie

    def forget(self, member: Addr) -> None:
        """The member becomes the session's node: its cookie is the session's own from now on."""
        self.held.pop(member, None)
        self.renewing.pop(member, None)
        self._waiting.pop(member, None)  # (a wait begun before would give up at once, unasked)
        self._asked.pop(member, None)
        self._quiet.discard(member)

    def renew(self, now: float, out: list[tuple[Addr, bytes]]) -> None:
        """Our node's key rotated: ask every member we hold a cookie of for a new one."""
        for member in self.held:
            self.renewing[member] = RENEW_TRIES
            self._quiet.add(member)
            self._ask(member, now, out)

    def due(
        self, waiting: list[Addr] | None, node: Addr, now: float, out: list[tuple[Addr, bytes]]
    ) -> list[Addr] | None:
        """The HELLOs owed now: to each member an ACK waits for (``waiting``, from
        ``Receiver.acks``; our ``node``'s cookie is the session's own affair) and to each one
        whose renewal has not brought a new cookie yet, each at most every ``retry``. Returns
        the members given up on (None: none), whose ACKs the session no longer owes."""
        gone: list[Addr] | None = None
        if waiting is not None:
            for member in waiting:
                if member == node:
                    continue
                since = self._waiting.setdefault(member, now)
                if now - since >= self.give_up:
                    del self._waiting[member]
                    gone = [*(gone or []), member]
                elif now >= self._asked.get(member, _NEVER) + self.retry:
                    self._ask(member, now, out)
        if self.renewing:
            for member, left in list(self.renewing.items()):
                if now < self._asked.get(member, _NEVER) + self.retry:
                    continue
                if left > 0:
                    self.renewing[member] = left - 1
                    self._ask(member, now, out)
                else:
                    del self.renewing[member]
                    if member in self._quiet:  # (not one answer: gone)
                        self.refused(member)
        return gone
