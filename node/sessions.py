"""Binary clients at their home node: command batches within client sessions, PING/PONG, timeouts.

Theory of operation. SUB and UNSUB arrive in ordered CMDS batches, one in
flight per client, retried with the same ids until the CMDACK arrives. A
batch names its client *session* (one per client process; a restarted
process that reuses its client id starts a greater one) and its *batch* id
(growing within the session). Per client record the node keeps the session,
the highest batch applied in it, and the answers of the last
``REMEMBERED_BATCHES`` batches:

- a greater session ends what the old session subscribed, then starts the
  new one (a restarted process must not inherit subscriptions);
- a smaller session is a late datagram of an abandoned session: nothing
  changes, every command is answered ``STALE_BATCH``;
- a batch above the last applied is applied, its answers remembered;
- a retry of a remembered batch gets that batch's own answers again
  (applying it again could undo a later command);
- an older batch that is no longer remembered changes nothing and is
  answered ``STALE_BATCH``.

The session is part of the replicated client register (with the address and
the home), so a member that knows the client only from replication tells a
restarted process from a failover like its home would. A record that came
without a session (session 0) adopts the session of its first batch without
ending anything.

The node this client talks to is its home (``local``): it answers PING, and
drops the client (tombstoning its subscriptions) after ``subscriber_timeout``
of silence.
"""

from __future__ import annotations

from collections import Counter

from roost.client import wire
from roost.client.wire import ErrorCode, Op
from roost.node import versions
from roost.node.actions import Confirm, Send
from roost.node.admission import Admission, host_key, over_fair_share
from roost.node.budgets import utf8_len
from roost.node.clients import REMEMBERED_BATCHES, ClientState
from roost.node.config import NodeConfig
from roost.node.cookies import Addr
from roost.node.outbox import TIMER_LIVENESS, Outbox, fmt
from roost.node.placement import Placement
from roost.node.registers import Registers
from roost.node.streams import Streams
from roost.node.versions import REASON_TIMED_OUT

Command = tuple[int, str, str | None, int]  # op, topic, key, mode


