"""The metadata quorum's Raft messages and their wire form, validated as untrusted input.

A message travels as a msgpack list ``[kind, field, ...]`` (``encode``); what a
peer sends is checked field by field before the core sees it
(``decode_untrusted_raft``), because a Raft core trusts terms and indexes: a
term near 2**64 would stop every later election, an index past the end of any
plausible log would make a follower cut its log where it must not. Every
integer is range-checked, every byte string bounded, and the relations a
correct sender always keeps (an entry's term is at most the message's, the
terms of a batch never fall, index 0 has term 0) are refused when broken,
with a ``RaftFormatError`` that says which.

Two fields go beyond the Raft paper. ``AppendEntries.seq`` is a number the
leader gives each AppendEntries, echoed by ``AppendReply.seq``: the leader's
lease (cluster/raft.py) counts an acknowledgement by when the leader SENT what
it acknowledges, which a reply can only tell by naming the request.
``AppendReply.hint`` is where the leader should retry after a refusal (the
fast back-off by term of the paper's section 5.3).
"""

from __future__ import annotations

from typing import Any, NamedTuple

MAX_TERM = (1 << 62) - 1  # far beyond any real count of elections, and far from overflowing anything
MAX_INDEX = (1 << 62) - 1
MAX_SEQ = (1 << 63) - 1
MAX_COMMAND_BYTES = 1 << 16  # RaftSettings.max_command_bytes' default
MAX_ENTRIES = 1 << 16  # entries in one AppendEntries (RaftSettings.max_append_entries is far below)
MAX_SNAPSHOT_BYTES = 1 << 26  # the metadata of a cluster is small: a snapshot travels in one message


class RaftFormatError(ValueError):
    """A Raft message that no correct peer sends."""


class RequestVote(NamedTuple):
    term: int  # for a PreVote: the term the candidate would campaign in (its own + 1), not raised yet
    last_index: int
    last_term: int
    prevote: bool


class VoteReply(NamedTuple):
    term: int  # for a granted PreVote: the term asked about
    granted: bool
    prevote: bool


class AppendEntries(NamedTuple):
    term: int
    prev_index: int
    prev_term: int
    entries: list[tuple[int, bytes]]  # (term, command) for prev_index+1, ...
    commit: int
    seq: int = 0  # echoed in the reply: the leader's lease measures by send times


class AppendReply(NamedTuple):
    term: int
    success: bool
    match_index: int  # on success: the follower's log matches the leader's up to here
    hint: int  # on refusal: the next index the leader should try
    seq: int = 0  # the AppendEntries' seq this answers


class InstallSnapshot(NamedTuple):
    term: int
    index: int  # type: ignore[assignment]  # (shadows tuple.index)
    snap_term: int
    data: bytes


class SnapshotReply(NamedTuple):
    term: int
    index: int  # type: ignore[assignment]  # (shadows tuple.index); the snapshot's index the follower now holds


RaftMessage = RequestVote | VoteReply | AppendEntries | AppendReply | InstallSnapshot | SnapshotReply

_KINDS: dict[type, int] = {
    RequestVote: 1,
    VoteReply: 2,
    AppendEntries: 3,
    AppendReply: 4,
    InstallSnapshot: 5,
    SnapshotReply: 6,
}


def encode(msg: RaftMessage) -> list[Any]:
    """The list msgpack packs: the inverse of ``decode_untrusted_raft``."""
    if isinstance(msg, AppendEntries):
        entries = [[t, c] for t, c in msg.entries]
        return [3, msg.term, msg.prev_index, msg.prev_term, entries, msg.commit, msg.seq]
    return [_KINDS[type(msg)], *msg]


def _int(value: Any, what: str, low: int, high: int) -> int:
    if type(value) is not int:  # (bool is an int: refused too)
        raise RaftFormatError(f"{what}: not an integer")
    if not low <= value <= high:
        raise RaftFormatError(f"{what}: {value} out of range [{low}, {high}]")
    return value


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise RaftFormatError(f"{what}: not a boolean")
    return value


def _bytes(value: Any, what: str, limit: int) -> bytes:
    if type(value) is not bytes:
        raise RaftFormatError(f"{what}: not bytes")
    if len(value) > limit:
        raise RaftFormatError(f"{what}: {len(value)} bytes, more than {limit}")
    return value


def _fields(obj: Any, count: int, name: str) -> list[Any]:
    if len(obj) != count + 1:
        raise RaftFormatError(f"{name}: {len(obj) - 1} fields, not {count}")
    return list(obj[1:])


