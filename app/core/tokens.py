"""Token counting for chat requests, behind a small protocol.

The tokenizer itself (tiktoken, or an estimate) is a :class:`TokenCounter`; this module adds
OpenAI's chat accounting on top (cookbook rules: 3 tokens per message, +1 per ``name``, +3 to
prime the reply) and a per-message cache keyed by the message's content, so a conversation
resent with one new message costs one message of counting.

A resent conversation costs less still: the counter remembers the last few conversations it
counted (their message lists, up to the first message that is not plain JSON text), finds the one
this request continues (by its first two messages) and compares the lists with ``==`` (C speed, no
key building): the shared prefix takes its counts from there and only the new tail is looked up.
``==`` is exact here because only plain messages (strings, null, lists and string-keyed objects of
those) are remembered: a number or boolean (where ``1 == 1.0 == True``) ends the remembered prefix.

The cache key is the message itself, frozen into nested tuples that hold its strings by
reference (no serialization, no cryptographic digest): a lookup costs Python's string hash
(computed once per string, in C) and, on a hit, an exact comparison. Exact, so no collision can
ever serve a wrong count. Bounded by entries (``cache_size``) and by the characters the keys hold
(``cache_max_chars``, 16M by default: the text of about twenty 200K-token sessions, 16-64 MiB),
least recently used first out. The price of exactness is memory: the keys keep the texts alive.

INTERFACE CONTRACT (other modules rely on these names and signatures):

* ``TokenCounter`` protocol: ``name``, ``exact``, ``count_text(text)``,
  ``head_tail(text, head_tokens=, tail_tokens=)``; ``BatchCounter``: one that may also count
  several texts at once, ``count_texts(texts)`` (the tokenizer's edge does it on every core the
  process may use: ``app.tokenizer``). A ``MessageCounter`` over one counts the texts of the
  messages its cache misses in one batch when they hold ``BATCH_MIN_CHARS`` or more.
* ``MessageCounter(counter, *, cache_size=..., cache_max_chars=...)``:
  ``count_message(message) -> int`` (including the per-message overhead),
  ``count_messages(messages) -> tuple[int, ...]``, ``uncorrected_counts(messages)`` (the same
  without an estimate's correction),
  ``count_tools(body) -> int`` (tool / function definitions), ``count_request(body) -> int``
  (messages + reply priming + tools), ``REPLY_PRIMING_TOKENS``.
* Extensions: ``MessageCounter.exact``, ``.counter``, ``.cache_info() -> CacheInfo(hits, misses,
  size)``, ``.cache_chars() -> int``, ``.cache_clear()``, ``.unremembered_chars(messages) -> int |
  None`` (what counting a resent conversation may still cost); ``CorrectedCounter`` (a counter with
  ``correction`` and ``raw_count``: the estimate); ``request_parts(body) -> (fixed_tokens,
  text_tokens)`` (the request's fixed overheads and its *uncorrected* text tokens, for
  calibration).

The accounting rules themselves (per message, content parts, tool calls, tool definitions) are in
``accounting.py``, the pricing of images, audio and files in ``media.py``, the cache keys and the
prefix match in ``frozen.py``.

The tokenizer's text counts are cached raw; a :class:`CorrectedCounter`'s ``correction`` is applied
after the cache (to the text part of each message only, never to the fixed overheads), so changing
the correction never serves stale counts.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from .accounting import ChatAccounting
from .errors import InvalidRequest
from .frozen import anchor_of, common_prefix, freeze, freeze_counted, has_price, is_plain_message
from .messages import Message

REPLY_PRIMING_TOKENS = 3

CacheKey = tuple[Any, ...]


class CacheInfo(NamedTuple):
    """Counters of a :class:`MessageCounter`'s per-message cache."""

    hits: int
    misses: int
    size: int


@runtime_checkable
class TokenCounter(Protocol):
    """A tokenizer as the engine sees it.

    ``name`` identifies the vocabulary (``"o200k_base"``, ``"estimate"``) and is part of every
    cache key; ``exact`` is False for estimates. ``head_tail`` returns the longest prefix of at
    most ``head_tokens`` tokens and the longest suffix of at most ``tail_tokens`` tokens, cut on
    token boundaries and never inside a character.
    """

    @property
    def name(self) -> str: ...

    @property
    def exact(self) -> bool: ...

    def count_text(self, text: str, /) -> int: ...

    def head_tail(self, text: str, /, *, head_tokens: int, tail_tokens: int) -> tuple[str, str]: ...