class Sessions:
    def __init__(
        self, config: NodeConfig, metrics: Counter[str], outbox: Outbox, place: Placement, registers: Registers,
        streams: Streams, admission: Admission, client_share: Admission,
    ) -> None:  # fmt: skip
        self.cfg = config
        self.node_id = config.id
        self.metrics = metrics
        self.outbox = outbox
        self.out = outbox.out
        self.place = place
        self.registers = registers
        self.streams = streams
        self.admission = admission
        self.client_share = client_share
        self.clients = registers.clients

    def on_cmds(
        self, c: ClientState | None, cid: bytes, addr: Addr, session: int, batch: int, cmds: list[Command],
        now: float,
    ) -> None:  # fmt: skip
        if c is not None and not 0 < session < c.session:
            self.may_move(c, addr, restarting=session != c.session and c.session > 0)
        if c is not None and session != c.session and c.session > 0:
            if session < c.session:
                self.metrics["stale_session"] += 1  # a late datagram of a session the client has left
                self.outbox.send(addr, wire.encode_cmdack(session, batch, [ErrorCode.STALE_BATCH] * len(cmds)))
                return
            # The same client id from a new client session (a restarted
            # process): what the old one subscribed is not this one's.
            self.outbox.log("info", "client_restarted", client=cid.hex())
            for tk, v in list(c.subs.items()):
                if v & versions.PRESENT:
                    self.registers.write(c, tk, False, v & versions.RELIABLE, now)
            c.mailbox = None
            c.cancelled.clear()
            c.session = session
            c.last_batch = -1
            c.answers.clear()
            self.registers.reset_cver(c, now)  # the session is part of the client register
            self.registers.mark_changed(c, None)
        if c is not None:
            c.last_seen = c.heard = now
            self.adopt(c, addr, now, session)  # the client talks to this node now: it is ours to watch
        if c is not None and session == c.session and batch <= c.last_batch:
            answer = c.answers.get(batch)
            if answer is None:
                self.metrics["stale_batch"] += 1  # older than what is remembered: its answer is gone
                answer = wire.encode_cmdack(session, batch, [ErrorCode.STALE_BATCH] * len(cmds))
            self._confirm(addr, answer)
            return
        if c is None:
            host = host_key(addr[0])
            self._admit_client(host)
            c = self.registers.new_client(cid, addr, now)
            c.counted = host
            self.outbox.log("info", "client_new", client=cid.hex(), addr=fmt(addr))
        results = []
        if cmds and cmds[0][0] == Op.SYNC:
            self._sync(c, cmds, now)
        for op, topic, key, mode in cmds:
            results.append(self._apply(c, op, topic, key, mode, now))
        if self.place.own is not None and c.redirected < self.place.map_epoch:
            forward_to = self.place.own.forward_to
            if any(cmd[0] == Op.SUB and code == ErrorCode.OK and forward_to(cmd[1]) is not None
                   for cmd, code in zip(cmds, results, strict=True)):  # fmt: skip
                # A SUB for a partition another member leads: the client should learn our map
                # (once per epoch); the subscription itself is served from here all the same.
                c.redirected = self.place.map_epoch
                assert self.place.redirect_frame is not None
                self.metrics["redirects"] += 1
                self.outbox.send(addr, self.place.redirect_frame)
        c.session = session
        c.last_batch = batch
        answer = wire.encode_cmdack(session, batch, results)
        answers = c.answers
        answers[batch] = answer
        if len(answers) > REMEMBERED_BATCHES:
            del answers[next(iter(answers))]  # the oldest: batch ids grow within a session
        self._confirm(addr, answer)

    def _confirm(self, addr: Addr, answer: bytes) -> None:
        """Send a CMDACK; in partitioned mode only once the partitions' owners
        hold what the batch changed (the member core holds a ``Confirm``)."""
        self.out.append(Send(addr, answer) if self.place.own is None else Confirm(addr, answer))

    def _admit_client(self, host: str) -> None:
        """Room for a new client record from ``host``, or WireError (``overloaded``). Above
        ``admission_share`` of ``max_clients``, only for a host holding less than its fair
        share (node/admission.py): hosts that filled the table together are refused, a
        newcomer is not. Counts it against the host."""
        cfg, n = self.cfg, self.client_share.total  # (binary records this member admitted)
        pool = cfg.admission_share * cfg.max_clients
        if n >= pool and over_fair_share(self.client_share.per_host.get(host, 0), len(self.client_share.per_host),
                                         pool):  # fmt: skip
            self.metrics["refused_max_clients"] += 1
            raise wire.WireError(ErrorCode.OVERLOADED,
                                 f"too many clients on this node from this host: above admission_share "
                                 f"({cfg.admission_share}) of max_clients ({cfg.max_clients}), a host at its "
                                 "share gets no more")  # fmt: skip
        self.admission.admit(host, n, cfg.max_clients, "clients", "max_clients")
        self.client_share.add(host)

    def _sync(self, c: ClientState, cmds: list[Command], now: float) -> None:
        """A SYNC batch lists every subscription the client holds: end the
        ones it does not list (an UNSUB lost with a crashed member)."""
        keep = {(t, k) for op, t, k, _ in cmds if op == Op.SUB}
        if self.place.own is not None:
            self.registers.reset_cver(c, now)  # (the owners end what they hold and this batch does not renew)
        for tk, v in list(c.subs.items()):
            if v & versions.PRESENT and tk not in keep:
                self.registers.write(c, tk, False, v & versions.RELIABLE, now)
        self.metrics["subscriptions_synced"] += 1

    def _apply(self, c: ClientState, op: int, topic: str, key: str | None, mode: int, now: float) -> int:
        if op == Op.SYNC:
            return ErrorCode.OK
        tk = (topic, key)
        c.cancelled.pop(tk, None)
        present = bool(c.subs.get(tk, 0) & versions.PRESENT)
        if op == Op.UNSUB:
            # (partitioned: the owners may hold it although this home does not, the client
            # having subscribed through another member: the tombstone goes to them anyway)
            if present or self.place.own is not None:
                if tk not in c.subs:  # (a register of a filter never held here: state a stranger makes)
                    refused, _ = self.registers.budgets.may_tombstone(c.counted, now)
                    if refused:
                        return refused
                    if not self._filter_ok(topic):
                        return ErrorCode.BAD_TOPIC
                self.registers.write(c, tk, False, mode, now)
                self.outbox.log("debug", "unsubscribe", client=c.cid.hex(), topic=topic, key=key)
            return ErrorCode.OK
        if not present:
            refused, _ = self.registers.sub_budget(c.live, c.counted, utf8_len(topic), now, revives=tk in c.subs)
            if refused:
                return refused
            if not self._filter_ok(topic):
                return ErrorCode.BAD_TOPIC
        self.registers.write(c, tk, True, mode, now)
        self.outbox.log("debug", "subscribe", client=c.cid.hex(), topic=topic, key=key, mode=mode)
        return ErrorCode.OK

    def _filter_ok(self, topic: str) -> bool:
        """A CMDS's filter is parsed here, once its subscription passed the budgets (the
        decoder checked only its type and length: client/wire.py ``_cmd``)."""
        try:
            wire.check_filter(topic)
        except wire.WireError:
            self.metrics["error_bad_topic"] += 1
            return False
        return True

    def on_ping(self, c: ClientState | None, addr: Addr, token: int, cookie: bytes, digest: int,
                taken: bool = False) -> None:  # fmt: skip
        """Answer PING with PONG (``cookie`` is the one the client should use now).

        A PING with a digest of the client's subscriptions gets ours back: a
        SUB or UNSUB this node (or a member that crashed before replicating
        it) acknowledged can be missing here, and the client then sends its
        whole set (a SYNC batch). ``taken``: this PING took the client over
        from another home that had not dropped it (``adopt``)."""
        # ``known``: this node holds a subscription in force for the client.
        # A record of tombstones only (kept in a cluster after a timeout) is
        # not "known": the client must learn that its subscriptions ended.
        # A client taken over from a live home is known, although we may hold none of its
        # registers yet (partitioned: those of partitions we do not own come from the owners
        # once they learn we are its home); the digests differ and the client sends its set.
        # Else it ends subscriptions that stand everywhere (simulator seed 3465, --mode partitioned).
        known = c is not None and (c.live > 0 or taken)
        cancels = [[t, k, r] for (t, k), r in c.cancelled.items()] if c else []
        ours = (c.subs_digest() if c is not None else wire.subs_digest(())) if digest else 0
        self.outbox.send(addr, wire.encode_pong(token, known, cookie, cancels[:64], ours))

    def may_move(self, c: ClientState, addr: Addr, restarting: bool = False) -> None:
        """A client counted here that talks from another host now brings what it holds to that
        host's limits: refused (WireError) past them, before anything changes, or two hosts
        could pass records and subscriptions between them without end. (A client this member
        adopts from another home is not refused: ``_adopt``. ``restarting``: a new process of
        the client, whose subscriptions the restart ends, brings only the record.)"""
        host = host_key(addr[0])
        if c.counted is not None and c.counted != host:
            cfg = self.cfg
            self.admission.check_host(host)
            setting = "" if restarting else self.registers.budgets.room(host, c)
            if setting:
                self.metrics[f"refused_{setting}"] += 1
                raise wire.WireError(ErrorCode.OVERLOADED, f"the client's subscriptions are over this host's limit "
                                     f"({setting} = {getattr(cfg, setting)})")  # fmt: skip

    def adopt(self, c: ClientState, addr: Addr, now: float, session: int) -> bool:
        """Make this node the client's home (and note its address) if it is not yet (after
        ``_may_move``). True if it took the client over from another home that had not
        dropped it (partitioned: a client register in force, of a client not ours)."""
        if c.local and c.addr == addr:
            return False
        taken = self.place.own is not None and not c.local and bool(c.cver & versions.PRESENT)
        host = host_key(addr[0])
        if c.addr != addr:
            self.outbox.log("info", "client_moved", client=c.cid.hex(), old=fmt(c.addr), new=fmt(addr))
        elif not c.local:
            self.outbox.log("info", "client_adopted", client=c.cid.hex(), previous_home=c.home)
        if c.addr != addr:
            c.addr = addr
            # never the middle of a stream to a new socket; the backlog only if it is the same process
            self.streams.readdressed(c, carry=session == c.session)
        if not c.local:
            c.local = True
            self.outbox.timer(now + self.cfg.subscriber_timeout, TIMER_LIVENESS, c.cid)
        if c.counted != host:  # (its host is counted here now, and charged for its subscriptions)
            self.registers.uncount(c)
            self.registers.count(c, host)
        c.home = self.node_id
        self.registers.set_cver(c, self.registers.version(now, True, 0))
        self.registers.mark_changed(c, None)
        return taken

    def on_liveness(self, cid: bytes, now: float) -> None:
        """Liveness timer: drop the client if it was silent for subscriber_timeout."""
        c = self.clients.get(cid)
        if c is None or not c.local:
            return
        expires = c.last_seen + self.cfg.subscriber_timeout
        if expires > now:
            self.outbox.timer(expires, TIMER_LIVENESS, cid)
            return
        self.metrics["clients_timed_out"] += 1
        self.outbox.log("info", "client_timed_out", client=cid.hex(), addr=fmt(c.addr), subs=c.live)
        self.drop_client(c, now)

    def on_bye(self, c: ClientState | None, addr: Addr, session: int, now: float) -> None:
        """The client closed: what a time-out would do, now. Only its home acts, and only on a BYE
        of the client's current session: a late BYE of a process the client id has since been
        restarted in must not end the new process's subscriptions."""
        if c is None or not c.local:  # (a publisher has no record; other members are not its home)
            return
        if c.session > 0 and session != c.session:
            self.metrics["bye_ignored"] += 1  # (a late BYE of an earlier process of this client id)
            return
        self.metrics["clients_closed"] += 1
        self.outbox.log("info", "client_closed", client=c.cid.hex(), addr=fmt(addr), subs=c.live)
        self.drop_client(c, now)

    def drop_client(self, c: ClientState, now: float) -> None:
        """The client is gone: end its subscriptions everywhere and free its state."""
        for tk, v in list(c.subs.items()):
            if v & versions.PRESENT:
                self.registers.write(c, tk, False, v & versions.RELIABLE, now, REASON_TIMED_OUT)
        if self.place.own is not None and self.registers.replicating:
            self.registers.reset_cver(c, now, dropped=True)  # (and the owners end what this home does not know of)
        c.mailbox = None
        c.fire = []
        c.fire_whole = []
        c.local = False
        self.registers.uncount(c)  # (its tombstones stay charged to its host until collected)
        if not self.registers.replicating:
            self.registers.forget_client(c)
