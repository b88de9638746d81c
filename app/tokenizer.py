"""Exact token counting with tiktoken, built offline from the vocabularies shipped in ``app/vocab``.

This is the only module that imports ``tiktoken``. The two vocabularies (``o200k_base``,
``cl100k_base``) are package data: gzip-compressed ``.tiktoken`` files whose *decompressed* bytes
must hash (SHA-256) to the values in ``app/vocab/SHA256SUMS`` (the same values as tiktoken's own
``expected_hash``). tiktoken's download path (``tiktoken.load.read_file``) is never used, so the
proxy never touches the network for its tokenizer. Nothing is loaded at import time: call
:func:`preload` at start-up, or let the first :func:`load_encoding` do it (cached, thread-safe).

Errors::

    VocabularyError        unknown encoding name, missing/corrupt vocabulary file, hash mismatch

Counting a large cold request uses every CPU the process may use: tiktoken encodes outside the
GIL, so :meth:`TiktokenCounter.count_texts` (the core's ``BatchCounter``) spreads a batch of
``PARALLEL_MIN_CHARS`` or more over a bounded pool of threads (:class:`CountingPool`, one per
process, :func:`counting_pool`). Its size is :func:`usable_cpus` (the affinity mask, capped by the
cgroup's CPU quota: v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``), or what
:func:`configure_counting` sets (``CTXPROXY_COUNT_THREADS``). One batch keeps at most that many
chunks in flight, so batches of concurrent requests take turns; a smaller batch is counted in
the calling thread.

Public API: :func:`load_encoding`, :func:`load_ranks`, :class:`TiktokenCounter`,
:func:`counter_for`, :func:`preload`, :func:`loaded_encodings`, :data:`ENCODING_NAMES`,
:func:`usable_cpus`, :class:`CountingPool`, :func:`counting_pool`, :func:`configure_counting`.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import tiktoken

from .core.errors import CtxproxyError
from .core.estimate import EstimateCounter
from .core.tokens import TokenCounter

ENDOFTEXT = "<|endoftext|>"
FIM_PREFIX = "<|fim_prefix|>"
FIM_MIDDLE = "<|fim_middle|>"
FIM_SUFFIX = "<|fim_suffix|>"
ENDOFPROMPT = "<|endofprompt|>"

# Copied from tiktoken_ext/openai_public.py (tiktoken 0.14); tests/test_tokenizer.py asserts they
# still equal tiktoken's own definitions.
_CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT_STR = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

PAT_STRS: dict[str, str] = {"o200k_base": _O200K_PAT_STR, "cl100k_base": _CL100K_PAT_STR}
SPECIAL_TOKENS: dict[str, dict[str, int]] = {
    "o200k_base": {ENDOFTEXT: 199999, ENDOFPROMPT: 200018},
    "cl100k_base": {
        ENDOFTEXT: 100257,
        FIM_PREFIX: 100258,
        FIM_MIDDLE: 100259,
        FIM_SUFFIX: 100260,
        ENDOFPROMPT: 100276,
    },
}
ENCODING_NAMES: tuple[str, ...] = ("o200k_base", "cl100k_base")
ESTIMATE = "estimate"

_lock = threading.Lock()
_encodings: dict[str, tiktoken.Encoding] = {}
_counters: dict[str, TiktokenCounter] = {}


class VocabularyError(CtxproxyError):
    """A vocabulary cannot be loaded: unknown name, missing file, corrupt data or hash mismatch."""


def _vocab_dir() -> Traversable:
    return resources.files(__package__ or "app").joinpath("vocab")


def _expected_hash(name: str, vocab_dir: Traversable | Path) -> str:
    try:
        sums = vocab_dir.joinpath("SHA256SUMS").read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise VocabularyError(f"cannot read SHA256SUMS in {vocab_dir}: {exc}") from exc
    for line in sums.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == f"{name}.tiktoken":
            return parts[0].lower()
    raise VocabularyError(f"SHA256SUMS in {vocab_dir} has no entry for {name}.tiktoken")


def load_ranks(name: str, *, vocab_dir: Traversable | Path | None = None) -> dict[bytes, int]:
    """The BPE ranks of vocabulary ``name`` read from ``{vocab_dir}/{name}.tiktoken.gz``.

    The decompressed bytes must match the SHA-256 in ``SHA256SUMS``; otherwise (and for unknown
    names, unreadable or unparsable files) :class:`VocabularyError` is raised.
    """
    if name not in ENCODING_NAMES:
        raise VocabularyError(f"unknown encoding {name!r}; known: {', '.join(ENCODING_NAMES)}")
    directory = _vocab_dir() if vocab_dir is None else vocab_dir
    expected = _expected_hash(name, directory)
    try:
        data = gzip.decompress(directory.joinpath(f"{name}.tiktoken.gz").read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise VocabularyError(f"cannot read vocabulary {name!r} from {directory}: {exc}") from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise VocabularyError(
            f"vocabulary {name!r} is corrupt: SHA-256 {actual} does not match the expected {expected}"
        )
    ranks: dict[bytes, int] = {}
    try:
        for line in data.splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
    except (ValueError, binascii.Error) as exc:
        raise VocabularyError(f"vocabulary {name!r} has a malformed line: {exc}") from exc
    return ranks


def load_encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken encoding ``name`` (``o200k_base`` or ``cl100k_base``), built once and cached.

    Thread-safe: concurrent first calls build it once. Raises :class:`VocabularyError`.
    """
    encoding = _encodings.get(name)
    if encoding is not None:
        return encoding
    with _lock:
        encoding = _encodings.get(name)
        if encoding is None:
            ranks = load_ranks(name)  # raises VocabularyError for unknown names
            encoding = tiktoken.Encoding(
                name, pat_str=PAT_STRS[name], mergeable_ranks=ranks, special_tokens=SPECIAL_TOKENS[name]
            )
            _encodings[name] = encoding
    return encoding


