"""LLM summaries of the spans the engine cuts: caches, the summarizer, ahead-of-time work.

Self-contained building blocks (no HTTP): the service injects the upstream call as
``Summarizer(complete=...)`` and hands the engine a ``PrefetchedSummaries``.

::

    cache.py       SummaryCache protocol, MemoryCache, RedisCache, cache_from_url, summary_key
    prompts.py     PROMPT_VERSION, the prompts (sections, size), message rendering, truncate_sections
    checks.py      check_summary: is an answer a summary (template tokens, echo, repetition, ...)
    pace.py        Pace: a summarizer's observed latency, the time limit of its next call
    summarizer.py  Summarizer (incremental chain, chunked, checked, fail-open, back-off), SummaryJob
                   (the owner and sizes of each call), PrefetchedSummaries
    ahead.py       AheadOfTime (background, deduplicated, bounded: a Backlog shared by several)

Errors: nothing here raises into a request. ``SummaryError`` is internal to the summarizer and
becomes ``None`` (its ``status`` tells a failure the endpoint will repeat from one the span
caused, and whether the credential was refused); a window too small for the prompt is a
``SummaryJob.problem()`` (no call is made); configuration mistakes (an unknown cache URL scheme,
a cache of no entries) raise ``ValueError`` at construction.
"""

from .ahead import AheadOfTime, Backlog
from .cache import (
    CacheStats,
    MemoryCache,
    RedisCache,
    SummaryCache,
    cache_from_url,
    prefix_keys,
    summary_key,
)
from .prompts import PROMPT_VERSION, SYSTEM_MARKER
from .summarizer import Complete, PrefetchedSummaries, Summarizer, SummaryError, SummaryJob

__all__ = [
    "PROMPT_VERSION",
    "SYSTEM_MARKER",
    "AheadOfTime",
    "Backlog",
    "CacheStats",
    "Complete",
    "MemoryCache",
    "PrefetchedSummaries",
    "RedisCache",
    "Summarizer",
    "SummaryCache",
    "SummaryError",
    "SummaryJob",
    "cache_from_url",
    "prefix_keys",
    "summary_key",
]