@runtime_checkable
class BatchCounter(TokenCounter, Protocol):
    """A counter that may count several texts at once (in parallel, as the tokenizer sees fit):
    ``count_texts(texts)`` equals ``[count_text(t) for t in texts]``."""

    def count_texts(self, texts: Sequence[str], /) -> list[int]: ...


@runtime_checkable
class CorrectedCounter(TokenCounter, Protocol):
    """A counter whose text counts are ``ceil(raw_count(text) * correction)`` (the estimate)."""

    @property
    def correction(self) -> float: ...

    def raw_count(self, text: str, /) -> int: ...


# Conversations shorter than this are not remembered (their per-message lookups are cheap).
_PREFIX_MIN_MESSAGES = 8
# Texts at least this long are also cached on their own (key: the string itself): cutting a long
# text (middle-out, last resort) counts it again as a text, and encoding ~1M tokens costs ~0.3 s.
BIG_TEXT_CHARS = 64 * 1024
# Messages the cache misses that hold at least this many characters have their texts counted in
# one batch (``BatchCounter``: a large cold request uses every core); texts shorter than
# ``_BATCH_TEXT_MIN_CHARS`` are counted in line (a role, an id).
BATCH_MIN_CHARS = 64 * 1024
_BATCH_TEXT_MIN_CHARS = 256
_CONVERSATIONS_PER_ANCHOR = 4
_MAX_CONVERSATIONS = 64


class _Conversation(NamedTuple):
    """A plain message list as counted: per message ``(fixed, raw text tokens)`` and characters,
    and the (ascending) indices of the messages that hold a dialect's price."""

    messages: tuple[Any, ...]
    tallies: tuple[tuple[int, int], ...]
    chars: tuple[int, ...]
    priced: tuple[int, ...] = ()


