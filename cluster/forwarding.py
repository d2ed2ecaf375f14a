"""Messages a member forwards to another partition's primary (partitioned mode; sans-IO).

Theory of operation. A member that accepts a publish for a partition it is not
primary of (a text client, or a binary client whose home it is) forwards the
message over its peer link to the primary (docs/cluster.md, "Routing"). One
:class:`ForwardQueue` per destination member holds them:

* reliable messages wait in ``pending`` and go out in FORWARD frames, a window
  of frames in flight, each acknowledged by FWDACK; a link that drops puts what
  was in flight back in front, in order (the primary may have delivered it
  already: it drops the resend by producer id and sequence, node/delivery.py
  ``_fwd_seen``; leaving it to the subscribers' de-duplication handed it, late,
  to a subscription that reached the primary in between: seeds 5317, 7386);
* fire messages go out at once if the link is up and are dropped otherwise
  (fire is at most once: they are never sent twice);
* the receiver delivers what it owns and refuses the rest (FWDACK lists them:
  its map differs from ours for a moment); refused messages are ``parked`` and
  routed again at the next heartbeat or map change, so a message stays with
  the member that accepted it from its publisher until an owner has it;
* when the map changes, :meth:`take` hands the member everything not yet
  acknowledged (all of it if the destination is gone, the unsent and parked
  part otherwise), oldest first, to route again by the new map.

A reliable message is acknowledged to its publisher only once a primary has it
(FWDACK, node/delivery.py ``_unsettled``): the client library moves a topic to a
new primary once the old route acknowledged everything, so nothing sent
straight to the new primary overtakes what waits here. A queue holds at most
``max_queue`` reliable messages; beyond that new ones are dropped, counted and
logged (``forward_overflow``), and acknowledged as given up.
"""

from __future__ import annotations

from collections import deque
from typing import Any

Msg = list[Any]  # [topic, key, tags, payload, producer id | None, sequence | None]


class ForwardQueue:
    def __init__(self, max_queue: int, max_bytes: int = 1 << 22, chunk: int = 256, window: int = 8) -> None:
        """A FORWARD frame holds at most ``chunk`` messages and about ``max_bytes`` (half of
        the peer link's max_frame: 256 messages of 64 KB would not fit one)."""
        self.max_queue = max_queue
        self.max_bytes = max_bytes
        self.chunk = chunk
        self.window = window
        self.pending: deque[Msg] = deque()
        self.inflight: dict[int, list[Msg]] = {}
        self.parked: list[Msg] = []  # refused by the receiver: to route again
        self.next_id = 1

    def __len__(self) -> int:
        return len(self.pending) + len(self.parked) + sum(len(b) for b in self.inflight.values())

    def add(self, msgs: list[Msg]) -> list[Msg]:
        """Queue reliable messages (a caller sends fire ones itself, once); returns those
        dropped for want of room."""
        room = max(self.max_queue - len(self), 0)
        dropped = msgs[room:]
        self.pending.extend(msgs[:room])
        return dropped

    def next_frame(self) -> tuple[int, list[Msg]] | None:
        """The next FORWARD to send, if the window allows one."""
        if not self.pending or len(self.inflight) >= self.window:
            return None
        n = min(self.chunk, len(self.pending))
        pending, limit = self.pending, self.max_bytes
        batch = [pending.popleft()]
        size = len(batch[0][3]) + 256  # (a payload and about its topic, key and tags)
        while len(batch) < n and size + len(pending[0][3]) + 256 <= limit:
            size += len(pending[0][3]) + 256
            batch.append(pending.popleft())
        fid = self.next_id
        self.next_id += 1
        self.inflight[fid] = batch
        return fid, batch

    def acked(self, fid: int, refused: list[int]) -> list[Msg]:
        """FWDACK: the receiver delivered the frame's messages but those it ``refused``;
        returns the delivered ones (none for a frame no longer in flight: taken back)."""
        batch = self.inflight.pop(fid, None)
        if batch is None:
            return []
        no = set(refused)
        self.parked.extend(batch[i] for i in sorted(no) if i < len(batch))
        return [m for i, m in enumerate(batch) if i not in no]

    def disconnected(self) -> None:
        """The link dropped: what was in flight goes back to the front, in order."""
        for fid in sorted(self.inflight, reverse=True):
            self.pending.extendleft(reversed(self.inflight[fid]))
        self.inflight.clear()

    def take(self, everything: bool) -> list[Msg]:
        """Messages to route again: the unsent ones, and those in flight too if
        ``everything`` (the destination is no longer live)."""
        if everything:
            self.disconnected()
        out = self.parked + list(self.pending)  # (oldest first: parked ones were sent before)
        self.pending.clear()
        self.parked = []
        return out
