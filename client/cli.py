"""The client side of the command line: ``roost pub``, ``sub``, ``request``, ``reply``, ``put``, ``get``, ``status``.

What a mosquitto_pub/sub, nats or redis-cli user expects: ``--node`` takes a list and host names
(default ``ROOST_NODES``), ``sub -v``/``--json``/``--raw`` choose what is printed, ``pub`` takes
tags, files and raw bytes and ends with a summary line on stderr. Bad values are refused by the
argument parser before anything is sent. Exit codes: 0 done, 1 incomplete (a time-out, input
lines that could not be sent), 2 refused input, 3 no node answered.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, Any, NoReturn

import trio

from roost.client import addresses
from roost.client.library import Client, ClientClosed, Message, NodeLost, Request
from roost.client.session import ClientConfig
from roost.client.wire import WireError

NODE_HELP = f"node(s) to talk to, HOST:PORT[,HOST:PORT...], tried in turn (default: ${addresses.ENV} or " \
            f"{addresses.DEFAULT_NODES})"  # fmt: skip
PROGRESS_FROM = 10_000  # pub --count runs at least this long show a progress bar on a terminal


# ------------------------------------------------------------ argument types: refused before anything is sent


def nodes(value: str) -> str:
    try:
        addresses.parse_nodes(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def positive(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, not {value!r}") from None
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, not {value!r}")
    return x


def counter(least: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, not {value!r}") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, not {n}")
        return n

    return parse


def tag(value: str) -> tuple[str, str]:
    k, sep, v = value.partition("=")
    if not sep or not k:
        raise argparse.ArgumentTypeError(f"a tag is NAME=VALUE, not {value!r}")
    return k, v


def refuse(why: str) -> NoReturn:
    """Input refused before anything was sent: exit status 2, as the argument parser's."""
    print(why, file=sys.stderr)
    raise SystemExit(2)


