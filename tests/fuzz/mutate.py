"""What a fuzz step is made of: the plan hypothesis draws, the extreme values, and how a plan
turns a valid frame into a mutated one (structurally, on the decoded msgpack tree, or byte by
byte on the encoder's output). The package's docstring (tests/fuzz/__init__.py) says why.

A plan is three hypothesis-drawn integers ``(a, b, c)``; each target reads them the same way:

- ``a`` (0..255): ``a & 7`` the mutation (``KINDS``), ``(a >> 3) & 7`` the source (which client,
  peer or text address), ``a >> 6`` what follows (``AFTER``: nothing, a legitimate frame, two in
  the same batch, or time passing);
- ``b`` (0..65535): the template (``b % templates``) and then the node of the frame's tree (or
  the byte) the mutation hits;
- ``c`` (0..65535): the value put there (``c % values``), the byte op and byte for byte
  mutations, and the time step (``c >> 12``).

Every choice shrinks to 0: the first template, the first node, value 0, no mutation after.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack
from hypothesis import strategies as st

Plan = tuple[int, int, int]

#: One frame's plan (module docstring), drawn as 5 bytes: one choice for hypothesis to make and
#: shrink instead of three (a third of the cost per frame: 40 against 107 us).
PLAN = st.binary(min_size=5, max_size=5)


def plan_of(x: bytes) -> Plan:
    return x[0], x[1] << 8 | x[2], x[3] << 8 | x[4]


#: A few values of hypothesis's own per example, beside the fixed ones below.
FREE = st.lists(st.one_of(st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=16),
                          st.binary(max_size=32)), max_size=6)  # fmt: skip


def plans(min_size: int, max_size: int) -> st.SearchStrategy[list[Plan]]:
    """A sequence of plans: hypothesis draws lists of about (min + max) / 2 when min is large."""
    return st.lists(PLAN, min_size=min_size, max_size=max_size).map(lambda xs: [plan_of(x) for x in xs])


KINDS = ("replace", "delete", "insert", "wrap", "copy", "neighbour", "bytes", "as-is")
#: What follows a mutated frame (``a >> 6``).
AFTER = ("alone", "then-legit", "batch", "tick")
#: Time steps (``c >> 12``): none, the scale of retransmissions, pings, leases and time-outs.
STEPS = (0.0, 0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 0.02)


def deep(depth: int) -> list[Any]:
    v: list[Any] = []
    for _ in range(depth):
        v = [v]
    return v


#: Integers at every boundary a decoder or a counter may get wrong: msgpack's forms, 2**31,
#: 2**53 (floats), 2**63 (SEQ_LIMIT, int64) and 2**64 - 1 (uint64, the largest msgpack packs).
INTS = [
    0,
    1,
    -1,
    2,
    7,
    127,
    128,
    255,
    256,
    1024,
    65535,
    65536,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**53 + 1,
    2**62,
    2**63 - 2,
    2**63 - 1,
    2**63,
    2**64 - 2,
    2**64 - 1,
    -(2**31),
    -(2**63) + 1,
    -(2**63),
]
FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 0.5, 1e300, 9.3e18, -1.0]
STRINGS = [
    "",
    "t",
    "u",
    "x" * 255,
    "x" * 256,
    "é" * 128,
    "a b",
    "t.*",
    "t.>",
    "a.>",
    ">",
    "*",
    "t\n",
    "\x00",
    "q queue=g",
    "t where a > 1",
    "t where",
    "t queue=",
    "t where a CONTAINS 5",
    "roost.part",
    "a1b2c3d4-2f 0 57 900000",
    "127.0.0.1",
    "::1",
    "localhost",
    "n1",
    "m0",
    "m1",
    "ready",
    "syncing",
    "x" * 4000,
    "x" * 16000,
    "\u2028",
    "ü" * 200,
]
BYTES = [
    b"",
    b"\x00" * 16,
    b"\xff" * 16,
    b"\x00" * 15,
    b"\x00" * 17,
    b"x" * 255,
    b"x" * 256,
    b"\x00" * 4000,
    b"MSG t\nx",
    b"\x94\x01\x01",
    b"x" * 16000,
]
OTHER = [
    None,
    True,
    False,
    [],
    {},
    [None],
    {"": ""},
    {"a": "1"},
    {1: 2},
    {"map": [1]},
    [[1, 2]],
    [[2**63, 0]],
    deep(64),
    deep(500),
    [0] * 1000,
    [[0, 1]] * 100,
    {f"k{i}": "v" for i in range(40)},
]
VALUES: list[Any] = [*INTS, *FLOATS, *STRINGS, *BYTES, *OTHER]


class Values:
    """What a step may put into a frame: the extremes above, a rig's own (other clients' ids), and
    hypothesis's few. Half the time (bit 11 of ``c``) one of the type of the value it replaces:
    an integer field gets the boundary integers, a string field the odd strings."""

    def __init__(self, *groups: list[Any]) -> None:
        self.all = [v for g in groups for v in g]
        self.by_type: dict[type, list[Any]] = {}
        for v in self.all:
            self.by_type.setdefault(v.__class__, []).append(v)

    def pick(self, c: int, like: Any = None) -> Any:
        """One of them; a container as a copy of its own (a later change must not reach the table)."""
        pool = self.by_type.get(like.__class__) if c & 0x800 else None
        return fresh(pool[c % len(pool)] if pool else self.all[c % len(self.all)])


def fresh(v: Any) -> Any:
    """A list or map copied (through msgpack: C, iterative; copy.deepcopy recurses too deep for
    ``deep(500)``), anything else as it is; ``[]`` for what msgpack cannot copy (nested deeper)."""
    if v.__class__ is not list and v.__class__ is not dict:
        return v
    try:
        return msgpack.unpackb(msgpack.packb(v, use_bin_type=True), raw=False, strict_map_key=False)
    except (ValueError, OverflowError, TypeError):
        return []


#: Added to an integer (``neighbour``): off by one at every boundary above.
DELTAS = (1, -1, 2**32, 2**63, -(2**63), 2**62 + 1, -2, 256)


def packable(v: Any) -> bool:
    """msgpack (what every sender uses) can carry ``v``: an int in -2**63 .. 2**64-1."""
    return v.__class__ is not int or -(2**63) <= v < 2**64


# ---------------------------------------------------------------- structural mutation


class Slot(NamedTuple):
    """One place in a frame's tree: ``holder[key]``."""

    holder: Any
    key: Any


