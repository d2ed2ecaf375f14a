"""The snapshot file of a member: its whole replicated state, for a cold start.

Format 5: a msgpack header ``[5, member id, unix time written, roster entries]`` (the
joins and leaves, cluster/roster.py), msgpack
arrays of replication entries (the same entries as PUSH and DUMP frames
carry), so reading one back is a merge like any other, and a trailer: the
number of entries, as a msgpack integer. A file is loaded whole or not at all:
without the trailer, with bytes after it or with another count it is refused,
so a cut at a chunk boundary cannot pass for a smaller state. Formats 3 (no
trailer) and 2 (entries without the session) are still read, and 4 (no roster). A member writes
it every ``snapshot_interval`` when its state changed, and when it stops; the
runner writes it to a temporary file, fsyncs, renames and fsyncs the
directory, so a crash leaves the previous snapshot or the new one, never half.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import msgpack

from roost.cluster.peerwire import PeerProtocolError, check_entries_untrusted
from roost.cluster.replication import chunked
from roost.cluster.roster import Entry, RosterError, decode_untrusted_roster

SNAPSHOT_FILE = "state.msgpack"
SNAPSHOT_FORMAT = 5  # 5: the roster in the header; 4: a trailer with the entry count; 3: no trailer;
READ_FORMATS = (2, 3, 4, SNAPSHOT_FORMAT)  # 2: entries without the session


def snapshot_chunks(member: str, wall: float, entries: Iterable[Any], chunk: int,
                    roster: list[list[Any]] | None = None) -> Iterator[bytes]:  # fmt: skip
    """The file's bytes, lazily: a header, one msgpack array per chunk, the count."""
    yield msgpack.packb([SNAPSHOT_FORMAT, member, wall, roster or []], use_bin_type=True)
    count = 0
    for batch in chunked(entries, chunk):
        count += len(batch)
        yield msgpack.packb(batch, use_bin_type=True)
    yield msgpack.packb(count)


def decode_untrusted_snapshot(data: bytes) -> tuple[float, list[list[tuple[Any, ...]]], list[tuple[str, Entry]]]:
    """(unix time written, validated entry chunks, roster entries); ValueError for anything else.

    A snapshot on disk is as untrusted as a peer: a torn or edited file must
    not put garbage into the state.
    """
    try:
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=max(len(data), 1024))
        unpacker.feed(data)
        header = next(unpacker)
        if not isinstance(header, list) or len(header) != (4 if header[:1] == [5] else 3) \
                or header[0] not in READ_FORMATS:  # fmt: skip
            raise ValueError(f"not a snapshot of format {', '.join(map(str, READ_FORMATS))}")
        fmt, written = header[0], header[2]
        roster = decode_untrusted_roster(header[3]) if fmt == 5 else []
        if not isinstance(written, (int, float)):
            raise ValueError("malformed snapshot header")
        chunks: list[list[tuple[Any, ...]]] = []
        count: int | None = None
        for obj in unpacker:
            if count is not None:
                raise ValueError("data after the trailer")
            if fmt >= 4 and isinstance(obj, int) and not isinstance(obj, bool):
                count = obj
            elif fmt == 2 and isinstance(obj, list):
                chunks.append(check_entries_untrusted([[*e, 0] if isinstance(e, list) else e for e in obj]))
            else:
                chunks.append(check_entries_untrusted(obj))
        if unpacker.tell() != len(data):
            raise ValueError(f"truncated: {len(data) - unpacker.tell()} bytes of a cut-off record at the end")
        if fmt >= 4 and count != sum(map(len, chunks)):
            raise ValueError(
                "truncated: no trailer"
                if count is None
                else f"the trailer counts {count} entries, the file holds {sum(map(len, chunks))}"
            )
        return float(written), chunks, roster
    except PeerProtocolError as exc:
        raise ValueError(f"bad entry: {exc}") from None
    except RosterError as exc:
        raise ValueError(f"bad roster: {exc}") from None
    except StopIteration:
        raise ValueError("empty snapshot file") from None
    except (msgpack.UnpackException, TypeError) as exc:
        raise ValueError(f"undecodable: {exc.__class__.__name__}") from None