def add_client_commands(sub: Any) -> None:
    p = sub.add_parser("pub", help="publish messages to a topic")
    p.add_argument("topic", help="the topic")
    p.add_argument(
        "message",
        nargs="?",
        help="the payload ({n} becomes 0..N-1 with --count); without it, each line of --file or stdin is one message",
    )
    _common(p, count_least=0, count_help="publish MESSAGE (or each input line) N times (default: 1)")
    _tags(p)
    p.add_argument("--file", default=None, metavar="F", help="read messages from F instead of stdin")
    p.add_argument(
        "--binary",
        action="store_true",
        help="send the whole input (--file or stdin) as one message of raw bytes instead of one message per UTF-8 line",
    )
    p.add_argument(
        "--timeout",
        type=positive,
        default=30.0,
        metavar="S",
        help="fail unless every reliable publish is acknowledged within S seconds of the last",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line on stderr")
    p.set_defaults(func=cmd_pub)

    s = sub.add_parser("sub", help="subscribe and print each message (payload and newline by default)")
    s.add_argument(
        "topic",
        help="the topic, or a pattern: '*' matches one token, '>' (last) the rest, as in 'orders.*.paid' or 'orders.>'",
    )
    s.add_argument(
        "--query",
        default=None,
        metavar="Q",
        help="only messages whose tags satisfy Q, as in "
        "\"kind = 'order' AND amount > 100\" (docs/protocol.md, Tag queries)",
    )
    s.add_argument(
        "--queue",
        default=None,
        metavar="GROUP",
        help="join queue group GROUP: each message goes to one of the group's subscribers",
    )
    _common(s, count_least=1, count_help="exit 0 after N messages (default: run until interrupted)")
    s.add_argument(
        "--timeout",
        type=positive,
        default=None,
        metavar="S",
        help="give up after S seconds (non-zero exit if --count was not reached)",
    )
    out = s.add_mutually_exclusive_group()
    out.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print 'TOPIC key=K seq=N tags=A=1,B=2 PAYLOAD' ('-' for what a message lacks)",
    )
    out.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per message: topic, key, tags, "
        "sequence and payload (payload_base64 when the payload is not UTF-8)",
    )
    out.add_argument("--raw", action="store_true", help="write payload bytes unchanged, with no separator")
    s.set_defaults(func=cmd_sub)

    rq = sub.add_parser("request", help="send a request and print the first reply (roost reply answers)")
    rq.add_argument("topic", help="the topic the replier subscribes to")
    rq.add_argument("message", help="the request's payload")
    rq.add_argument("--node", type=nodes, default=None, metavar="HOST:PORT", help=NODE_HELP)
    rq.add_argument("--key", default=None, metavar="K", help="the request's key")
    _tags(rq)
    rq.add_argument("--timeout", type=positive, default=5.0, metavar="S", help="wait S seconds for the reply")
    rq.set_defaults(func=cmd_request)

    rp = sub.add_parser("reply", help="answer the requests sent to a topic (roost request, Client.request)")
    rp.add_argument("topic", help="the topic to answer on")
    how = rp.add_mutually_exclusive_group(required=True)
    how.add_argument("--echo", action="store_true", help="answer with the request's own payload")
    how.add_argument(
        "--command",
        default=None,
        metavar="CMD",
        help="run CMD (a shell command) per request with the payload on stdin; its stdout is the answer",
    )
    rp.add_argument("--node", type=nodes, default=None, metavar="HOST:PORT", help=NODE_HELP)
    rp.add_argument(
        "--count",
        type=counter(1),
        default=None,
        metavar="N",
        help="exit after answering N requests (default: run until interrupted)",
    )
    rp.add_argument(
        "--command-timeout",
        type=positive,
        default=10.0,
        metavar="S",
        help="stop a CMD that runs longer than S seconds (the request gets no answer)",
    )
    rp.set_defaults(func=cmd_reply)

    pt = sub.add_parser(
        "put",
        help="publish messages durably: each is on disk on both owners of its "
        "partition before it is acknowledged (a partitioned cluster; docs/durable.md)",
    )
    pt.add_argument("topic", help="the topic")
    pt.add_argument("message", nargs="?", help="the payload ({n} becomes 0..N-1); stdin lines if absent")
    pt.add_argument("--node", type=nodes, default=None, metavar="HOST:PORT", help=NODE_HELP)
    pt.add_argument("--key", default=None, metavar="K", help="the messages' key")
    pt.add_argument("--count", type=counter(0), default=None, metavar="N", help="put MESSAGE N times (default: 1)")
    pt.add_argument(
        "--timeout",
        type=positive,
        default=30.0,
        metavar="S",
        help="fail if the puts are not all acknowledged within S seconds of the last",
    )
    pt.set_defaults(func=cmd_put)

    g = sub.add_parser(
        "get",
        help="read a durable subscription: print each payload on its own line, then "
        "move its cursor past them (docs/durable.md)",
    )
    g.add_argument("topic", help="the topic")
    g.add_argument("--durable", required=True, metavar="NAME", help="the durable subscription's name")
    g.add_argument("--client", default="default", metavar="C", help="whose subscription it is")
    g.add_argument("--count", type=counter(1), default=1, metavar="N", help="messages to read")
    g.add_argument(
        "--start",
        default="earliest",
        metavar="WHERE",
        help="where a new subscription begins: earliest, latest, an offset, or a time (ISO 8601, "
        "such as 2026-11-24T09:30:00Z; local time without a zone)",
    )
    g.add_argument(
        "--timeout",
        type=positive,
        default=10.0,
        metavar="S",
        help="give up waiting after S seconds (non-zero exit with fewer than N)",
    )
    g.add_argument(
        "--offsets-dir",
        default=None,
        metavar="DIR",
        help="record each commit here first, so that a crash before the cluster has it "
        "repeats nothing on the next run (client/offsets.py)",
    )
    g.add_argument("--node", type=nodes, default=None, metavar="HOST:PORT", help=NODE_HELP)
    g.set_defaults(func=cmd_get)