# head_tail encodes windows of the ends of a text, never less than this many characters, with at
# least this many tokens beyond what it keeps (see TiktokenCounter.head_tail).
WINDOW_MIN_CHARS = 16 * 1024
WINDOW_SLACK_TOKENS = 256


class TiktokenCounter:
    """An exact :class:`~app.core.tokens.TokenCounter` over a tiktoken encoding.

    ``count_text`` has ``encode_ordinary`` semantics: a special-token string such as
    ``<|endoftext|>`` inside user text is counted as the plain text it is.
    """

    __slots__ = ("_decode_bytes", "_encode", "_name", "encoding")

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self.encoding = encoding
        self._name: str = encoding.name
        self._encode = encoding.encode_ordinary
        self._decode_bytes = encoding.decode_bytes

    @property
    def name(self) -> str:
        return self._name

    @property
    def exact(self) -> bool:
        return True

    def count_text(self, text: str, /) -> int:
        if not text:
            return 0
        return len(self._encode(text))

    def count_texts(self, texts: Sequence[str], /) -> list[int]:
        """``[count_text(t) for t in texts]``, on the counting pool when the batch is large."""
        return counting_pool().counts(self.count_text, texts)

    def head_tail(self, text: str, /, *, head_tokens: int, tail_tokens: int) -> tuple[str, str]:
        """The longest prefix of <= ``head_tokens`` tokens and suffix of <= ``tail_tokens`` tokens.

        Cut on token boundaries; a multi-byte character split by the cut is dropped whole
        (``errors="ignore"`` only ever meets the incomplete sequence at the cut edge, since the
        rest is a contiguous slice of valid UTF-8). Re-encoding a cut piece can in rare cases
        merge differently, so each side is re-counted and shortened until it is within its limit.

        Only the ends are encoded: each side from a window of the text that holds at least
        ``WINDOW_SLACK_TOKENS`` more tokens than it needs (doubled until it does), so keeping 60K
        tokens of each end of a 1M-token text encodes about 120K tokens, not a million. Tokens
        far from a window's cut edge are the text's own (the pre-tokenizer's pieces and their
        merges do not depend on what lies beyond them); the re-count above guards the rest.
        """
        if not text:
            return "", ""
        head_tokens, tail_tokens = max(0, head_tokens), max(0, tail_tokens)
        head = self._fit(self._window(text, head_tokens, from_start=True), head_tokens, from_start=True)
        tail = self._fit(self._window(text, tail_tokens, from_start=False), tail_tokens, from_start=False)
        return head, tail

    def _window(self, text: str, need_tokens: int, *, from_start: bool) -> list[int]:
        """The tokens of a prefix (or suffix) of ``text`` holding ``need_tokens`` + slack, or of
        the whole text when it is shorter."""
        if need_tokens <= 0:
            return []
        chars = max(WINDOW_MIN_CHARS, 4 * (need_tokens + WINDOW_SLACK_TOKENS))
        while chars < len(text):
            tokens = self._encode(text[:chars] if from_start else text[len(text) - chars :])
            if len(tokens) >= need_tokens + WINDOW_SLACK_TOKENS:
                return tokens
            chars *= 2
        return self._encode(text)

    def _fit(self, tokens: list[int], limit: int, *, from_start: bool) -> str:
        take = min(limit, len(tokens))
        while take > 0:
            piece_tokens = tokens[:take] if from_start else tokens[len(tokens) - take :]
            piece = self._decode_bytes(piece_tokens).decode("utf-8", errors="ignore")
            excess = len(self._encode(piece)) - limit
            if excess <= 0:
                return piece
            take -= excess
        return ""