def slots(tree: Any) -> list[Slot]:
    """Every place in ``tree`` (lists and maps, pre-order), the root's own elements first."""
    out: list[Slot] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if node.__class__ is list:
            places = [Slot(node, i) for i in range(len(node))]
        elif node.__class__ is dict:
            places = [Slot(node, k) for k in node]
        else:
            continue
        out += places
        stack.extend(reversed([p.holder[p.key] for p in places]))
    return out


def _neighbour(v: Any, c: int) -> Any:
    if v.__class__ is int:
        return v + DELTAS[c % len(DELTAS)]
    if v.__class__ is str:
        return (v + "x", v[:-1], v * 2, v + " ", v.upper())[c % 5]
    if v.__class__ is bytes:
        return (v + b"x", v[:-1], v * 2, b"")[c % 4]
    if v.__class__ is float:
        return (-v, v * 2**64, math.nextafter(v, math.inf), float(int(v)) if math.isfinite(v) else 0.0)[c % 4]
    if v.__class__ is bool:
        return not v
    if v.__class__ is list:
        return v + v if c & 1 else v[1:]
    return None


def mutate_tree(tree: Any, kind: str, where: int, values: Values, c: int) -> str:
    """Change ``tree`` in place by one ``kind`` (``KINDS``) at its ``where``-th slot (modulo);
    returns what it did, for the trace of a failing run."""
    places = slots(tree)
    if not places:
        return "no slot"
    s = places[where % len(places)]
    old = s.holder[s.key]
    value = values.pick(c, old)
    if kind == "replace":
        s.holder[s.key] = value
    elif kind == "delete":
        del s.holder[s.key]
        return f"delete {_short(old)} at {s.key!r}"
    elif kind == "insert":
        if s.holder.__class__ is list:
            s.holder.insert(s.key, value)
        else:
            s.holder[value if value.__class__ in (str, bytes, int) else str(value)[:32]] = old
        return f"insert {_short(value)} at {s.key!r}"
    elif kind == "wrap":
        s.holder[s.key] = (deep(200) if c & 1 else [old]) if c & 2 else [old, old]
    elif kind == "copy":  # (a copy, not the node itself: an ancestor put below itself would make a cycle)
        src = places[c % len(places)]
        s.holder[s.key] = fresh(src.holder[src.key])
    else:
        s.holder[s.key] = _neighbour(old, c)
    return f"{kind} at {s.key!r}: {_short(old)} -> {_short(s.holder[s.key])}"


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def mutate_bytes(data: bytes, where: int, c: int) -> tuple[bytes, str]:
    """One byte-level change of ``data``: overwrite, insert, delete, truncate or flip a bit."""
    if not data:
        return bytes([c & 255]), "one byte"
    pos, byte, op = where % len(data), (c >> 3) & 255, c % 5
    if op == 0:
        return data[:pos] + bytes([byte]) + data[pos + 1 :], f"byte {pos} = {byte:#x}"
    if op == 1:
        return data[:pos] + bytes([byte]) + data[pos:], f"insert {byte:#x} at {pos}"
    if op == 2:
        return data[:pos] + data[pos + 1 :], f"delete byte {pos}"
    if op == 3:
        return data[:pos], f"truncate at {pos}"
    return data[:pos] + bytes([data[pos] ^ (1 << (byte & 7))]) + data[pos + 1 :], f"flip a bit of byte {pos}"