def _common(p: argparse.ArgumentParser, count_least: int, count_help: str) -> None:
    p.add_argument("--node", type=nodes, default=None, metavar="HOST:PORT", help=NODE_HELP)
    p.add_argument("--key", default=None, metavar="K", help="the messages' key (a subscription: only that key)")
    p.add_argument("--count", type=counter(count_least), default=None, metavar="N", help=count_help)
    p.add_argument(
        "--mode",
        choices=("fire", "reliable"),
        default="reliable",
        help="reliable: acknowledged, retried, in order; fire: at most once",
    )


def _tags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tag",
        type=tag,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a tag to send with each message; repeatable",
    )


# ------------------------------------------------------------ pub and put


class Input:
    """The messages of ``roost pub``/``put``: MESSAGE ``--count`` times (``{n}`` numbered), or the
    lines of --file/stdin (or with --binary the whole input as one message). A line that is not
    UTF-8 is reported with its number and skipped; the rest is published (``bad`` counts them)."""

    def __init__(self, args: argparse.Namespace, command: str) -> None:
        self.args, self.command = args, command
        self.count = 1 if args.count is None else args.count
        self.bad = 0
        self.total = self.count if args.message is not None else None
        file, binary = getattr(args, "file", None), getattr(args, "binary", False)
        if args.message is not None and (file or binary):
            refuse(f"roost {command}: give MESSAGE or --file/--binary input, not both")
        try:
            self.src: IO[bytes] = open(file, "rb") if file else sys.stdin.buffer  # noqa: SIM115
        except OSError as exc:
            refuse(f"roost {command}: cannot read --file {file}: {exc.strerror}")

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        a = self.args
        if a.message is not None:
            yield from self._numbered(0, a.message)
            return
        src = self.src
        try:
            if getattr(a, "binary", False):
                data = src.read()
                for _ in range(self.count):
                    yield 0, data
                return
            for number, raw in enumerate(src, 1):
                try:
                    line = raw.rstrip(b"\n").decode()
                except UnicodeDecodeError as exc:
                    self.failed(number, f"not UTF-8 at byte {exc.start} (--binary sends raw bytes)")
                    continue
                yield from self._numbered(number, line)
        finally:
            if src is not sys.stdin.buffer:
                src.close()

    def _numbered(self, number: int, text: str) -> Iterator[tuple[int, bytes]]:
        for n in range(self.count):
            yield number, (text.replace("{n}", str(n)) if "{n}" in text else text).encode()

    def failed(self, number: int, why: str) -> None:
        self.bad += 1
        where = f"line {number}: " if number else ""
        print(f"roost {self.command}: {where}{why}; skipped", file=sys.stderr)


def _progress(total: int | None) -> Any:
    """A progress bar on stderr for long runs on a terminal; None otherwise."""
    if total is None or total < PROGRESS_FROM or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="msg", unit_scale=True, file=sys.stderr, leave=False)


def cmd_pub(args: argparse.Namespace) -> int:
    messages = Input(args, "pub")
    tags = dict(args.tag) or None
    if args.file is None and args.message is None and sys.stdin.isatty():
        print("roost pub: reading messages from stdin, one per line (Ctrl-D ends)", file=sys.stderr)

    async def main() -> int:
        sent = 0
        bar = _progress(messages.total)
        async with Client(args.node, config=ClientConfig()) as c:
            began = time.monotonic()
            for number, payload in messages:
                try:
                    await c.publish(args.topic, payload, key=args.key, tags=tags, mode=args.mode)
                except (WireError, ValueError) as exc:
                    messages.failed(number, str(exc))
                    continue
                sent += 1
                if bar is not None:
                    bar.update()
            acked = await c.flush(timeout=args.timeout) if args.mode == "reliable" else None
            took = time.monotonic() - began
            if bar is not None:
                bar.close()
            if not args.quiet:
                what = (
                    "fire: not acknowledged"
                    if acked is None
                    else (f"{sent} acknowledged" if acked else f"NOT all acknowledged within {args.timeout} s")
                )
                print(
                    f"roost pub: {sent} published, {what}, in {took:.2f} s ({sent / max(took, 1e-9):,.0f} msgs/s)"
                    + (f"; {messages.bad} input line(s) skipped" if messages.bad else ""),
                    file=sys.stderr,
                )
            if acked is False and c.router.lost:
                raise NodeLost("node lost before acknowledging every publish")
        return 1 if messages.bad or acked is False else 0

    return _run(main)


