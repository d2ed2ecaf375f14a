"""The client's protocol state machine, sans-IO (:class:`ClientSession`).

One session talks to one node at a time. This module holds what ties the
parts together: the API the shells call, the dispatch of incoming frames, the
handshake (HELLO/WELCOME cookie), liveness (PING while connected; the next
member when the node has been silent for ``node_timeout``, ``node_lost`` once
every member was tried) and the subscriptions' life (confirmed, refused,
cancelled, timed out). The parts it drives live next to it:

- ``client/commands.py``: ordered SUB/UNSUB batches, one in flight;
- ``client/receive.py``: reliable receive streams and producer de-duplication;
- ``client/publisher.py``: producer sequences, the window, go-back-N retry.

Inputs: API calls, datagrams and ticks, each with ``now``. Outputs:
:meth:`ClientSession.outgoing` (datagrams to send), per-subscription queues of messages
(``receive.SubState``: made a :class:`Message` by ``SubState.take`` when taken), and
:attr:`ClientSession.events`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roost.client import decoding, wire
from roost.client import decoding as D
from roost.client.commands import MAX_BATCH, CommandBatches
from roost.client.config import ClientConfig
from roost.client.membercookies import MemberCookies
from roost.client.publisher import Publisher
from roost.client.receive import Message, Receiver, SubKey, SubState
from roost.client.subjects import is_plain, parse_filter_untrusted
from roost.client.wire import ErrorCode, FrameType, Mode, Op, Reason, WireError

if TYPE_CHECKING:
    from roost.client.clustermap import ClusterMap

#: Addresses a session keeps to fail over to and hear from (a cluster map names at most a few
#: dozen members; a spoofed WELCOME must not make it grow).
MAX_CANDIDATES = 256

__all__ = ["Addr", "ClientConfig", "ClientSession", "Message", "SubState"]

Addr = tuple[str, int]


class ClientSession:
    def __init__(
        self, client_id: bytes, producer_id: bytes, fire_producer_id: bytes,
        config: ClientConfig, now: float, node: Addr = ("127.0.0.1", 7400),
        members: list[Addr] | None = None, session: int = 0,
    ) -> None:  # fmt: skip
        """``session`` names this client process in every command batch (the
        shells pass Unix milliseconds), so a node can tell a restarted process
        that reuses its client id from a late retry of the old one."""
        self.cid = client_id
        self.cfg = config
        self.ping_interval = config.ping_interval
        self.node: Addr = node  # the node we talk to now
        # Every node we know of, in failover order; WELCOME's cluster map adds more.
        self.candidates: list[Addr] = [node, *dict.fromkeys(m for m in members or [] if m != node)]
        self._known = set(self.candidates)  # (the same, for the check of every datagram's source)
        self._configured = len(self.candidates)  # (the first ones: given, never dropped)
        self.cookie: bytes | None = None
        # The cookies of the other members that deliver to us, for our ACKs (each member keys its own)
        self.member_cookies = MemberCookies(client_id, config.hello_retry, config.node_timeout)
        self.node_id: str | None = None
        self.members: list[tuple[str, str, int]] = []
        self.last_heard = now
        self.next_hello = now
        self.next_ping = now
        self.ping_token = 0
        self.confirmed_token = 0  # ping token current when a CMDACK last arrived
        self.ping_digest = 0  # subs_digest sent with the PING of ``ping_token`` (0: not checking)
        self.syncs = 0
        self.lost = False
        self.failed_attempts = 0  # nodes tried in a row without an answer
        self.failovers = 0
        self.bad_datagrams = 0  # from our nodes' addresses but not a valid frame
        self.events: list[tuple[Any, ...]] = []
        self.last_status: dict[str, Any] | None = None
        # Partitioned clusters: the newest cluster map our members gave us (WELCOME, REDIRECT);
        # client/router.py routes by it. A session itself always talks to one member.
        self.cmap: ClusterMap | None = None
        self.heard_map: ClusterMap | None = None  # the last map our member sent, of any epoch (the router's)
        self.announced = 0  # the map epoch our member's WELCOME announced (the router's)
        self.params: dict[str, Any] = {}  # of our node's last WELCOME
        self._map_asked = -1e9  # when we last asked for the map (MAP): a stranger spoke, or a WELCOME announced one
        self._out: list[tuple[Addr, bytes]] = []
        self.putacks: list[tuple[bytes, int, int, int]] = []  # PUTACKs for the router (client/putter.py)
        self.durable_replies: list[tuple[Any, ...]] = []  # RECORDS and COMMITTED for the library's get
        self.subs: dict[SubKey, SubState] = {}
        self._leaving: dict[SubKey, SubState] = {}  # group subscriptions unsubscribed, UNSUB not yet acknowledged
        # UNSUBs sent for cancellations of subscriptions we did not hold (each once: node/PONG repeats)
        self._cancels_told: dict[tuple[int, str, str | None, int], None] = {}
        self.cmds = CommandBatches(session, config.cmd_retry)
        self.recv = Receiver(self.subs, self.events, config)
        self.pub = Publisher(producer_id, fire_producer_id, config)

    # ------------------------------------------------------------ API

    @property
    def connected(self) -> bool:
        return self.cookie is not None

    @property
    def session(self) -> int:
        return self.cmds.session

    @property
    def max_datagram(self) -> int:
        return self.pub.max_datagram

    @property
    def duplicates(self) -> int:
        """Reliable messages received again and dropped (retransmits, failover resends)."""
        return self.recv.duplicates

    @property
    def acked(self) -> int:
        """Highest reliable producer sequence the node acknowledged."""
        return self.pub.acked

    @property
    def last_seq(self) -> int:
        """The producer sequence of the last reliable publish (0: none yet)."""
        return self.pub.next_seq - 1

    @property
    def window_full(self) -> bool:
        return self.pub.window_full

    def flushed(self, through: int) -> bool:
        """Reliable publishes through ``through`` acknowledged, every command
        acknowledged, every fire publish sent and every acknowledgement we owe sent."""
        return (self.pub.acked >= through and self.cmds.idle and not self.pub.fire_unsent
                and not any(rs.need_ack for rs in self.recv.streams.values()))  # fmt: skip

    def subscribe(self, topic: str, key: str | None, mode: int) -> SubState:
        """``topic``: a topic or a filter (client/subjects.py), the subscription's name."""
        wire.check_filter(topic)
        wire.check_key(key)
        grouped = not is_plain(topic) and parse_filter_untrusted(topic).queue is not None
        st = SubState(topic, mode, grouped)
        self._cancels_told.pop((Op.UNSUB, topic, key, Mode.FIRE), None)  # (a new one may be cancelled again)
        old = self.subs.get((topic, key))
        if old is not None and old.reason is None:
            old.reason = Reason.UNSUBSCRIBED  # replaced: last command wins
            self.recv.detach(old)
        if old is None and not is_plain(topic):
            self.recv.track(topic, 1)
            if grouped:
                self.recv.marked[wire.mark_id(topic, key)] = (topic, key)
        self.subs[(topic, key)] = st
        self.cmds.add((Op.SUB, topic, key, mode))
        return st

    def _drop(self, topic: str, key: str | None) -> SubState | None:
        """Take a subscription out of the map (ended, refused, unsubscribed)."""
        st = self.subs.pop((topic, key), None)
        if st is not None and not is_plain(topic):
            self.recv.track(topic, -1)
            self.recv.marked.pop(wire.mark_id(topic, key), None)
        return st

    def unsubscribe(self, topic: str, key: str | None) -> None:
        st = self._drop(topic, key)
        if st is not None and st.reason is None:
            st.reason = Reason.UNSUBSCRIBED
            # (a queue group's messages not taken are acknowledged only once the node has the
            # UNSUB, which hands them to the group's other members: docs/guarantees.md)
            grouped = st.origins is not None
            self.recv.detach(st, release=not grouped)
            st.clear()
            if grouped:
                self._leaving[(topic, key)] = st
        self.cmds.add((Op.UNSUB, topic, key, Mode.FIRE))

    def publish(self, topic: str, key: str | None, tags: dict[str, str] | None, payload: bytes, reliable: bool) -> int:
        """Queue a message; returns its producer sequence (0 for fire)."""
        return self.pub.publish(topic, key, tags, payload, reliable)

    def consumed(self, st: SubState, n: int = 1) -> None:
        """The application took ``n`` messages from ``st``'s queue."""
        self.recv.consumed(st, n)

    def queue_raw(self, datagrams: list[bytes]) -> None:
        """Datagrams for our node that another part of the client made (durable PUTs)."""
        self._out.extend((self.node, d) for d in datagrams)

    def status_request(self) -> None:
        if self.cookie is not None:
            self._out.append((self.node, wire.encode_status(self.cid, self.cookie)))

    # ------------------------------------------------------------ input

    def handle_datagrams(self, datagrams: list[tuple[bytes, Addr]], now: float) -> None:
        known = self._known
        self.recv.now = now
        for data, src in datagrams:
            if src != self.node and src not in known:
                self.events.append(("stranger", src))
                if self.cmap is not None and self.cookie is not None and now >= self._map_asked + 1.0:
                    # (a member that joined after our map: ask ours for the newest map, which
                    # names it; what it sent is resent, and then taken)
                    self._map_asked = now
                    self._out.append((self.node, wire.encode_map_request(self.cid, self.cookie)))
                continue  # only nodes of our cluster may talk to us
            try:
                f = decoding.decode_untrusted_frame(data, 65536)
            except WireError:
                self.bad_datagrams += 1
                self.events.append(("bad_datagram", len(data)))
                continue
            if src == self.node:
                self.last_heard = now
            self._on_frame(f, src, now)

    def _on_frame(self, f: tuple[Any, ...], src: Addr, now: float) -> None:
        ftype = f[D.TYPE]
        if ftype is FrameType.MSGS:
            self.recv.on_msgs(src, f[D.MSGS_STREAM], f[D.MSGS_FIRST], f[D.MSGS_MESSAGES])
            return
        if ftype is FrameType.MSGSRUN:
            self.recv.on_run(src, f[D.MSGSRUN_NUMBER], f[D.MSGSRUN_TOPIC], f[D.MSGSRUN_PAYLOADS])
            return
        if ftype is FrameType.CANCEL:  # may come from any node that delivers to us
            self._on_cancel(f[D.CANCEL_TOPIC], f[D.CANCEL_KEY], f[D.CANCEL_REASON])
            return
        if src != self.node:  # the rest is conversation with our current node, but for our ACKs' cookies
            if ftype is FrameType.WELCOME:
                self.member_cookies.on_welcome(src, f[D.WELCOME_COOKIE])
            elif ftype is FrameType.ERROR and f[D.ERROR_CODE] == ErrorCode.BAD_COOKIE:
                self.member_cookies.refused(src)
                rs = self.recv.streams.get(src)
                if rs is not None:
                    rs.need_ack = True  # (the ACK it refused: owed again, once a new cookie comes)
            return
        if ftype is FrameType.PUTACK:
            self.putacks.append((f[D.PUTACK_PRODUCER], f[D.PUTACK_PARTITION], f[D.PUTACK_ACKED], f[D.PUTACK_STATUS]))
        elif ftype is FrameType.RECORDS or ftype is FrameType.COMMITTED:
            if len(self.durable_replies) < 64:  # (nobody may fill our memory with answers)
                self.durable_replies.append(f)
        elif ftype is FrameType.PUBACK:
            if self.pub.on_puback(f[D.PUBACK_PRODUCER], f[D.PUBACK_ACKED], now):
                self.events.append(("puback", self.pub.acked))
        elif ftype is FrameType.CMDACK:
            self._on_cmdack(f[D.CMDACK_SESSION], f[D.CMDACK_BATCH], f[D.CMDACK_RESULTS])
        elif ftype is FrameType.PONG:
            if f[D.PONG_TOKEN] <= self.ping_token:  # (else it answers no PING we sent: nothing of it is taken)
                if f[D.PONG_COOKIE] != self.cookie and self.member_cookies.held:
                    self.member_cookies.renew(now, self._out)  # (our node's key rotated: the others' too)
                self._on_pong(f[D.PONG_TOKEN], f[D.PONG_KNOWN], f[D.PONG_COOKIE], f[D.PONG_CANCELS], f[D.PONG_DIGEST])
        elif ftype is FrameType.WELCOME:
            params = f[D.WELCOME_PARAMS]
            self._on_welcome(f[D.WELCOME_NODE], f[D.WELCOME_COOKIE], params, f[D.WELCOME_MEMBERS])
            self._on_map(f[D.WELCOME_MAP], params.get("map_epoch"), now)
        elif ftype is FrameType.REDIRECT:
            if "map_epoch" in self.params:  # (a partitioned member's WELCOME says so; a single node
                self._on_map(f[D.REDIRECT_MAP], None, now)  # sends no map, so one from its address is not taken)
        elif ftype is FrameType.ERROR:
            code, text = f[D.ERROR_CODE], f[D.ERROR_TEXT]
            if code == ErrorCode.BAD_COOKIE:
                self.cookie = None
                self.next_hello = now
            elif code == ErrorCode.UNKNOWN_TYPE and text == decoding.UNKNOWN_FRAME and self.pub.runs:
                # (its decoder does not know a frame we sent: a node rolled back to a build before
                # PUBRUN, the cookie still good; runs stay off until the next WELCOME says)
                self.pub.runs = False
            self.events.append(("error", code, text))
        elif ftype is FrameType.STATUS_REPLY:
            self.last_status = f[D.STATUS_REPLY_STATUS]

    def _on_welcome(self, node_id: str, cookie: bytes, params: dict[str, Any], members: list[Any]) -> None:
        self.node_id, self.cookie, self.members, self.params = node_id, cookie, members, params
        for _, host, port in members:
            self._add_candidate((host, port))
        self.pub.runs = params.get("runs") == 1  # (a node of an earlier build does not know PUBRUN)
        md = params.get("max_datagram")
        if isinstance(md, int) and 1200 <= md <= 65507:
            self.pub.max_datagram = min(md, self.cfg.max_datagram)
        mp = params.get("max_payload")
        if isinstance(mp, int) and 1024 <= mp <= 1 << 30:
            self.pub.max_payload = min(mp, self.cfg.max_payload)
        sw = params.get("send_window")
        if isinstance(sw, int) and 1 <= sw <= 1 << 30:
            self.pub.max_parts = max(1, sw // 4)
        pi = params.get("ping_interval")
        if isinstance(pi, (int, float)) and 0.01 <= pi <= 60:
            # At most a third of node_timeout, so that a node is pinged twice before it is
            # called lost: a WELCOME (spoofed, or from a node configured apart) asking for
            # longer would make the client fail over from a node that is well.
            self.ping_interval = min(float(pi), self.cfg.node_timeout / 3)
        self.lost = False
        self.failed_attempts = 0
        self.events.append(("connected", node_id))

    def ask_map(self, now: float) -> None:
        """Ask our member for its map (MAP, answered by REDIRECT), at most once a second."""
        if self.cookie is not None and now >= self._map_asked + 1.0:
            self._map_asked = now
            self._out.append((self.node, wire.encode_map_request(self.cid, self.cookie)))

    def _on_map(self, cmap: ClusterMap | None, announced: Any, now: float) -> None:
        """Keep the newest map (by epoch; an older one is a late datagram). A WELCOME that
        announced a newer map than ours without room for it (``map_epoch`` only, see
        docs/protocol.md) makes us ask with MAP, answered by REDIRECT."""
        have = self.cmap.epoch if self.cmap is not None else 0
        if announced.__class__ is int:
            self.announced = announced
        if cmap is not None:
            self.heard_map = cmap
            if cmap.epoch > have:
                self.cmap = cmap
                self.events.append(("map", cmap.epoch))
            # (members that joined deliver to us too. From any map a member sends, not only a newer
            # one: members' epochs differ, and a joiner that is primary for a while may be named
            # only in maps older than ours)
            for addr in sorted({a for a, _peer in cmap.members.values()} - self._known):
                self._add_candidate(addr)
        elif announced.__class__ is int and announced > have and self.cookie is not None:
            self._out.append((self.node, wire.encode_map_request(self.cid, self.cookie)))
            self._map_asked = now  # (asked again each second until it comes: tick)

    def _on_cmdack(self, session: int, batch: int, results: list[int]) -> None:
        cmds = self.cmds.acked(session, batch, len(results))
        if cmds is None:
            return
        self.confirmed_token = self.ping_token
        for (op, topic, key, _), code in zip(cmds, results, strict=True):
            if op == Op.UNSUB and (topic, key) in self._leaving:
                self.recv.release(self._leaving.pop((topic, key)))
            st = self.subs.get((topic, key))
            if op != Op.SUB or st is None:
                continue
            if code == ErrorCode.OK:
                st.confirmed = True
            elif st.reason is None:
                # ErrorCode.STALE_BATCH lands here too: the node will not apply this
                # batch, so the subscription it carried never took effect.
                st.reason = "refused: " + _error_name(code)
                self._drop(topic, key)
                self.recv.detach(st)  # (what came before the refusal stays readable, no longer buffered)
        self.events.append(("cmdack", batch))

    def _digest(self) -> int:
        """subs_digest of what the node should hold for us, or 0 while that is
        not settled (commands queued or in flight, a subscription unconfirmed)."""
        if not self.cmds.idle or len(self.subs) >= MAX_BATCH:
            return 0
        held = []
        for (topic, key), st in self.subs.items():
            if not st.confirmed:
                return 0
            held.append((topic, key, st.mode))
        return wire.subs_digest(held)

    def _on_pong(self, token: int, known: bool, cookie: bytes, cancels: list[tuple[Any, ...]], digest: int) -> None:
        self.cookie = cookie
        if token > self.confirmed_token:
            # (a PONG older than our last CMDACK may list a cancellation we
            # already confirmed, of a subscription we have since renewed)
            for topic, key, reason in cancels:
                self._on_cancel(topic, key, reason)
        if not known and token > self.confirmed_token and self.cmds.idle:
            # The node has no state for us although it confirmed our
            # subscriptions: it dropped us (subscriber_timeout). Messages were
            # lost in between, so end the subscriptions rather than pretend.
            for (topic, key), st in list(self.subs.items()):
                if st.confirmed:
                    self._end(topic, key, Reason.TIMED_OUT)
        elif (
            digest and token == self.ping_token and token > self.confirmed_token
            and self.ping_digest and digest != self.ping_digest and self.cmds.idle
        ):  # fmt: skip
            # The node holds other subscriptions for us than it confirmed: a
            # member that acknowledged a SUB or UNSUB died before passing it
            # on. Send the whole set; the node ends what it does not list.
            self.syncs += 1
            self.events.append(("sync", len(self.subs)))
            self.cmds.add((Op.SYNC, "-", None, Mode.FIRE))
            for (topic, key), st in self.subs.items():
                self.cmds.add((Op.SUB, topic, key, st.mode))

    def _on_cancel(self, topic: str, key: str | None, reason: str) -> None:
        st = self.subs.get((topic, key))
        if st is not None:
            self._end(topic, key, reason)
        elif (Op.UNSUB, topic, key, Mode.FIRE) in self._cancels_told or len(self.cmds.queued) >= MAX_BATCH:
            return  # (told already, or later: a PONG repeats a cancellation until the node has our UNSUB)
        # Tell the node we saw it, so it stops repeating the cancellation (a subscription we do
        # not hold: one we ended ourselves, or none: at most once each, and not past a batch of
        # commands waiting, so that CANCELs naming anything cannot grow the queue).
        cmd = (Op.UNSUB, topic, key, Mode.FIRE)
        self._cancels_told[cmd] = None
        if len(self._cancels_told) > MAX_BATCH:
            del self._cancels_told[next(iter(self._cancels_told))]
        self.cmds.add(cmd)

    def _end(self, topic: str, key: str | None, reason: str) -> None:
        st = self._drop(topic, key)
        assert st is not None
        st.reason = reason
        grouped = st.origins is not None
        self.recv.detach(st)
        if grouped and reason != Reason.NODE_LOST:
            # A group subscription the node ended (cancelled, timed out): it handed what we had not
            # taken to the group's other members, so the application must not take it too.
            st.clear()
        self.events.append(("cancelled", topic, key, reason))

    # ------------------------------------------------------------ time

    def tick(self, now: float) -> None:
        if self.cookie is None:
            if now >= self.next_hello:
                self._out.append((self.node, wire.encode_hello(self.cid)))
                self.next_hello = now + self.cfg.hello_retry
        elif now >= self.next_ping:
            self.ping_token += 1
            self.ping_digest = self._digest()
            self._out.append(
                (
                    self.node,
                    wire.encode_ping(self.cid, self.cookie, self.ping_token, self.ping_digest, self.cmds.session),
                )
            )
            self.next_ping = now + self.ping_interval
        if now >= self.last_heard + self.cfg.node_timeout:  # (the same sum as next_deadline)
            self._node_silent(now)
        if self.cookie is not None:
            again = self.cmds.due(self.cid, self.cookie, now)
            if again is not None:
                self._out.append((self.node, again))
            if self.announced > (self.cmap.epoch if self.cmap is not None else 0) and now >= self._map_asked + 1.0:
                # (the WELCOME's map did not fit and our MAP or its REDIRECT was lost: ask again)
                self._map_asked = now
                self._out.append((self.node, wire.encode_map_request(self.cid, self.cookie)))
        if self.recv.parts.partials:
            self.recv.expire_parts(now)
        resent = self.pub.tick(now)
        if resent:
            self.events.append(("pub_retry", resent))

    def _node_silent(self, now: float) -> None:
        """Our node said nothing for node_timeout: try the next member."""
        self.failed_attempts += 1
        self.events.append(("node_silent", self.node))
        if not self.lost and self.failed_attempts >= len(self.candidates):
            # Every node we know was tried: the subscriptions cannot go on.
            self.lost = True
            for topic, key in list(self.subs):
                self._end(topic, key, Reason.NODE_LOST)
                self.cmds.add((Op.UNSUB, topic, key, Mode.FIRE))
            self.events.append(("node_lost",))
        i = self.candidates.index(self.node) if self.node in self.candidates else -1
        nxt = self.candidates[(i + 1) % len(self.candidates)]
        self._switch_cookies(nxt)
        self.node = nxt
        self.cookie = None
        self.next_hello = now
        self.last_heard = now
        if not self.lost:
            self.failovers += 1
            self._resume_elsewhere()

    def add_candidates(self, addrs: list[Addr]) -> None:
        """More addresses to fail over to: the shell resolved a node's name again after a failover."""
        for a in addrs:
            self._add_candidate(a)

    def _add_candidate(self, addr: Addr) -> None:
        """One more address to fail over to and hear from. At most MAX_CANDIDATES: past it the
        oldest learnt one (not given, not our node) makes room, so WELCOMEs and maps from
        our node's address (spoofed ones too) cannot grow the list, and the cost of every
        datagram's check, without end."""
        if addr in self._known:
            return
        if len(self.candidates) >= MAX_CANDIDATES:
            for i in range(self._configured, len(self.candidates)):
                if self.candidates[i] != self.node:
                    self._known.discard(self.candidates.pop(i))
                    break
            else:
                return
        self.candidates.append(addr)
        self._known.add(addr)

    def move_to(self, node: Addr, now: float) -> None:
        """Talk to ``node`` from now on, as a failover does (subscriptions and unacknowledged
        publishes go again). The router's: a durable request is served by its partition's
        leader only, so a session that failed over while that member was away goes back to it."""
        if node == self.node:
            return
        self._add_candidate(node)
        self._switch_cookies(node)
        self.node, self.cookie, self.announced = node, None, 0
        self.next_hello = self.last_heard = now
        self.failed_attempts = 0
        self.failovers += 1
        self._resume_elsewhere()

    def _switch_cookies(self, node: Addr) -> None:
        """We move to ``node``: the cookie of the one we leave acknowledges what it still
        delivers to us, and the new one's is our own (from its WELCOME)."""
        if self.cookie is not None and node != self.node:
            self.member_cookies.keep(self.node, self.cookie)
        self.member_cookies.forget(node)

    def _resume_elsewhere(self) -> None:
        """Carry our state to the next node: subscriptions again, commands in
        flight again (they are idempotent), unacknowledged publishes again
        (the producer sequence keeps them from being delivered twice)."""
        self.cmds.requeue([(Op.SUB, t, k, st.mode) for (t, k), st in self.subs.items()])
        self.pub.rewind()

    def next_deadline(self) -> float:
        d = [self.last_heard + self.cfg.node_timeout]
        d.append(self.next_hello if self.cookie is None else self.next_ping)
        # Only deadlines tick() acts on: any other would wake the shell for nothing, forever.
        retry = self.cmds.deadline()
        if retry is not None and self.cookie is not None:
            d.append(retry)
        if self.pub.retry_at is not None and self.pub.unacked:
            d.append(self.pub.retry_at)
        return min(d)

    # ------------------------------------------------------------ output

    def take_events(self) -> list[tuple[Any, ...]]:
        """What happened since the last call (connected, map, cmdack, node_silent, ...), oldest
        first; the list is emptied (in place: the receiver appends to the same one)."""
        out = self.events[:]
        self.events.clear()
        return out

    def close(self) -> list[tuple[Addr, bytes]]:
        """What to send as the client closes: the ACKs not sent yet (a message the application
        took just before it left is acknowledged), then the BYE that tells our node to drop our
        subscriptions now rather than at ``subscriber_timeout``; nothing before our node
        welcomed us. Nothing else queued goes."""
        if self.cookie is None:
            return []
        out: list[tuple[Addr, bytes]] = []
        self.recv.acks(self.cid, self.node, self.cookie, self.member_cookies.held, out)
        out.append((self.node, wire.encode_bye(self.cid, self.cookie, self.cmds.session)))
        return out

    def outgoing(self, now: float) -> list[tuple[Addr, bytes]]:
        """Everything to send now, with its destination."""
        cookie = self.cookie
        mc = self.member_cookies
        waiting = self.recv.acks(self.cid, self.node, cookie, mc.held, self._out)
        if waiting is not None or mc.renewing:  # (HELLOs to other members, for their cookies)
            gone = mc.due(waiting, self.node, now, self._out)
            for src in gone or ():  # (silent for node_timeout: our ACK is as good as lost)
                self.recv.streams[src].need_ack = False
        if cookie is not None:
            batch = self.cmds.start(self.cid, cookie, now)
            if batch is not None:
                self._out.append((self.node, batch))
            self.pub.emit(self.node, self.cid, cookie, now, self._out)
        out, self._out = self._out, []
        return out


#: What a refused subscription's reason adds to its code: the node's settings that can refuse
#: it (the node's log line ``subscription_refused`` names the one that did, and its value).
_REFUSED_BY = {
    ErrorCode.OVERLOADED: ": a limit of the node's per client or per source host (max_subscriptions_per_client, "
                  "max_subscriptions_per_host, max_filter_bytes_per_host, max_clients, max_per_host)",
    ErrorCode.OVER_CAPACITY: ": the node is near a limit (admission_share of max_subscriptions, max_filter_bytes or "
                     "max_mailbox_bytes) and this host holds its share",
}  # fmt: skip


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.lower() + _REFUSED_BY.get(ErrorCode(code), "")
    except ValueError:
        return f"error {code}"
