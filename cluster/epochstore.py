"""The map epochs' ceiling on a real disk: ``<data_dir>/map_epoch`` (partitioned mode).

Theory of operation
-------------------
A member hands out cluster maps whose epochs must rise forever, across restarts too
(cluster/partitionmap.py): every epoch it has handed out in any life is at or below the ceiling
this file holds. The member's shell (cluster/server.py) reads it before its core starts
(``read``, fed to the core as ``LogsRead.epochs``), and writes a new one whenever the core asks
(``PersistEpochs``), answering ``EpochsPersisted`` only once it is on disk. The core reserves
epochs in blocks (``EPOCH_BLOCK``), so this is written about once per thousand maps, never on
a client's path. Like cluster/raftstore.py this is blocking file I/O that decides nothing: the
shell runs it in a worker thread.

The file is ``EPOCH_MAGIC | u32 CRC32C of the rest | u64 ceiling``, big-endian, written whole
with cluster/raftstore.py's ``replace_file`` (a temporary file, fsynced, renamed over it, the
directory fsynced): a crash leaves the old ceiling or the new one. A missing file is a member
that never handed out a map (ceiling 0). A file that does not decode (or is longer than any we
write), or holds a ceiling outside ``[1, MAX_EPOCH - EPOCH_BLOCK]`` (no block left to reserve
above it), stops the start with an error naming it: a member that forgot its epochs could
hand out a map its clients take for an old one, and silently so, which is worse than a member
that will not start. The error says the way out: restore the file, or remove it
and start the member while its peers run (it starts above the epochs it hears from them).

The simulator's disk for it is sim/epochdisk.py.
"""

from __future__ import annotations

import struct
from pathlib import Path

from roost.cluster.partitionmap import EPOCH_BLOCK, MAX_EPOCH
from roost.cluster.raftstore import replace_file, seal, unseal
from roost.node.segmentlog import sync_dir

EPOCH_FILE = "map_epoch"  # under the member's data_dir
EPOCH_MAGIC = b"RME1"  # the map epochs' ceiling, format 1
CEILING = struct.Struct(">Q")
FILE_LIMIT = len(EPOCH_MAGIC) + 4 + CEILING.size  # (every file we write is this long)


class EpochStoreError(Exception):
    """The ceiling cannot be read (a damaged file, named) or written (the file and the OS error)."""


def encode_ceiling(ceiling: int) -> bytes:
    """``EPOCH_MAGIC | crc | u64 ceiling``."""
    if type(ceiling) is not int or not 1 <= ceiling <= MAX_EPOCH:
        raise ValueError(f"a ceiling of {ceiling!r}: not an integer in [1, {MAX_EPOCH}]")
    return seal(EPOCH_MAGIC, CEILING.pack(ceiling))


def decode_ceiling_untrusted(data: bytes) -> int:
    """The ceiling in a ``map_epoch`` file's bytes; ValueError for anything else."""
    body = unseal(EPOCH_MAGIC, data)
    if len(body) != CEILING.size:
        raise ValueError(f"a body of {len(body)} bytes, not {CEILING.size}")
    (ceiling,) = CEILING.unpack(body)
    if not 1 <= ceiling <= MAX_EPOCH - EPOCH_BLOCK:  # (above, no block is left to reserve: epochs run out)
        raise ValueError(f"a ceiling of {ceiling}, outside [1, {MAX_EPOCH - EPOCH_BLOCK}]")
    return int(ceiling)


class EpochStore:
    """One member's ceiling in ``directory`` (the shell passes its data_dir)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.path = directory / EPOCH_FILE

    def read(self) -> int:
        """The ceiling stored (0: no file); ``EpochStoreError`` naming the file otherwise."""
        try:
            with self.path.open("rb") as f:
                raw = f.read(FILE_LIMIT + 1)  # (a file longer than any we write is damaged: not read whole)
        except FileNotFoundError:
            return 0
        except OSError as e:
            raise EpochStoreError(f"{self.path}: {e.strerror or e}") from e
        try:
            return decode_ceiling_untrusted(raw)
        except ValueError as e:
            raise EpochStoreError(f"{self.path}: damaged, refusing to start without it: {e} (the member's map "
                                  f"epochs must stay above those it handed out before: restore the file, or "
                                  f"remove it and start the member while its peers run, whose epochs it then "
                                  f"starts above)") from None  # fmt: skip

    def write(self, ceiling: int) -> None:
        """Store ``ceiling`` durably (it is on disk when this returns); ``EpochStoreError`` if not."""
        try:
            data = encode_ceiling(ceiling)
        except ValueError as e:
            raise EpochStoreError(f"{self.path}: {e}") from None
        try:
            if not self.dir.exists():
                self.dir.mkdir(parents=True, exist_ok=True)
                sync_dir(self.dir.parent)
            replace_file(self.dir, EPOCH_FILE, data)
        except OSError as e:
            raise EpochStoreError(f"{e.filename or self.path}: {e.strerror or e}") from e