def _position(index: int, term: int, what: str, top: int) -> None:
    """An (index, term) of a log: index 0 is the empty log's (term 0), any other entry has a term."""
    if (index == 0) != (term == 0):
        raise RaftFormatError(f"{what}: index {index} with term {term}")
    if term > top:
        raise RaftFormatError(f"{what}: term {term} above the message's {top}")


def decode_untrusted_raft(obj: Any, max_command_bytes: int = MAX_COMMAND_BYTES) -> RaftMessage:
    """The message ``obj`` (what msgpack decoded) holds, or ``RaftFormatError`` naming what is wrong."""
    if not isinstance(obj, list | tuple) or not obj:
        raise RaftFormatError("not a non-empty list")
    kind = _int(obj[0], "kind", 1, len(_KINDS))
    if kind == 1:
        term, last_index, last_term, prevote = _fields(obj, 4, "RequestVote")
        msg = RequestVote(
            _int(term, "RequestVote.term", 1, MAX_TERM),
            _int(last_index, "RequestVote.last_index", 0, MAX_INDEX),
            _int(last_term, "RequestVote.last_term", 0, MAX_TERM),
            _bool(prevote, "RequestVote.prevote"),
        )
        _position(msg.last_index, msg.last_term, "RequestVote.last", msg.term)
        return msg
    if kind == 2:
        term, granted, prevote = _fields(obj, 3, "VoteReply")
        return VoteReply(_int(term, "VoteReply.term", 0, MAX_TERM), _bool(granted, "VoteReply.granted"),
                         _bool(prevote, "VoteReply.prevote"))  # fmt: skip
    if kind == 3:
        return _append_entries(_fields(obj, 6, "AppendEntries"), max_command_bytes)
    if kind == 4:
        term, success, match_index, hint, seq = _fields(obj, 5, "AppendReply")
        return AppendReply(
            _int(term, "AppendReply.term", 0, MAX_TERM),
            _bool(success, "AppendReply.success"),
            _int(match_index, "AppendReply.match_index", 0, MAX_INDEX),
            _int(hint, "AppendReply.hint", 0, MAX_INDEX),
            _int(seq, "AppendReply.seq", 0, MAX_SEQ),
        )
    if kind == 5:
        term, index, snap_term, data = _fields(obj, 4, "InstallSnapshot")
        snap = InstallSnapshot(
            _int(term, "InstallSnapshot.term", 1, MAX_TERM),
            _int(index, "InstallSnapshot.index", 1, MAX_INDEX),
            _int(snap_term, "InstallSnapshot.snap_term", 1, MAX_TERM),
            _bytes(data, "InstallSnapshot.data", MAX_SNAPSHOT_BYTES),
        )
        _position(snap.index, snap.snap_term, "InstallSnapshot", snap.term)
        return snap
    term, index = _fields(obj, 2, "SnapshotReply")
    return SnapshotReply(_int(term, "SnapshotReply.term", 0, MAX_TERM),
                         _int(index, "SnapshotReply.index", 0, MAX_INDEX))  # fmt: skip


def _append_entries(fields: list[Any], max_command_bytes: int) -> AppendEntries:
    term, prev_index, prev_term, raw_entries, commit, seq = fields
    term = _int(term, "AppendEntries.term", 1, MAX_TERM)
    prev_index = _int(prev_index, "AppendEntries.prev_index", 0, MAX_INDEX)
    prev_term = _int(prev_term, "AppendEntries.prev_term", 0, MAX_TERM)
    _position(prev_index, prev_term, "AppendEntries.prev", term)
    if not isinstance(raw_entries, list | tuple):
        raise RaftFormatError("AppendEntries.entries: not a list")
    if len(raw_entries) > MAX_ENTRIES:
        raise RaftFormatError(f"AppendEntries.entries: {len(raw_entries)} entries, more than {MAX_ENTRIES}")
    if prev_index + len(raw_entries) > MAX_INDEX:
        raise RaftFormatError("AppendEntries.entries: past the largest index")
    entries: list[tuple[int, bytes]] = []
    last = prev_term
    for i, entry in enumerate(raw_entries):
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            raise RaftFormatError(f"AppendEntries.entries[{i}]: not a [term, command] pair")
        t = _int(entry[0], f"AppendEntries.entries[{i}].term", 1, term)
        if t < last:
            raise RaftFormatError(f"AppendEntries.entries[{i}].term: {t} below the previous entry's {last}")
        entries.append((t, _bytes(entry[1], f"AppendEntries.entries[{i}].command", max_command_bytes)))
        last = t
    return AppendEntries(term, prev_index, prev_term, entries, _int(commit, "AppendEntries.commit", 0, MAX_INDEX),
                         _int(seq, "AppendEntries.seq", 0, MAX_SEQ))  # fmt: skip
