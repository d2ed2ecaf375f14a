"""The client's durable reads and commits, sans-IO: one core for every shell and the simulator.

Theory of operation (docs/durable.md, "Durable subscriptions")
----------------------------------------------------------------
A durable request (a GET or a COMMIT, client/durablewire.py) goes to its partition's primary
(``Router.durable_session_for``), which alone may serve it; members do not forward it. An
:class:`Ask` carries one such request until its answer comes, OK:

* ``SEND``: it picks the session of the topic's primary now (the map may have moved, so a
  request sent again may go to another member: the re-routing), clears that session's
  ``durable_replies`` and queues the frame there; with no map yet, or a session not welcomed
  yet, it waits (``WELCOME``) until the session is welcomed, the router is lost or
  ``WELCOME_WAIT`` passed, then picks again.
* ``SENT``: it waits for an answer of its kind (RECORDS or COMMITTED) with its name and
  partition. An OK ends it (``DONE``); a refusal (not the leader yet, busy), or no answer
  within 5 x ``pub_retry``, makes it pause ``pub_retry`` (``PAUSE``) and send again.

A :class:`Reader` is one durable subscription's reads in one process: a GET asks from the
offset read to (``nxt``, what this process was given and has not committed, which the primary
takes when it is past the cursor); the records of its answer at or past ``nxt`` go to the
application, and ``nxt`` moves to how far the primary scanned (a record given before and not
committed yet comes again after a resend, and is dropped by its offset); a COMMIT moves the
cursor to ``nxt``. :class:`DurableClient` keeps, per (client, name, topic), the offset read
to across the calls of a process.

Nothing here waits or sends: the shells (client/durableapi.py's async calls, the simulator's
consumer in sim/durable.py) call ``step(now)`` when a datagram came or a deadline passed, send
what the sessions queued, and wait until ``ready()`` or ``next_deadline()``.

Deliberately broken builds (``ClientConfig.breaks``, the simulator's ``--break``):
``commit-before-read``, a reader that commits what a GET answered before the application has
it (the auto-commit mistake: a crash in between loses those records).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

from roost.client import durablewire
from roost.client.router import Router
from roost.client.session import ClientConfig, ClientSession
from roost.client.wire import FrameType

#: How long a request waits for a session's WELCOME (or the map) before it looks again (s)
WELCOME_WAIT = 1.0
#: A request resent after this many ``pub_retry`` without an answer
ANSWER_WAIT = 5

# An Ask's states (see the module)
SEND, WELCOME, SENT, PAUSE, DONE = range(5)

Record = tuple[int, int, str, str | None, dict[str, str] | None, bytes]  # (offset, ms, topic, key, tags, payload)


def durable_id(client: str) -> bytes:
    """The 16-byte id of a durable subscriber named ``client``: the same in every process."""
    return hashlib.blake2b(client.encode(), digest_size=16, person=b"roost.durable").digest()


def no_map_here(s: ClientSession) -> bool:
    """The node welcomed this session and announced no cluster map: not a partitioned cluster
    (a partitioned member installs its map before it serves clients, and its WELCOME carries
    the map or, when that does not fit, its epoch)."""
    return s.cookie is not None and not s.announced


class Ask:
    """One durable request to its partition's primary, sent again until it is answered OK (see the module)."""

    __slots__ = ("router", "topic", "want", "name", "p", "make", "retry", "state", "due", "session", "answer")

    def __init__(self, router: Router, topic: str, want: FrameType, name: str, p: int,
                 make: Callable[[ClientSession], bytes], now: float) -> None:  # fmt: skip
        self.router, self.topic, self.want, self.name, self.p, self.make = router, topic, want, name, p, make
        self.retry = router.cfg.pub_retry
        self.state = SEND
        self.due = now
        self.session: ClientSession | None = None
        self.answer: tuple[Any, ...] | None = None  # the OK answer, once DONE

    @property
    def done(self) -> bool:
        return self.state == DONE

    @property
    def lost(self) -> bool:
        """Waiting for a session of a router that lost its nodes (the library raises NodeLost)."""
        return self.state == WELCOME and self.router.lost

    def _found(self) -> tuple[Any, ...] | None:
        s = self.session
        if s is None:
            return None
        want, name, p = self.want, self.name, self.p
        return next((f for f in s.durable_replies if f[0] is want and f[1] == name and f[2] == p), None)

    def ready(self) -> bool:
        """Something for ``step`` to do before its deadline: an answer came, or the session it
        waits for was welcomed (or the router lost its nodes)."""
        if self.state == SENT:
            return self._found() is not None
        if self.state == WELCOME:
            r = self.router
            return r.lost or (r.cmap is not None and self.session is not None and self.session.cookie is not None)
        return self.state == SEND

    def next_deadline(self) -> float:
        return math.inf if self.state == DONE else self.due

    def step(self, now: float) -> bool:
        """Advance on what came and on ``now``; True when it queued its frame on a session (the
        shell sends it now)."""
        st = self.state
        if st == DONE:
            return False
        if st == SENT:
            got = self._found()
            if got is not None:
                status = got[5 if self.want is FrameType.RECORDS else 4]
                if status == 0:  # (OK)
                    self.state, self.answer, self.due = DONE, got, math.inf
                    return False
                st, self.due = PAUSE, now + self.retry  # (refused: not the leader yet, or busy)
                if status == durablewire.PUT_NO_QUORUM and self.session is not None:
                    self.router.ask_elsewhere(self.session.node_id, now)  # (its map may name its own side)
            elif now >= self.due:
                st, self.due = PAUSE, now + self.retry  # (no answer in time)
                if self.session is not None:  # (its member may be down, and our map not know it yet)
                    self.router.ask_elsewhere(self.session.node_id, now)
            else:
                return False
        elif st == WELCOME:
            if not self.ready() and now < self.due:
                return False
            st = SEND
        if st == PAUSE:
            self.state = PAUSE
            if now < self.due:
                return False
        r = self.router
        s = r.durable_session_for(self.topic) if r.cmap is not None else r.first
        self.session = s
        if r.cmap is None or s.cookie is None:
            self.state, self.due = WELCOME, now + WELCOME_WAIT
            return False
        s.durable_replies.clear()
        s.queue_raw([self.make(s)])
        self.state, self.due = SENT, now + ANSWER_WAIT * self.retry
        return True


