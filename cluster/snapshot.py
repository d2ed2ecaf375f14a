"""The snapshot file of a member: its whole replicated state, for a cold start.

Format 3: a msgpack header ``[3, member id, unix time written]`` followed by
msgpack arrays of replication entries (the same entries as PUSH and DUMP
frames carry), so reading one back is a merge like any other. A member writes
it every ``snapshot_interval`` when its state changed, and when it stops; the
runner writes it to a temporary file, fsyncs, renames and fsyncs the
directory, so a crash leaves the previous snapshot or the new one, never half.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import msgpack

from cluster.peerwire import PeerProtocolError, check_entries
from cluster.replication import chunked

SNAPSHOT_FILE = "state.msgpack"
SNAPSHOT_FORMAT = 3  # 3: entries carry the client session; 2 (without it) is still read


def snapshot_chunks(member: str, wall: float, entries: Iterable[Any], chunk: int) -> Iterator[bytes]:
    """The file's bytes, lazily: a header, then one msgpack array per chunk."""
    yield msgpack.packb([SNAPSHOT_FORMAT, member, wall], use_bin_type=True)
    for batch in chunked(entries, chunk):
        yield msgpack.packb(batch, use_bin_type=True)


def decode_untrusted_snapshot(data: bytes) -> tuple[float, list[list[tuple[Any, ...]]]]:
    """(unix time written, validated entry chunks); ValueError for anything else.

    A snapshot on disk is as untrusted as a peer: a torn or edited file must
    not put garbage into the state.
    """
    try:
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=max(len(data), 1024))
        unpacker.feed(data)
        header = next(unpacker)
        if not isinstance(header, list) or len(header) != 3 or header[0] not in (2, SNAPSHOT_FORMAT):
            raise ValueError(f"not a snapshot of format 2 or {SNAPSHOT_FORMAT}")
        written = header[2]
        if not isinstance(written, (int, float)):
            raise ValueError("malformed snapshot header")
        if header[0] == 2:
            return float(written), [check_entries([[*e, 0] if isinstance(e, list) else e for e in c])
                                    for c in unpacker]  # fmt: skip
        return float(written), [check_entries(c) for c in unpacker]
    except PeerProtocolError as exc:
        raise ValueError(f"bad entry: {exc}") from None
    except StopIteration:
        raise ValueError("empty snapshot file") from None
    except (msgpack.UnpackException, TypeError) as exc:
        raise ValueError(f"undecodable: {exc.__class__.__name__}") from None
