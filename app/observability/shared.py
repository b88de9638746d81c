"""The status board of one worker, shared with the other workers of the same server through files.

``ctxproxy serve --workers N`` gives its workers one private directory (``CTXPROXY_WORKER_DIR``).
Each worker's :class:`SharedBoard` writes its board (counters, recent requests, upstream health,
in-flight count) to ``<dir>/<pid>.json`` from a background thread, at most every
``flush_every_s`` and only after a change, by an atomic rename; ``GET /status.json`` on any worker
merges the others' files with its own live board (:func:`merge`). A reader sees another worker's
requests at most ``flush_every_s`` late; Prometheus metrics (multiprocess mode) are exact at once.
Files hold what the status page shows anyway: numbers, model names, request IDs; never content.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger("ctxproxy.observability")


class SharedBoard:
    """Publishes this worker's board and reads the others'; see the module docstring."""

    def __init__(self, directory: Path, *, flush_every_s: float = 0.2) -> None:
        self.directory = directory
        self.flush_every_s = flush_every_s
        self.pid = os.getpid()
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None
        self._dump: Callable[[], Mapping[str, Any]] | None = None
        self._lock = threading.Lock()

    def changed(self, dump: Callable[[], Mapping[str, Any]]) -> None:
        """The board changed: write it (``dump()``) soon. Cheap: sets an event; the first call
        starts the writer thread (a daemon: the files are a view, losing the last write is harmless)."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._dump = dump
                    self.directory.mkdir(parents=True, exist_ok=True)
                    self._thread = threading.Thread(target=self._run, name="ctxproxy-board", daemon=True)
                    self._thread.start()
        self._changed.set()

    def others(self) -> list[dict[str, Any]]:
        """The boards the other live-or-finished workers wrote (unreadable files skipped)."""
        boards = []
        with contextlib.suppress(OSError):
            for path in self.directory.glob("*.json"):
                if path.stem == str(self.pid):
                    continue
                try:
                    board = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if isinstance(board, dict):
                    boards.append(board)
        return boards

    def _run(self) -> None:
        target = self.directory / f"{self.pid}.json"
        scratch = self.directory / f".{self.pid}.json.tmp"
        while True:
            self._changed.wait()
            self._changed.clear()
            try:
                assert self._dump is not None
                scratch.write_text(json.dumps(self._dump()), encoding="utf-8")
                os.replace(scratch, target)
            except Exception:  # the page of one worker must never break its requests
                logger.debug("writing the shared status board failed", exc_info=True)
            time.sleep(self.flush_every_s)


def alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def add_counts(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Add ``other``'s numbers into ``into``, nested dicts key by key (made when missing)."""
    for key, value in other.items():
        if isinstance(value, Mapping):
            add_counts(into.setdefault(key, {}), value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            into[key] = into.get(key, 0) + value


def merge(own: Mapping[str, Any], others: Iterable[Mapping[str, Any]], *, recent_max: int) -> dict[str, Any]:
    """One board from this worker's (``own``, authoritative for itself) and the others': counters
    and upstream call counts summed, recent requests newest first across workers, in-flight summed
    over live workers, the earliest start and the latest upstream answer; ``workers`` counts the
    live ones (every worker publishes its board when it starts)."""
    merged: dict[str, Any] = json.loads(json.dumps(own))
    workers = 1
    for board in others:
        workers += alive(board.get("pid"))
        add_counts(merged["counters"], board.get("counters", {}))
        merged["recent"] = list(merged["recent"]) + list(board.get("recent", []))
        if alive(board.get("pid")):
            merged["in_flight"] += int(board.get("in_flight", 0))
        started = board.get("started_at_s")
        if isinstance(started, int | float):
            merged["started_at_s"] = min(merged["started_at_s"], started)
        mine, theirs = merged["upstream_health"], board.get("upstream_health", {})
        mine["calls"] += int(theirs.get("calls", 0))
        mine["errors"] += int(theirs.get("errors", 0))
        if (theirs.get("last_at_s") or 0) > (mine.get("last_at_s") or 0):
            for key in ("last_status", "last_latency_ms", "last_at_s"):
                mine[key] = theirs.get(key)
    merged["recent"] = sorted(merged["recent"], key=lambda r: r.get("at_s", 0), reverse=True)[:recent_max]
    merged["workers"] = workers
    return merged