class Reader:
    """One durable subscription's GETs and COMMITs in one process (see the module).

    ``get(most, now)`` or ``commit(now)`` starts a round; ``step(now)`` advances it, ``busy``
    says whether it goes on. A GET round ends with the records at or past the offset read to
    in ``take()``; a COMMIT round with ``committed`` (True: the cursor is at least there)."""

    def __init__(self, core: DurableClient, router: Router, key: tuple[str, str, str], did: bytes, p: int,
                 start: tuple[int, int], nxt: int) -> None:  # fmt: skip
        self.core, self.router, self.key, self.did, self.p = core, router, key, did, p
        self.nxt = nxt  # the offset read to: what a GET asks from and a COMMIT moves the cursor to
        self.name, self.topic = key[1], key[2]
        self.kind, self.at = start
        self.ask: Ask | None = None
        self.got: list[Record] = []  # records of the last GET round, for the application
        self.held: list[Record] = []  # (commit-before-read: records that wait for their COMMIT's answer)
        self.at_end = False  # the last GET's answer had no records and the primary scanned to its commit
        self.committed = False
        self.offset = 0  # what the COMMIT under way moves the cursor to

    @property
    def busy(self) -> bool:
        return self.ask is not None

    def get(self, most: int, now: float) -> None:
        """Start a GET of up to ``most`` records from the offset read to."""
        nxt, did, name, topic, p, kind, at = self.nxt, self.did, self.name, self.topic, self.p, self.kind, self.at

        def make(s: ClientSession) -> bytes:
            return durablewire.encode_get(s.cid, s.cookie or b"", did, name, topic, p, kind, at, most, nxt)

        self.got, self.at_end = [], False
        self.ask = Ask(self.router, topic, FrameType.RECORDS, name, p, make, now)

    def commit(self, now: float) -> None:
        """Start a COMMIT of the offset read to."""
        offset, did, name, topic, p = self.nxt, self.did, self.name, self.topic, self.p

        def make(s: ClientSession) -> bytes:
            return durablewire.encode_commit(s.cid, s.cookie or b"", did, name, topic, p, offset)

        self.offset, self.committed = offset, False
        self.ask = Ask(self.router, topic, FrameType.COMMITTED, name, p, make, now)

    def step(self, now: float) -> bool:
        """Advance the round; True when a frame was queued (the shell sends it now)."""
        ask = self.ask
        if ask is None:
            return False
        sent = ask.step(now)
        f = ask.answer
        if f is None:
            return sent
        self.ask = None
        if ask.want is FrameType.COMMITTED:
            self.committed = f[3] >= self.offset
            self.got, self.held = self.held, []
            return sent
        nxt = self.nxt
        new: list[Record] = [tuple(rec) for rec in f[6] if rec[0] >= nxt]  # type: ignore[misc]
        self.nxt = self.core.read_to[self.key] = max(nxt, f[4])
        self.at_end = not f[6] and f[4] >= f[8]
        if self.core.commit_before_read and new:
            self.held = new  # (broken: the cursor moves past them before the application has them)
            self.commit(now)
            return self.step(now) or sent
        self.got = new
        return sent

    def take(self) -> list[Record]:
        """The records the last GET round gave the application (once)."""
        got, self.got = self.got, []
        return got

    def ready(self) -> bool:
        return self.ask is not None and self.ask.ready()

    def next_deadline(self) -> float:
        return self.ask.next_deadline() if self.ask is not None else math.inf


class DurableClient:
    """A process's durable reads: the offset each durable subscription (client, name, topic) was
    read to here, and the readers and plain reads over a router (see the module)."""

    def __init__(self, config: ClientConfig) -> None:
        self.cfg = config
        self.read_to: dict[tuple[str, str, str], int] = {}
        self.commit_before_read = "commit-before-read" in config.breaks

    def reader(self, router: Router, client: str, name: str, topic: str, p: int, *, did: bytes | None = None,
               start: tuple[int, int] = (durablewire.START_EARLIEST, 0), nxt: int | None = None) -> Reader:  # fmt: skip
        """The reader of durable subscription (``client``, ``name``) on ``topic`` (partition ``p``),
        from the offset read to in this process (``nxt`` if none yet: an offsets file's, else 0)."""
        key = (client, name, topic)
        at = self.read_to.get(key, 0 if nxt is None else nxt)
        return Reader(self, router, key, durable_id(client) if did is None else did, p, start, at)

    def read(self, router: Router, topic: str, p: int, offset: int, count: int, now: float) -> Ask:
        """A plain read of committed records from ``offset``: no durable subscription, no cursor."""
        zero = b"\0" * 16

        def make(s: ClientSession) -> bytes:
            return durablewire.encode_get(s.cid, s.cookie or b"", zero, "", topic, p, 0, 0, count, offset)

        return Ask(router, topic, FrameType.RECORDS, "", p, make, now)
