"""Regenerate the parts of docs/ that are derived from code.

    python scripts/gen_docs.py          # rewrite docs in place
    python scripts/gen_docs.py --check  # exit 1 if docs are out of date (a test runs this)

Generated blocks sit between ``<!-- BEGIN name -->`` and ``<!-- END name -->``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from roost.client import (  # noqa: E402
    clustermap,
    decoding,
    wire,
)
from roost.client.wire import ErrorCode, FrameType  # noqa: E402
from roost.cluster.config import CLUSTER_SETTINGS  # noqa: E402
from roost.node.config import config_doc  # noqa: E402

CID = bytes.fromhex("c1" * 16)
COOKIE = bytes.fromhex("5e" * 16)
PID = bytes.fromhex("d0" * 16)
SESSION = 1_767_225_600_000  # a client session: the Unix milliseconds the client process started
MSG = wire.pack_message("prices", "EUR", {"src": "ecb"}, b"1.08")
TWO = {"n1": (("127.0.0.1", 7401), ("127.0.0.1", 7501)), "n2": (("127.0.0.1", 7402), ("127.0.0.1", 7502))}
CMAP = clustermap.compute(3, TWO, {"n2"}, 256, 2)  # n1 down: n2 leads every partition

EXAMPLES: list[tuple[FrameType, str, bytes]] = [
    (FrameType.HELLO, "client id c1..c1, padded to 256 bytes", wire.encode_hello(CID)),
    (FrameType.WELCOME, "node n1, cookie 5e..5e, params, one member",
     wire.encode_welcome("n1", COOKIE, {"max_datagram": 16384, "ping_interval": 0.5},
                         [["n1", "127.0.0.1", 7400]])),
    (FrameType.CMDS, f"session {SESSION}, batch 1: SUB prices (reliable), SUB prices/EUR (fire), UNSUB news",
     wire.encode_cmds(CID, COOKIE, SESSION, 1, [(1, "prices", None, 1), (1, "prices", "EUR", 0),
                                                (0, "news", None, 0)])),
    (FrameType.CMDACK, f"session {SESSION}, batch 1: ok, ok, ok", wire.encode_cmdack(SESSION, 1, [0, 0, 0])),
    (FrameType.PUB, "producer d0..d0, sequence 7, floor 7, reliable, one message",
     wire.encode_pub(CID, COOKIE, PID, 7, 7, True, [MSG])),
    (FrameType.PUBACK, "producer d0..d0 acknowledged through 7", wire.encode_puback(PID, 7)),
    (FrameType.MSGS, "stream 65537, sequence 1, one reliable message from producer d0..d0, its seq 7",
     wire.encode_msgs(65537, 1, [wire.pack_delivery("prices", "EUR", {"src": "ecb"}, b"1.08", PID, 7)])),
    (FrameType.ACK, "stream 65537: processed through 1, also holds 3..4",
     wire.encode_ack(CID, COOKIE, 65537, 1, [[3, 4]])),
    (FrameType.PING, "token 42", wire.encode_ping(CID, COOKIE, 42)),
    (FrameType.PONG, "token 42, client known, cookie, no cancellations",
     wire.encode_pong(42, True, COOKIE, [])),
    (FrameType.CANCEL, "prices cancelled: out_of_capacity",
     wire.encode_cancel("prices", None, "out_of_capacity")),
    (FrameType.REDIRECT, "from n2: the map of epoch 3, 256 partitions, 2 replicas, members n1 (down) and n2",
     wire.encode_redirect("n2", clustermap.encode(CMAP))),
    (FrameType.ERROR, "bad_cookie", wire.encode_error(ErrorCode.BAD_COOKIE, "send HELLO")),
    (FrameType.STATUS, "what does this node know?", wire.encode_status(CID, COOKIE)),
    (FrameType.STATUS_REPLY, "a (shortened) status map",
     wire.encode_status_reply({"node": "n1", "state": "ready", "subscriptions": 3})),
    (FrameType.MAP, "send me your cluster map", wire.encode_map_request(CID, COOKIE)),
    (FrameType.BYE, "the client closed (session 1764000000000)", wire.encode_bye(CID, COOKIE, 1764000000000)),
    (FrameType.PUBRUN, "fire producer d0..d0, sequence 3, two messages of prices (payloads 1.08 and 1.09)",
     wire.encode_pubrun(CID, COOKIE, PID, 3, "prices", [b"1.08", b"1.09"])),
    (FrameType.MSGSRUN, "fire datagram 65537, two messages of prices (as the PUBRUN above is relayed)",
     wire.msgsrun_header(65537) + wire.run_body("prices", [b"1.08", b"1.09"])[1]),
]  # fmt: skip


def hexdump(data: bytes) -> str:
    lines = []
    for i in range(0, len(data), 16):
        chunk = data[i : i + 16]
        asc = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{i:04x}  {chunk.hex(' '):<47}  {asc}")
    return "\n".join(lines)


def protocol_examples() -> str:
    out = []
    for ftype, what, data in EXAMPLES:
        decoded = decoding.decode_untrusted_frame(data)
        shown = hexdump(data) if ftype is not FrameType.HELLO else hexdump(data[:48]) + "\n....  (zero padding)"
        out.append(f"### {ftype.name} ({int(ftype)}): {what}\n\n{len(data)} bytes:\n\n```\n{shown}\n```\n\n"
                   f"decodes to `{decoded!r}`\n")  # fmt: skip
    return "\n".join(out)


BLOCKS: dict[str, dict[str, Callable[[], str]]] = {
    "docs/protocol.md": {"examples": protocol_examples},
    "docs/configuration.md": {"settings": config_doc, "cluster_settings": lambda: config_doc(CLUSTER_SETTINGS)},
}


def render(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    if not rest:
        raise SystemExit(f"marker {begin} missing")
    return f"{head}{begin}\n{body}{end}{tail}"


def main() -> int:
    check = "--check" in sys.argv
    stale = []
    for rel, blocks in BLOCKS.items():
        path = os.path.join(ROOT, rel)
        with open(path) as f:
            text = f.read()
        new = text
        for name, fn in blocks.items():
            new = render(new, name, fn())
        if new != text:
            stale.append(rel)
            if not check:
                with open(path, "w") as f:
                    f.write(new)
    if check and stale:
        print("out of date, run scripts/gen_docs.py: " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
