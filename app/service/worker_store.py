"""What the workers of one server share without Redis: small text values in files.

``WorkerStore(directory)`` has the calls ``KnowledgeShare`` needs of a cache (``get``, ``set`` and
``compare_and_set``): one file per key under the directory ``ctxproxy serve --workers N`` created
for this run (``CTXPROXY_WORKER_DIR``), written by an atomic rename, so a reader sees a whole value or
the previous one; a compare-and-set holds an exclusive lock on the directory's lock file
(``fcntl.flock``) from its read to its rename, so two workers never write over each other's
update. The directory lives as long as the server, so TTLs are not kept. Values are what
``KnowledgeShare`` writes: numbers only (learned windows, calibration ratios). Never raises: a
failed read is a miss, a failed write is dropped (what was learned stays in this worker).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
from pathlib import Path

logger = logging.getLogger("ctxproxy.learning")

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class WorkerStore:
    """See the module docstring."""

    backend = "worker-files"

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        return self.directory / (_UNSAFE.sub("_", key) + ".json")

    async def get(self, key: str) -> str | None:
        return self._read(key)

    def _read(self, key: str) -> str | None:
        try:
            return self._path(key).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        self._write(key, value)

    async def compare_and_set(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> bool:
        """``value`` written only while the file holds ``expected`` (None: no file); True when it was."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.directory / ".lock", "a+b") as lock:
                # Held for a read and a rename, never across an await (another coroutine of this
                # worker cannot wait on it); released when the file closes.
                fcntl.flock(lock, fcntl.LOCK_EX)
                if self._read(key) != expected:
                    return False
                return self._write(key, value)
        except OSError as exc:
            logger.debug("locking %s for the other workers failed (%s)", self.directory, exc)
            return False

    def _write(self, key: str, value: str) -> bool:
        path = self._path(key)
        scratch = path.with_name(f".{os.getpid()}.{path.name}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            scratch.write_text(value, encoding="utf-8")
            os.replace(scratch, path)
        except OSError as exc:
            logger.debug("writing %s for the other workers failed (%s)", path.name, exc)
            return False
        return True