def counter_for(encoding: str, *, correction: float = 1.0) -> TokenCounter:
    """The counter for a model's ``encoding``: exact tiktoken, or the estimate for ``"estimate"``.

    ``correction`` only applies to the estimate (exact counts need none). Raises
    :class:`VocabularyError` for an unknown encoding.
    """
    if encoding == ESTIMATE:
        return EstimateCounter(correction=correction)
    counter = _counters.get(encoding)
    if counter is None:
        counter = TiktokenCounter(load_encoding(encoding))
        _counters.setdefault(encoding, counter)
    return counter


def preload() -> None:
    """Load every shipped vocabulary now (called at application start-up)."""
    for name in ENCODING_NAMES:
        load_encoding(name)


def loaded_encodings() -> tuple[str, ...]:
    """The names of the encodings loaded so far, in :data:`ENCODING_NAMES` order."""
    return tuple(name for name in ENCODING_NAMES if name in _encodings)


# A batch this large is worth a thread hop (~0.1 ms): about 16K tokens, 5-10 ms of encoding.
PARALLEL_MIN_CHARS = 64 * 1024
# Chunks of a batch hold at least this many characters (a few ms of encoding each).
CHUNK_MIN_CHARS = 16 * 1024


class CountingPool:
    """Counts batches of texts on at most ``threads`` threads (none when ``threads`` is 1).

    ``counts(count, texts)`` equals ``[count(t) for t in texts]``. A batch of fewer than
    ``PARALLEL_MIN_CHARS`` characters is counted in the calling thread; a larger one is cut into
    consecutive chunks (about four per thread, ``CHUNK_MIN_CHARS`` at least) that at most
    ``threads`` tasks count (:class:`_Batch`): a task counts the next chunk, then queues itself
    again behind what other batches queued, so concurrent batches share the threads chunk by chunk
    and a batch's chunks follow each other without waking its caller.
    """

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._executor = (
            ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="ctxproxy-count")
            if self.threads > 1
            else None
        )

    def counts(self, count: Callable[[str], int], texts: Sequence[str]) -> list[int]:
        total = sum(map(len, texts))
        if self._executor is None or total < PARALLEL_MIN_CHARS or len(texts) < 2:
            return [count(text) for text in texts]
        chunks = _chunks(texts, max(CHUNK_MIN_CHARS, total // (4 * self.threads)))
        batch = _Batch(count, texts, chunks, self._executor)
        for _ in range(min(self.threads, len(chunks))):
            try:
                self._executor.submit(batch.step)
            except RuntimeError:  # the pool was shut down (reconfigured): the caller counts
                batch.step()
        return batch.result()

    def shutdown(self) -> None:
        # Queued steps still run (their batches' callers wait for them); the threads then end.
        if self._executor is not None:
            self._executor.shutdown(wait=False)


class _Batch:
    """One batch's chunks, claimed one at a time by the pool's tasks (``step``); ``result()``
    waits for the last one and raises the first error a chunk met (no chunk is claimed after)."""

    __slots__ = (
        "_count", "_done", "_error", "_executor", "_left", "_lock", "_next", "chunks", "out", "texts",
    )  # fmt: skip

    def __init__(
        self,
        count: Callable[[str], int],
        texts: Sequence[str],
        chunks: Sequence[tuple[int, int]],
        executor: ThreadPoolExecutor,
    ) -> None:
        self._count = count
        self.texts = texts
        self.chunks = chunks
        self._executor = executor
        self.out: list[int] = [0] * len(texts)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._next = 0
        self._left = len(chunks)  # chunks claimed or not yet, whose counting has not ended
        self._error: BaseException | None = None

    def step(self) -> None:
        while True:
            with self._lock:
                index = self._next
                if index >= len(self.chunks):
                    return
                self._next += 1
            start, stop = self.chunks[index]
            try:
                self.out[start:stop] = [self._count(text) for text in self.texts[start:stop]]
            except BaseException as error:  # handed to the caller by result()
                with self._lock:
                    self._error = self._error or error
                    self._left -= len(self.chunks) - self._next  # what no task will claim now
                    self._next = len(self.chunks)
            with self._lock:
                self._left -= 1
                finished = self._left == 0
                more = self._next < len(self.chunks)
            if finished:
                self._done.set()
            if not more:
                return
            try:  # behind the other batches' chunks
                self._executor.submit(self.step)
                return
            except RuntimeError:  # the pool was shut down (reconfigured): this thread counts on
                continue

    def result(self) -> list[int]:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self.out


def _chunks(texts: Sequence[str], chunk_chars: int) -> list[tuple[int, int]]:
    """Consecutive ``[start, stop)`` ranges of ``texts`` holding about ``chunk_chars`` each."""
    ranges: list[tuple[int, int]] = []
    start = held = 0
    for i, text in enumerate(texts):
        held += len(text)
        if held >= chunk_chars:
            ranges.append((start, i + 1))
            start, held = i + 1, 0
    if start < len(texts):
        ranges.append((start, len(texts)))
    return ranges


_pool_lock = threading.Lock()
_pool: CountingPool | None = None


def counting_pool() -> CountingPool:
    """The process's counting pool (made on first use with :func:`usable_cpus` threads)."""
    global _pool
    pool = _pool
    if pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = CountingPool(usable_cpus())
            pool = _pool
    return pool


def configure_counting(*, threads: int) -> CountingPool:
    """Use ``threads`` counting threads from now on (0: :func:`usable_cpus`); returns the pool.
    A pool of that size already in place is kept."""
    global _pool
    wanted = threads if threads > 0 else usable_cpus()
    with _pool_lock:
        previous = _pool
        if previous is not None and previous.threads == max(1, wanted):
            return previous
        _pool = CountingPool(wanted)
        pool = _pool
    if previous is not None:
        previous.shutdown()
    return pool


def usable_cpus(*, cgroup_root: Path = Path("/sys/fs/cgroup"), affinity: int | None = None) -> int:
    """The CPUs this process may use: its affinity mask (``os.sched_getaffinity``), capped by the
    cgroup's CPU quota (rounded down, at least 1)."""
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            affinity = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root)
    cpus = affinity if quota is None else min(affinity, math.floor(quota))
    return max(1, cpus)


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup"), *, own: str | None = None) -> float | None:
    """CPUs' worth of time the process's cgroup allows per period, or None when unlimited or
    unknown: v2's ``cpu.max`` of its own cgroup (``own``: the path ``/proc/self/cgroup`` names)
    or of ``root`` (a container's namespace), else v1's ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``."""
    if own is None:
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            lines = []
        own = next((line[3:] for line in lines if line.startswith("0::")), "")
    for place in dict.fromkeys((root / own.strip("/"), root)):
        try:
            quota, _, period = (place / "cpu.max").read_text().strip().partition(" ")
        except OSError:
            continue
        try:
            return None if quota == "max" else int(quota) / int(period or "100000")
        except (ValueError, ZeroDivisionError):
            return None
    for v1 in (root / "cpu", root / "cpu,cpuacct"):
        try:
            quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
            period_us = int((v1 / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    return None