class Mutated(NamedTuple):
    data: bytes
    what: str  # for the trace


def mutate_packed(data: bytes, kind: str, where: int, values: Values, c: int,
                  unpack: Callable[[bytes], Any] | None = None,
                  pack: Callable[[Any], bytes] | None = None) -> Mutated:  # fmt: skip
    """``data`` (an encoder's msgpack frame) mutated by ``kind``: byte ops on ``data`` itself, the
    others on its decoded tree, packed again (``unpack``/``pack`` for framings around msgpack,
    the peer links' length prefix). A tree msgpack cannot pack goes as it was."""
    if kind == "bytes":
        return Mutated(*mutate_bytes(data, where, c))
    if kind == "as-is":
        return Mutated(data, "as is")
    tree = unpack(data) if unpack is not None else msgpack.unpackb(data, raw=False, strict_map_key=False)
    what = mutate_tree(tree, kind, where, values, c)
    try:
        out = pack(tree) if pack is not None else msgpack.packb(tree, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return Mutated(data, what + " (unpackable: sent as it was)")
    return Mutated(out, what)


# ---------------------------------------------------------------- text lines

_TOKENS = re.compile(rb"([ \t\n\x0b\f\r]+)")
SEPARATORS = (b" ", b"\t", b"\n", b"", b"\r\n", b"\xc2\xa0", b" \x0b ", b"\x00")


def mutate_text(line: bytes, kind: str, where: int, values: Values, c: int) -> Mutated:
    """A FASTPUSS line mutated by its tokens (verb, topic, body) and the whitespace between them:
    a token replaced by an extreme value, dropped, doubled, or a separator changed."""
    if kind == "bytes":
        return Mutated(*mutate_bytes(line, where, c))
    if kind == "as-is":
        return Mutated(line, "as is")
    parts = _TOKENS.split(line)  # tokens at even indexes, separators between
    i = where % len(parts)
    if i % 2:
        parts[i] = SEPARATORS[c % len(SEPARATORS)]
    elif kind == "delete":
        parts[i] = b""
    elif kind in ("wrap", "copy"):
        parts[i] = parts[i] * (2 + c % 3)
    elif kind == "neighbour":
        parts[i] = parts[i] + b"x" if c & 1 else parts[i][:-1]
    else:
        value = values.pick(c, "")
        v = value if value.__class__ in (str, bytes) else str(value)
        parts[i] = v if v.__class__ is bytes else v.encode("utf-8", "surrogatepass")
    return Mutated(b"".join(parts), f"{kind} token {i // 2}")
