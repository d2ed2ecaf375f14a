"""A durable reader's own record of what it has processed, so that a crash does not repeat it.

The cluster redelivers what a durable subscription has not committed (docs/durable.md). A reader
that processed messages and crashed before its COMMIT reached the cluster gets them again; with an
offsets directory (``Client(offsets_dir=...)``, ``roost get --offsets-dir``) the library first
writes the offset it is about to commit to a file here (write, fsync, rename, fsync the
directory), then commits, and on the next ``get`` drops whatever lies below the offset in the file:
a message is handed to the application once per durable subscription even across a crash between
processing and acknowledgement. What is processed and not yet committed when the process dies is
the application's to make idempotent (or to store with its output, as the Spark source does).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


class OffsetFile:
    """Per (client, subscription, topic): the offset everything before which was processed."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)

    def _path(self, client: str, name: str, topic: str) -> Path:
        key = hashlib.blake2b(f"{client}\0{name}\0{topic}".encode(), digest_size=12).hexdigest()
        return self.dir / f"{key}.offset"

    def load(self, client: str, name: str, topic: str) -> int:
        """The offset recorded, 0 if none; a damaged file is an error naming it (not a silent 0)."""
        p = self._path(client, name, topic)
        try:
            text = p.read_text()
        except FileNotFoundError:
            return 0
        word = text.split("\n", 1)[0]
        if not word.isdigit():
            raise ValueError(f"{p}: not an offset file (first line {word[:40]!r}); delete it to start over")
        return int(word)

    def save(self, client: str, name: str, topic: str, offset: int) -> None:
        """Record ``offset`` durably (blocking: call it in a worker thread)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        p = self._path(client, name, topic)
        tmp = p.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(f"{offset}\n{client}\n{name}\n{topic}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