def cmd_put(args: argparse.Namespace) -> int:
    messages = Input(args, "put")

    async def main() -> int:
        async with Client(args.node, config=ClientConfig()) as c:
            for number, payload in messages:
                try:
                    await c.put(args.topic, payload, key=args.key)
                except (WireError, ValueError) as exc:
                    messages.failed(number, str(exc))
            if not await c.flush(timeout=args.timeout):
                if c.router.lost:
                    raise NodeLost("node lost before acknowledging every put")
                why = c.router.putter.refusal() or " (the partition's owners cannot commit: see the members' logs)"
                print(f"roost put: not every put was acknowledged within {args.timeout} s{why}", file=sys.stderr)
                return 1
        return 1 if messages.bad else 0

    return _run(main)


# ------------------------------------------------------------ sub, get, request, reply


def formatter(args: argparse.Namespace) -> Callable[[Message], bytes]:
    """How ``roost sub`` (and ``request``) prints a message."""
    if getattr(args, "raw", False):
        return lambda m: m.payload
    if getattr(args, "json", False):
        return lambda m: (json.dumps(as_json(m), ensure_ascii=False) + "\n").encode()
    if getattr(args, "verbose", False):

        def verbose(m: Message) -> bytes:
            tags = ",".join(f"{k}={v}" for k, v in m.tags.items()) if m.tags else "-"
            seq = "-" if m.sequence is None else m.sequence
            return f"{m.topic} key={m.key or '-'} seq={seq} tags={tags} ".encode() + m.payload + b"\n"

        return verbose
    return lambda m: m.payload + b"\n"


def as_json(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"topic": m.topic, "key": m.key, "tags": m.tags or {}, "sequence": m.sequence}
    try:
        out["payload"] = m.payload.decode()
    except UnicodeDecodeError:
        out["payload_base64"] = base64.b64encode(m.payload).decode()
    return out


def cmd_sub(args: argparse.Namespace) -> int:
    show = formatter(args)

    async def main() -> int:
        out = sys.stdout.buffer
        got = 0
        deadline = trio.current_time() + args.timeout if args.timeout else float("inf")
        async with Client(args.node) as c:
            async with c.subscribe(args.topic, key=args.key, mode=args.mode, query=args.query,
                                   queue=args.queue) as sub:  # fmt: skip
                if sub.reason is not None:
                    print(f"roost sub: subscription refused: {sub.reason}", file=sys.stderr)
                    return 1
                print(
                    f"roost sub: subscribed to {args.topic} ({args.mode}) at node {c.session.node_id}",
                    file=sys.stderr,
                    flush=True,
                )
                with trio.move_on_at(deadline):
                    while args.count is None or got < args.count:
                        try:
                            msg = await sub.next()
                        except StopAsyncIteration:
                            out.flush()
                            print(f"roost sub: subscription ended: {sub.reason}", file=sys.stderr)
                            return 1
                        out.write(show(msg))
                        got += 1
                        if not sub.state.queue:
                            out.flush()
                out.flush()
                if args.count is not None and got < args.count:
                    print(
                        f"roost sub: timed out after {args.timeout} s with {got} of {args.count} messages",
                        file=sys.stderr,
                    )
                    return 1
        return 0

    return _run(main)