class MessageCounter:
    """OpenAI chat accounting over a :class:`TokenCounter`, with a bounded per-message LRU cache.

    Thread-safe: the cache is guarded by a lock (counting itself runs outside it).
    """

    def __init__(
        self, counter: TokenCounter, *, cache_size: int = 65536, cache_max_chars: int = 16 * 1024 * 1024
    ) -> None:
        self.counter = counter
        self.cache_size = max(0, cache_size)
        self.cache_max_chars = max(0, cache_max_chars)
        # The estimate's correction changes as calibration learns, so it is read at every count.
        self._corrector = counter if isinstance(counter, CorrectedCounter) else None
        self._corrected = self._corrector is not None
        self._raw_text = counter.raw_count if isinstance(counter, CorrectedCounter) else counter.count_text
        # A BatchCounter's count_texts (an attribute look-up: a runtime protocol check costs ~80 us).
        batch: Callable[[Sequence[str]], list[int]] | None = getattr(counter, "count_texts", None)
        self._count_texts = None if self._corrected else batch
        # The rules count through the raw-text cache (long texts are encoded once); bound once
        # here, so the per-message path pays no attribute walk.
        accounting = ChatAccounting(self._count_raw_text, encoding=counter.name)
        self._tally_message = accounting.tally_message
        self._tally_tools = accounting.tally_tools
        # By message content, whoever sent it (a count is a pure function of the text: it cannot
        # differ between clients; AGENTS.md "Isolation" says why it is shared): at most cache_size
        # entries and cache_max_chars characters, the least recently used out.
        self._cache: OrderedDict[CacheKey, tuple[int, int, int]] = OrderedDict()
        self._cache_chars = 0
        # Recent conversations' counts by their opening: at most _MAX_CONVERSATIONS (and the
        # characters of cache_max_chars), the least recently used out.
        self._conversations: OrderedDict[Any, tuple[_Conversation, ...]] = OrderedDict()
        self._conversation_chars = 0
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    @property
    def exact(self) -> bool:
        return self.counter.exact

    def cache_info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self._hits, self._misses, len(self._cache))

    def cache_chars(self) -> int:
        """Characters held by the cache's keys (bounded by ``cache_max_chars``)."""
        with self._lock:
            return self._cache_chars

    def cache_clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self._cache_chars = 0
            self._conversations.clear()
            self._conversation_chars = 0
            self._hits = self._misses = 0

    # -- public counting -------------------------------------------------------------------

    def text_tokens(self, text: str) -> int:
        """``counter.count_text(text)``; a text of ``BIG_TEXT_CHARS`` or more through the cache, so
        a long text counted in its message and then cut (middle-out) is encoded once."""
        if self._corrected:
            return self.counter.count_text(text)
        return self._count_raw_text(text)

    def count_message(self, message: Message) -> int:
        """Tokens of one message including its per-message overhead (cached by content)."""
        if not isinstance(message, Mapping):
            raise InvalidRequest("Each message must be an object.", param="messages")
        fixed, text = self._cached(message, self._tally_message, prefix="m")
        return fixed + self._scale(text)

    def count_messages(self, messages: Sequence[Message]) -> tuple[int, ...]:
        """Per-message counts; the prefix shared with a remembered conversation costs a compare."""
        tallies = self._message_tallies(messages)
        if not self._corrected:
            return tuple(fixed + text for fixed, text in tallies)
        return tuple(fixed + self._scale(text) for fixed, text in tallies)

    def uncorrected_counts(self, messages: Sequence[Message]) -> tuple[int, ...]:
        """Per-message counts without the estimate's correction (``count_messages`` of an exact
        counter): a pure function of the messages, which calibration never moves."""
        return tuple(fixed + text for fixed, text in self._message_tallies(messages))

    def _message_tallies(self, messages: Sequence[Message]) -> list[tuple[int, int]]:
        """``(fixed, raw text tokens)`` per message, through the remembered conversations."""
        anchor = None
        if len(messages) >= _PREFIX_MIN_MESSAGES and self.cache_size > 0 and self.cache_max_chars > 0:
            anchor = anchor_of(messages)
        if anchor is None:
            return [(fixed, text) for fixed, text, _size in self._fresh(messages)]
        with self._lock:
            candidates = self._conversations.get(anchor, ())
        best: _Conversation | None = None
        shared = 0
        for conversation in candidates:
            length = common_prefix(messages, conversation.messages, conversation.priced)
            if length > shared:
                best, shared = conversation, length
        tallies: list[tuple[int, int]] = []
        chars: list[int] = []
        priced: list[int] = []
        if best is not None:
            tallies.extend(best.tallies[:shared])
            chars.extend(best.chars[:shared])
            priced.extend(i for i in best.priced if i < shared)
            with self._lock:
                self._hits += shared
        plain = True
        for index, (fixed, text, size) in enumerate(self._fresh(messages[shared:]), start=shared):
            message = messages[index]
            tallies.append((fixed, text))
            if plain and size is not None and is_plain_message(message):
                chars.append(size)
                if has_price(message):
                    priced.append(index)
            else:
                plain = False
        # Replace the remembered list only when this one continues it whole; a list that departs
        # from it (the plan's own cut of it, an edited history) is remembered beside it.
        continued = best if best is not None and shared == len(best.messages) else None
        self._remember(anchor, continued, messages, tallies, chars, priced)
        return tallies

    def _fresh(self, messages: Sequence[Message]) -> list[tuple[int, int, int | None]]:
        """``(fixed, raw text tokens, characters held)`` of each message through the cache. When
        the messages the cache misses hold ``BATCH_MIN_CHARS`` or more, their texts are counted in
        one batch first (a ``BatchCounter``'s ``count_texts``), then the rules add them up."""
        if self._count_texts is None:
            out: list[tuple[int, int, int | None]] = []
            for message in messages:
                if not isinstance(message, Mapping):
                    raise InvalidRequest("Each message must be an object.", param="messages")
                out.append(self._cached_full(message, self._tally_message, prefix="m"))
            return out
        looked = []
        missed: list[Message] = []
        size = 0
        for message in messages:
            if not isinstance(message, Mapping):
                raise InvalidRequest("Each message must be an object.", param="messages")
            entry = self._lookup(message, prefix="m")
            looked.append(entry)
            if entry[2] is None:
                missed.append(message)
                size += entry[1] or 0
        if not missed:
            return [(hit[0], hit[1], chars) for _key, chars, hit in looked if hit is not None]
        tally = self._tally_message if size < BATCH_MIN_CHARS else self._prefetched(missed)
        fresh: list[tuple[int, int, int | None]] = []
        for message, (key, chars, hit) in zip(messages, looked, strict=True):
            if hit is not None:
                fresh.append((hit[0], hit[1], chars))
                continue
            fixed, text = tally(message)
            held = None if key is None or chars is None else self._store(key, chars, (fixed, text))
            fresh.append((fixed, text, held))
        return fresh

    def _prefetched(self, messages: Sequence[Message]) -> Callable[[Message], tuple[int, int]]:
        """The rules' tally over the counts of ``messages``' texts, made in one batch."""
        assert self._count_texts is not None
        texts: dict[str, None] = {}

        def record(text: str) -> int:
            if len(text) >= _BATCH_TEXT_MIN_CHARS:
                texts[text] = None
            return 0

        walk = ChatAccounting(record, encoding=self.counter.name).tally_message
        for message in messages:
            walk(message)
        batch = list(texts)
        counts = dict(zip(batch, self._count_texts(batch), strict=True))
        for text, tokens in counts.items():
            if len(text) >= BIG_TEXT_CHARS:  # a text cut later (middle-out) is not encoded again
                key, chars, hit = self._lookup(text, prefix="x")
                if key is not None and chars is not None and hit is None:
                    self._store(key, chars, (0, tokens))

        def count(text: str) -> int:
            tokens = counts.get(text)
            return self._count_raw_text(text) if tokens is None else tokens

        return ChatAccounting(count, encoding=self.counter.name).tally_message

    def unremembered_chars(self, messages: Sequence[Message]) -> int | None:
        """Characters of the messages after the prefix a remembered conversation shares with
        ``messages`` (what counting them may still cost), or None when none is remembered."""
        if len(messages) < _PREFIX_MIN_MESSAGES or self.cache_size == 0 or self.cache_max_chars == 0:
            return None
        anchor = anchor_of(messages)
        if anchor is None:
            return None
        with self._lock:
            candidates = self._conversations.get(anchor, ())
        shared = max((common_prefix(messages, c.messages, c.priced) for c in candidates), default=0)
        if shared == 0:
            return None
        tail = 0
        for message in messages[shared:]:
            frozen = freeze(message) if type(message) is dict else None
            tail += frozen[1] if frozen is not None else 1 << 30
        return tail

    def count_tools(self, body: Mapping[str, Any]) -> int:
        """Tokens of the tool (``tools``) and legacy function (``functions``) definitions."""
        tools = body.get("tools")
        functions = body.get("functions")
        if not tools and not functions:
            return 0
        definitions = {"tools": tools, "functions": functions}
        fixed, text = self._cached(definitions, self._tally_tools, prefix="t")
        return fixed + self._scale(text)

    def count_request(self, body: Mapping[str, Any]) -> int:
        messages = body.get("messages")
        if messages is None:
            messages = []
        if not isinstance(messages, list | tuple):
            raise InvalidRequest("'messages' must be an array of message objects.", param="messages")
        return sum(self.count_messages(messages)) + REPLY_PRIMING_TOKENS + self.count_tools(body)

    def request_parts(self, body: Mapping[str, Any]) -> tuple[int, int]:
        """``(fixed_tokens, text_tokens)`` of the whole request: the fixed overheads (per message,
        reply priming, tool framing, images and flat rules) and the tokenizer's *uncorrected* text
        tokens. With correction 1 their sum is ``count_request(body)``; with a correction ``c`` the
        count is ``fixed + c * text`` up to per-item rounding up (the calibration's model)."""
        messages = body.get("messages")
        if messages is None:
            messages = []
        if not isinstance(messages, list | tuple):
            raise InvalidRequest("'messages' must be an array of message objects.", param="messages")
        tallies = self._message_tallies(messages)
        fixed = REPLY_PRIMING_TOKENS + sum(f for f, _ in tallies)
        text = sum(t for _, t in tallies)
        tools = body.get("tools")
        functions = body.get("functions")
        if tools or functions:
            definitions = {"tools": tools, "functions": functions}
            f, t = self._cached(definitions, self._tally_tools, prefix="t")
            fixed, text = fixed + f, text + t
        return fixed, text

    # -- cache -----------------------------------------------------------------------------

    def _cached(self, item: Any, tally: Callable[[Any], tuple[int, int]], *, prefix: str) -> tuple[int, int]:
        fixed, text, _chars = self._cached_full(item, tally, prefix=prefix)
        return fixed, text

    def _cached_full(
        self, item: Any, tally: Callable[[Any], tuple[int, int]], *, prefix: str
    ) -> tuple[int, int, int | None]:
        """``(fixed, raw text tokens, characters held)``; characters None when not cacheable."""
        key, chars, hit = self._lookup(item, prefix=prefix)
        if hit is not None:
            return hit[0], hit[1], chars
        fixed, text = tally(item)
        if key is None or chars is None:
            return fixed, text, None
        return fixed, text, self._store(key, chars, (fixed, text))

    def _lookup(
        self, item: Any, *, prefix: str
    ) -> tuple[CacheKey | None, int | None, tuple[int, int, int] | None]:
        """``(key, characters, cached)`` of ``item``; the key None when it is not cacheable, the
        cached value None on a miss."""
        if self.cache_size == 0 or self.cache_max_chars == 0:
            return None, None, None
        try:
            # A message's key leaves out the reserved values its count never reads (an origin).
            frozen = freeze_counted(item) if prefix == "m" else freeze(item)
        except RecursionError:  # nested deeper than Python recurses: counted, never cached
            frozen = None
        if frozen is None:
            return None, None, None
        key: CacheKey = (prefix, frozen[0])
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self._hits += 1
                return key, frozen[1], cached
            self._misses += 1
        return key, frozen[1], None

    def _store(self, key: CacheKey, chars: int, result: tuple[int, int]) -> int | None:
        """Cache ``result`` under ``key``; the characters it holds, or None when too large."""
        if chars > self.cache_max_chars:
            return None
        with self._lock:
            previous = self._cache.pop(key, None)
            if previous is not None:
                self._cache_chars -= previous[2]
            self._cache[key] = (result[0], result[1], chars)
            self._cache_chars += chars
            while len(self._cache) > self.cache_size or self._cache_chars > self.cache_max_chars:
                _, evicted = self._cache.popitem(last=False)
                self._cache_chars -= evicted[2]
        return chars

    def _remember(
        self,
        anchor: Any,
        replaced: _Conversation | None,
        messages: Sequence[Message],
        tallies: Sequence[tuple[int, int]],
        chars: Sequence[int],
        priced: Sequence[int] = (),
    ) -> None:
        """Keep ``messages`` (its plain prefix) as the latest state of its conversation."""
        size = len(chars)  # the plain prefix: every message in it has its characters
        total = sum(chars)
        limit = self.cache_max_chars // 2
        if size < _PREFIX_MIN_MESSAGES or total > limit:
            return
        kept = _Conversation(tuple(messages[:size]), tuple(tallies[:size]), tuple(chars), tuple(priced))
        with self._lock:
            previous = self._conversations.pop(anchor, ())
            others = [c for c in previous if c is not replaced]
            removed = [c for c in previous if c is replaced] + others[_CONVERSATIONS_PER_ANCHOR - 1 :]
            for conversation in removed:
                self._conversation_chars -= sum(conversation.chars)
            self._conversations[anchor] = (kept, *others[: _CONVERSATIONS_PER_ANCHOR - 1])
            self._conversation_chars += total
            while len(self._conversations) > _MAX_CONVERSATIONS or self._conversation_chars > limit:
                _, evicted = self._conversations.popitem(last=False)
                self._conversation_chars -= sum(sum(c.chars) for c in evicted)

    def _count_raw_text(self, text: str) -> int:
        if len(text) < BIG_TEXT_CHARS:
            return self._raw_text(text)
        return self._cached(text, self._tally_raw_text, prefix="x")[1]

    def _tally_raw_text(self, text: str) -> tuple[int, int]:
        return 0, self._raw_text(text)

    def _scale(self, text_tokens: int) -> int:
        if self._corrector is None or text_tokens == 0:
            return text_tokens
        correction = float(self._corrector.correction)
        if correction == 1.0:
            return text_tokens
        return math.ceil(text_tokens * correction - 1e-9)
