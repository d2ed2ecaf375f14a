"""FASTPUSS text protocol: ``PUB <topic><ws><body>``, ``SUB <topic><ws>``, ``UNSUB``.

The reference broker decodes a datagram as UTF-8 and splits it with Java's
``split("\\\\s+", 3)``: at most three parts, a leading whitespace run yields an
empty first part, and trailing empty parts are kept. So ``SUB t1\\n`` is
``["SUB", "t1", ""]`` (valid) while ``SUB t1`` has only two parts (malformed),
and the body keeps its trailing whitespace but loses the whitespace run that
separates it from the topic. We reproduce that byte for byte; where the
reference silently misbehaves (bad UTF-8, a missing separator) we answer with a
one-line ``ERR <code> <text>`` instead.
"""

from __future__ import annotations

import re

from roost.client.wire import MAX_TOPIC_BYTES, WHITESPACE, ErrorCode, WireError

_SPLIT = re.compile(WHITESPACE.pattern + "+")

VERBS = ("PUB", "SUB", "UNSUB")


def parse_untrusted_text(data: bytes) -> tuple[str, str, str]:
    """Return ``(verb, topic, body)`` of a client datagram or raise WireError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(ErrorCode.BAD_UTF8, "datagram is not valid UTF-8") from None
    parts = _SPLIT.split(text, maxsplit=2)
    verb = parts[0]
    if verb not in VERBS:
        if verb == "MSG":
            raise WireError(ErrorCode.UNKNOWN_VERB, "MSG is sent by nodes, not clients")
        raise WireError(ErrorCode.UNKNOWN_VERB, f"unknown verb {verb[:16]!r}; use PUB, SUB or UNSUB")
    if len(parts) < 3:
        raise WireError(ErrorCode.MALFORMED, f"{verb} needs whitespace after the topic")
    topic = parts[1]
    if len(topic.encode()) > MAX_TOPIC_BYTES:
        raise WireError(ErrorCode.BAD_TOPIC, f"topic longer than {MAX_TOPIC_BYTES} bytes")
    return verb, topic, parts[2]


def encode_text_msg(topic: str, body: bytes) -> bytes:
    """What a text subscriber receives: ``MSG <topic>\\n<body>``."""
    return b"MSG " + topic.encode() + b"\n" + body


def encode_text_error(code: ErrorCode, text: str) -> bytes:
    return f"ERR {code.name.lower()} {text}".encode()


def encode_text_command(verb: str, topic: str, body: str = "") -> bytes:
    """A client-side helper: the datagram a FASTPUSS client would send."""
    return f"{verb} {topic}\n{body}".encode()