def cmd_request(args: argparse.Namespace) -> int:
    async def main() -> int:
        async with Client(args.node) as c:
            try:
                reply = await c.request(args.topic, args.message, timeout=args.timeout, key=args.key,
                                        tags=dict(args.tag) or None)  # fmt: skip
            except TimeoutError as exc:
                print(f"roost request: {exc} (is a replier subscribed? roost reply {args.topic} --echo)",
                      file=sys.stderr)  # fmt: skip
                return 1
        sys.stdout.buffer.write(reply.payload + b"\n")
        sys.stdout.flush()
        return 0

    return _run(main)


def cmd_reply(args: argparse.Namespace) -> int:
    def run_command(payload: bytes) -> bytes | None:
        """CMD's output without its last newline (as ``$(CMD)`` in a shell); None when CMD failed:
        a request that gets no answer times out, where an answer would pass a failure off as one."""
        try:
            r = subprocess.run(args.command, shell=True, input=payload, capture_output=True,
                               timeout=args.command_timeout)  # fmt: skip
        except subprocess.TimeoutExpired:
            print(f"roost reply: the command ran over {args.command_timeout} s; no answer", file=sys.stderr)
            return None
        if r.returncode != 0:
            print(f"roost reply: the command exited with {r.returncode}; no answer: "
                  f"{r.stderr.decode(errors='replace').strip()[-200:]}", file=sys.stderr)  # fmt: skip
            return None
        return r.stdout[:-1] if r.stdout.endswith(b"\n") else r.stdout

    async def main() -> int:
        answered = 0
        async with Client(args.node) as c, c.subscribe(args.topic) as sub:
            print(f"roost reply: answering requests on {args.topic} at node {c.session.node_id}",
                  file=sys.stderr, flush=True)  # fmt: skip
            async for msg in sub:
                if not isinstance(msg, Request):
                    print(f"roost reply: a message on {args.topic} asks for no answer; ignored", file=sys.stderr)
                    continue
                answer = msg.payload if args.echo else await trio.to_thread.run_sync(run_command, msg.payload)
                if answer is None:
                    continue
                try:
                    await msg.respond(answer)
                except (WireError, ValueError) as exc:  # (too large, say: this request goes unanswered)
                    print(f"roost reply: cannot answer: {exc}", file=sys.stderr)
                    continue
                answered += 1
                if args.count is not None and answered >= args.count:
                    break
            else:
                print(f"roost reply: subscription ended: {sub.reason}", file=sys.stderr)
                return 1
        return 0

    return _run(main)


def cmd_get(args: argparse.Namespace) -> int:
    start: str | int | datetime.datetime = args.start
    if args.start.isdigit():
        start = int(args.start)
    elif args.start not in ("earliest", "latest"):
        try:
            start = datetime.datetime.fromisoformat(args.start)
        except ValueError:
            refuse(f"roost get: --start must be earliest, latest, an offset or an ISO 8601 time, not {args.start!r}")

    async def main() -> int:
        out = sys.stdout.buffer
        async with Client(args.node, offsets_dir=args.offsets_dir) as c:
            got = await c.get(args.topic, args.durable, args.count, start=start, timeout=args.timeout,
                              client=args.client)  # fmt: skip
            for m in got:
                out.write(m.payload + b"\n")
            out.flush()
            if got and not await c.commit(args.topic, args.durable, client=args.client):
                raise NodeLost("the cursor could not be committed: the next get repeats these")
        if len(got) < args.count:
            print(f"roost get: timed out after {args.timeout} s with {len(got)} of {args.count} messages",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0

    return _run(main)


def _run(main: Any) -> int:
    try:
        return int(trio.run(main))
    except (NodeLost, ClientClosed) as exc:
        print(f"roost: {exc}", file=sys.stderr)
        return 3
    except TimeoutError as exc:
        print(f"roost: {exc}", file=sys.stderr)
        return 1
    except (WireError, ValueError, OSError) as exc:
        print(f"roost: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
